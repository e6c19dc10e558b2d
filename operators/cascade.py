"""The cascade: cheap heads on the model's own latent space settle the chunks whose
full-model answer would not change; only the rest pay for the transformer.

Per chunk, in order: S0 reads the mean of the embedding layer's output (a Gather and a
LayerNorm: microseconds); S1 reads the mean hidden state after ``cascade_layer``
(the prefix graph); S2 is the rest of the model (the suffix graph), fed the prefix's
output so nothing is computed twice. A stage settles a chunk when its head's top
probability reaches the stage's calibrated threshold.

Per document (:class:`CascadeLogic`), chunks are read in order. With a certified
document stop (:mod:`kascade.operators.reading`), reading ends as soon as the cheap
verdicts so far make the full read's label certain, and the remaining chunks are never
computed. Otherwise, once every chunk has been through S0/S1, the uncertain chunks are
escalated only if their full-model answers could still change the document's label
under the reduce strategy (:meth:`Strategy.decided`); if not they are skipped and their
S1 estimate stands.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator
from bytewax.operators import StatefulLogic
from kascade.operators import guarantee, inflight, metrics
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.encoder import Encoder, softmax
from kascade.operators.full_model import worker_encoder
from kascade.operators.items import ChunkResult, ChunkTask, DocMeta, Escalation
from kascade.operators.reading import Seen, stop_label
from kascade.schemas import Aggregation, DeadLetter, Reading, StopReason
from kascade.schemas.cascade import (
    CASCADE_FILE,
    CASCADE_VERSION,
    READABLE_VERSIONS,
    CascadeMismatch,
    CascadeSpec,
    HeadWeights,
    OperatingPoint,
    StopRule,
)
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import ModelManifest
from kascade.schemas.problems import first_problem
from kascade.schemas.settings import CascadeSettings, ChunkSettings
from pydantic import ValidationError

Stage = str  # "s0" | "s1" | "full" | "skipped"


@dataclass(frozen=True)
class Head:
    """A linear head: probabilities from a pooled feature vector."""

    weight: np.ndarray  # labels x hidden
    bias: np.ndarray

    @classmethod
    def of(cls, w: HeadWeights) -> Head:
        return cls(np.asarray(w.weight, dtype=np.float32), np.asarray(w.bias, dtype=np.float32))

    def probs(self, features: np.ndarray) -> np.ndarray:
        return softmax((features @ self.weight.T + self.bias).astype(np.float64))


def on_topic_of(head: Head, features: np.ndarray) -> float:
    """The on-topic head's probability that a chunk's label is its document's (its second
    class; the first is off-topic)."""
    return float(head.probs(features)[..., 1])


def pooled(states: np.ndarray) -> np.ndarray:
    """Mean over the tokens of one unpadded sequence's states (``1 x T x H`` or ``T x H``)."""
    return states.reshape(-1, states.shape[-1]).mean(axis=0)


def _misfit(spec: CascadeSpec, manifest: ModelManifest) -> str | None:
    """Why ``spec``'s heads cannot read this model's states (``None``: they can)."""
    if spec.labels != manifest.labels:
        return f"its labels {spec.labels} are not the model's {manifest.labels}"
    if spec.cascade_layer != manifest.cascade_layer:
        return f"its layer {spec.cascade_layer} is not the model's {manifest.cascade_layer}"
    want = (len(manifest.labels), manifest.hidden_size)
    for head in (spec.s0, spec.s1):
        if head.shape() != want:
            return f"the {head.feature} head is {head.shape()}, the model needs {want}"
    stop = spec.document_stop
    on_topic = None if stop is None else stop.on_topic
    if on_topic is not None and on_topic.shape() != (2, manifest.hidden_size):
        return f"the on-topic head is {on_topic.shape()}, not (2, {manifest.hidden_size})"
    return None


@dataclass(frozen=True)
class Cascade:
    """Loaded heads and the operating point in force."""

    spec: CascadeSpec
    s0: Head
    s1: Head
    point: OperatingPoint
    on_topic: Head | None = None  # the document stop's, when its rule asks it
    sha256: str | None = None  # of the cascade.json it was loaded from: its identity

    @classmethod
    def load(
        cls,
        model_dir: Path,
        manifest_sha256: str,
        operating_point: str | None = None,
        manifest: ModelManifest | None = None,
    ) -> Cascade:
        """The heads and operating point of ``model_dir/cascade.json``, checked against
        the model (its labels, layer and sizes too, given its ``manifest``); raises
        :class:`CascadeMismatch` with one line saying what to do."""
        path = Path(model_dir) / CASCADE_FILE
        if not path.is_file():
            raise CascadeMismatch(f"{model_dir} has no {CASCADE_FILE}; run kascade calibrate")
        text = path.read_bytes()
        try:
            raw = json.loads(text)
            if raw.get("version") not in READABLE_VERSIONS:
                raise CascadeMismatch(
                    f"{path} has format version {raw.get('version')}, this kascade reads"
                    f" {CASCADE_VERSION}; run kascade calibrate again"
                )
            spec = CascadeSpec.model_validate(raw)
        except ValidationError as e:
            raise CascadeMismatch(f"{path}: {first_problem(e)}") from None
        except (ValueError, AttributeError) as e:  # not JSON, or not an object
            raise CascadeMismatch(f"{path} is not a valid {CASCADE_FILE}: {e}") from None
        if spec.model_manifest_sha256 != manifest_sha256:
            raise CascadeMismatch(f"{path} was calibrated for another model (manifest differs)")
        if manifest is not None:
            problem = _misfit(spec, manifest)
            if problem is not None:
                raise CascadeMismatch(f"{path}: {problem}; run kascade calibrate again")
        name = operating_point or spec.default_operating_point
        if name not in spec.operating_points:
            raise CascadeMismatch(
                f"no operating point {name!r} in {path}; have {', '.join(spec.operating_points)}"
            )
        stop = spec.document_stop
        on_topic = None if stop is None or stop.on_topic is None else Head.of(stop.on_topic)
        point = spec.operating_points[name]
        digest = hashlib.sha256(text).hexdigest()
        return cls(spec, Head.of(spec.s0), Head.of(spec.s1), point, on_topic, digest)

    def certified_for(
        self, chunking: ChunkSettings, tokenizer_sha256: str, engine: Engine
    ) -> str | None:
        """Why this calibration does not hold for chunks made this way and classified by
        ``engine`` (``None``: it does).

        The guarantee is a statement about the chunks it was measured on, as the engine
        it was measured with computes them; other sizes, overlaps, tokenizations or
        arithmetic are another distribution.
        """
        if self.spec.engine != engine:
            return (
                f"the cascade was certified with the {self.spec.engine.name} engine; this run"
                f" uses {engine.name} (--encoder.backend, --encoder.precision)"
            )
        c = self.spec.chunking
        if c.tokenizer_sha256 != tokenizer_sha256:
            return "the cascade was certified with another tokenizer"
        if (c.max_tokens, c.overlap) != (chunking.max_tokens, chunking.overlap):
            return (
                f"the cascade was certified on {c.describe()}; this run makes"
                f" {chunking.max_tokens}-token chunks with overlap {chunking.overlap}"
            )
        return None


@dataclass(frozen=True)
class Verdict:
    """What the cheap stages concluded about one chunk."""

    stage: Stage  # "s0", "s1" (settled) or "uncertain"
    probs: np.ndarray | None  # None: the cheap stages failed on this chunk
    hidden: np.ndarray | None = None  # prefix output, kept for escalation
    on_topic: float = 1.0  # the document stop's on-topic head, where it has one

    def seen(self, n_tokens: int) -> Seen:
        """What the document stop reads of this verdict."""
        return Seen(self.stage != "uncertain", self.probs, n_tokens, self.on_topic)


# The audit draw's key, new in every process: a producer who knows the draw could pick
# ids that are never audited (a drift the live test would not see) or always (the full
# model's cost on demand). Within a process the draw is the same for a chunk every time
# it is asked, which is all the cascade needs; after a restart the draw is a new one.
_AUDIT_KEY = secrets.token_bytes(32)


def audit_pick(doc_id: str, index: int, fraction: float) -> bool:
    """A keyed draw, the same for a chunk within this process: audit this settled chunk?

    >>> audit_pick("d", 0, 0.0), audit_pick("d", 0, 1.0)
    (False, True)
    """
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{doc_id}/{index}".encode(), digest_size=8, key=_AUDIT_KEY).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


@dataclass
class CascadeState:
    """One document: the chunks that arrived, and the cheap verdicts of those read so far
    (in order: chunk ``i`` is read only after chunks ``0..i-1``)."""

    meta: DocMeta
    tasks: dict[int, ChunkTask] = field(default_factory=dict)
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    arrived: set[int] = field(default_factory=set)
    decided: bool = False  # labeled or escalated: later arrivals are not read

    @property
    def read(self) -> int:
        return len(self.verdicts)


CheapStages = Callable[[ChunkTask], Verdict]
Out = ChunkResult | Escalation | DeadLetter


@dataclass
class CascadeLogic(StatefulLogic[ChunkTask, Out, CascadeState]):
    """Per document: read the chunks in order through the cheap stages; stop as soon as
    the certified ``stop`` rule knows the label (the rest are never computed), or, when
    every chunk is read, settle, skip or escalate them (document-level early exit).

    A text cut at the chunk limit whose stop did not come before it is dead-lettered
    ``too_long`` (its first chunk carries that dead letter).
    """

    cheap: CheapStages
    strategy: Aggregation
    audit_fraction: float = 0.0
    state: CascadeState | None = None
    stop: StopRule | None = None  # None: read every chunk
    # Chunks read per turn (None: every chunk that is ready). A document's chunks arrive
    # together; reading them all at once makes every document behind it on this worker
    # wait for all of them. With turns, a document reads ``turn`` chunks, then the
    # others' turns come (Bytewax calls ``on_notify`` once per activation) before its
    # next: short documents pass long ones.
    turn: int | None = None
    _budget: int | None = field(default=None, init=False, repr=False)

    def on_item(self, value: ChunkTask) -> tuple[list[Out], bool]:
        if self.state is None:
            self.state = CascadeState(value.doc)
        s = self.state
        s.arrived.add(value.index)
        out: list[Out] = []
        if not s.decided and value.index not in s.tasks:  # a replay is not read twice
            s.tasks[value.index] = value
            out = self._read_on(s)
        return out, self._keep(s)

    def on_notify(self) -> tuple[list[Out], bool]:
        assert self.state is not None
        self._budget = self.turn  # the next turn
        return self._read_on(self.state), self._keep(self.state)

    def on_eof(self) -> tuple[list[Out], bool]:
        # This execution ends (end of input, or a drain): no turn comes after this one.
        s = self.state
        if s is None or s.decided:
            return [], StatefulLogic.RETAIN
        self.turn = None
        return self._read_on(s), self._keep(s)

    def notify_at(self) -> datetime | None:
        s = self.state
        if self.turn is None or s is None or s.decided or s.read not in s.tasks:
            return None
        return datetime.now(UTC)  # at once, after the other documents' turns

    @staticmethod
    def _keep(s: CascadeState) -> bool:
        if s.decided and len(s.arrived) >= s.meta.total_chunks:
            return StatefulLogic.DISCARD
        return StatefulLogic.RETAIN

    def _may_read(self) -> bool:
        if self.turn is None:
            return True
        if self._budget is None:  # a new document's first turn
            self._budget = self.turn
        if self._budget <= 0:
            return False
        self._budget -= 1
        return True

    def _read_on(self, s: CascadeState) -> list[Out]:
        """Read the chunks that are next in order (as many as this turn allows); the
        document's results once decided."""
        text_chunks = (
            s.meta.text_chunks if s.meta.text_chunks is not None else (s.meta.total_chunks)
        )
        while s.read in s.tasks and self._may_read():
            task = s.tasks[s.read]
            if guarantee.suspended(task.doc.lang):
                # The live test rejected the bound here: the full model decides the chunk.
                task = dataclasses.replace(task, doc=dataclasses.replace(task.doc, suspended=True))
                s.tasks[s.read] = task
                verdict = Verdict("uncertain", None)
            else:
                verdict = self._cheap(task)
            if verdict.stage != "uncertain":
                metrics.CHUNKS_SETTLED.labels(verdict.stage).inc()
            s.verdicts[task.index] = verdict
            if self.stop is not None and s.read < text_chunks and self._certain(s):
                s.decided = True
                return self._stopped(s, text_chunks)
            if s.read == s.meta.total_chunks:
                s.decided = True
                over = s.tasks[0].doc.over_limit
                return [over] if over is not None else self._decide(s)
        return []

    def _cheap(self, task: ChunkTask) -> Verdict:
        try:
            with inflight.inside(task.doc.source, "cascade"):
                return self.cheap(task)
        except Exception:  # the cheap stages are an optimisation: the full model decides
            metrics.CHEAP_FAILURES.inc()
            return Verdict("uncertain", None)

    def _certain(self, s: CascadeState) -> bool:
        assert self.stop is not None
        seen = [v.seen(s.tasks[i].n_tokens) for i, v in sorted(s.verdicts.items())]
        return stop_label(self.stop, seen, self.strategy) is not None

    def _stopped(self, s: CascadeState, text_chunks: int) -> list[Out]:
        """Results for the chunks read before a certified stop; uncertain ones among them
        keep their cheap estimate (the stop's label does not depend on them)."""
        last = s.tasks[s.read - 1]
        reading = Reading(
            chunks_read=s.read,
            chunks_total=text_chunks,
            tokens_read=last.end_token,
            tokens_total=s.meta.text_tokens,
            stopped=StopReason.CERTAIN,
        )
        out: list[Out] = []
        for i, v in sorted(s.verdicts.items()):
            t = s.tasks[i]
            t = dataclasses.replace(t, doc=dataclasses.replace(t.doc, reading=reading))
            stage = v.stage if v.stage != "uncertain" else "skipped"
            out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=stage))
            if stage != "skipped" and audit_pick(t.doc.id, i, self.audit_fraction):
                out.append(Escalation(t, v.hidden, None, audit_of=int(v.probs.argmax())))
        return out

    def _decide(self, s: CascadeState) -> list[Out]:
        settled = {i: v for i, v in s.verdicts.items() if v.stage != "uncertain"}
        uncertain = {i: v for i, v in s.verdicts.items() if v.stage == "uncertain"}
        known = sorted(settled)
        # A chunk without any estimate cannot be skipped: its answer is unbounded only
        # in theory, but a document label must rest on some answer for every chunk.
        decided = all(v.probs is not None for v in uncertain.values()) and STRATEGIES[
            self.strategy
        ].decided(
            np.stack([settled[i].probs for i in known]) if known else np.empty((0, 0)),
            np.asarray([float(s.tasks[i].n_tokens) for i in known]),
            [float(s.tasks[i].n_tokens) for i in uncertain],
        )
        out: list[Out] = []
        for i, v in sorted(settled.items()):
            t = s.tasks[i]
            out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=v.stage))
            if audit_pick(t.doc.id, i, self.audit_fraction):
                out.append(Escalation(t, v.hidden, None, audit_of=int(v.probs.argmax())))
        for i, v in sorted(uncertain.items()):
            t = s.tasks[i]
            if decided:
                out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage="skipped"))
            else:
                out.append(Escalation(t, v.hidden, v.probs))
        return out

    def snapshot(self) -> CascadeState:
        assert self.state is not None
        s = self.state
        return CascadeState(s.meta, dict(s.tasks), dict(s.verdicts), set(s.arrived), s.decided)


def cheap_stages(encoder: Encoder, cascade: Cascade, audit_fraction: float) -> CheapStages:
    """S0 then S1 on one chunk, with the real graphs and heads."""
    t0, t1 = cascade.point.threshold_s0, cascade.point.threshold_s1

    def run(task: ChunkTask) -> Verdict:
        ids = task.ids.reshape(1, -1)
        mask = np.ones_like(ids)
        with metrics.STAGE_SECONDS.labels("s0").time():
            emb = encoder.embeddings(ids, mask)
            features = pooled(emb)
            p0 = cascade.s0.probs(features)
            on_topic = 1.0 if cascade.on_topic is None else on_topic_of(cascade.on_topic, features)
        if p0.max() >= t0:
            return Verdict("s0", p0, on_topic=on_topic)
        with metrics.STAGE_SECONDS.labels("s1").time():
            hidden = encoder.prefix(emb, mask)
            p1 = cascade.s1.probs(pooled(hidden))
        if p1.max() >= t1:
            keep = audit_pick(task.doc.id, task.index, audit_fraction)
            return Verdict("s1", p1, hidden if keep else None, on_topic)
        return Verdict("uncertain", p1, hidden, on_topic)

    return run


@dataclass(frozen=True)
class CascadeOut:
    settled: Stream[ChunkResult]
    escalations: Stream[Escalation]
    dead: Stream[DeadLetter]  # texts cut at the chunk limit whose stop did not come


@operator
def cascade(
    step_id: str,
    up: Stream[ChunkTask],
    model_dir: Path,
    in_force: Cascade,
    settings: CascadeSettings,
    threads: int,
    engine: Engine,
    strategy: Aggregation,
    stop: StopRule | None = None,
) -> CascadeOut:
    """Cheap stages per chunk on the document's worker, read in order up to a certified
    ``stop`` (``None``: every chunk); escalations leave for any worker. ``in_force`` is
    the calibration the run prepared (the one its records name)."""

    @functools.cache
    def stages() -> CheapStages:
        # Once per process: the heads that settle the chunks are the calibration's whose
        # cascade.json sha256 the records carry, never a file read again here.
        encoder = worker_encoder(str(model_dir), threads, "stages", engine)
        return cheap_stages(encoder, in_force, settings.audit_fraction)

    def build(resume: CascadeState | None) -> CascadeLogic:
        cheap = stages()
        turn = settings.chunks_per_turn or None
        return CascadeLogic(cheap, strategy, settings.audit_fraction, resume, stop, turn)

    keyed = op.key_on("by_record", up, lambda t: t.doc.unit)
    decided = op.key_rm("unkey", op.stateful("stages", keyed, build))
    dead = op.branch("too_long", decided, lambda x: isinstance(x, DeadLetter))
    split = op.branch("escalate", dead.falses, lambda x: isinstance(x, Escalation))
    return CascadeOut(
        settled=split.falses,  # type: ignore[arg-type]
        escalations=split.trues,  # type: ignore[arg-type]
        dead=dead.trues,  # type: ignore[arg-type]
    )
