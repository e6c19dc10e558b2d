"""The cascade: cheap heads on the model's own latent space settle the chunks whose
full-model answer would not change; only the rest pay for the transformer.

Its parts: the calibration in force (:mod:`~kascade.operators.calibration`), the cheap
verdicts S0 and S1 per chunk (:mod:`~kascade.operators.verdicts`), the document stop's
rule (:mod:`~kascade.operators.reading`), the audit draw
(:mod:`~kascade.operators.audits`); S2 is the rest of the model (the suffix graph, in
:mod:`~kascade.operators.full_model`), fed the prefix's output so nothing is computed twice.

Per document (:class:`CascadeLogic`), chunks are read in order. With a certified
document stop (:mod:`kascade.operators.reading`), reading ends as soon as the cheap
verdicts so far make the full read's label certain, and the remaining chunks are never
computed. Otherwise, once every chunk has been through S0/S1, the uncertain chunks are
escalated only if their full-model answers could still change the document's label
under the reduce strategy (:meth:`Strategy.decided`); if not they are skipped and their
S1 estimate stands.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator
from bytewax.operators import StatefulLogic

from kascade.operators import guarantee, inflight, metrics
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.audits import audit_pick
from kascade.operators.calibration import Cascade
from kascade.operators.encoder import Loaded
from kascade.operators.full_model import worker_encoder
from kascade.operators.guarantee import Guard
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, Outcome
from kascade.operators.reading import stop_label
from kascade.operators.streams import by_class

# Snapshots taken before these moved to verdicts name them as this module's: pickle finds
# them here.
from kascade.operators.verdicts import CascadeState, CheapStages, Verdict, cheap_stages
from kascade.schemas import Aggregation, DeadLetter, Reading, Stage, StopReason
from kascade.schemas.cascade import StopRule
from kascade.schemas.engine import Engine
from kascade.schemas.settings import CascadeSettings

Out = ChunkResult | Escalation | Outcome | DeadLetter


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
    # Whether the live test suspended the cheap stages for a language: the full model
    # decides those chunks (the process's Guard.suspends).
    suspends: Callable[[str | None], bool] = guarantee.never_suspended
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
            if self.suspends(task.doc.lang):
                # The live test rejected the bound here: the full model decides the chunk.
                s.suspended = True
                verdict = Verdict(Stage.UNCERTAIN, None)
            else:
                verdict = self._cheap(task)
            if verdict.stage != Stage.UNCERTAIN:
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
            return Verdict(Stage.UNCERTAIN, None)

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
        out: list[Out] = [Outcome(s.meta, reading, s.suspended)]
        for i, v in sorted(s.verdicts.items()):
            t = s.tasks[i]
            stage = v.stage if v.stage != Stage.UNCERTAIN else Stage.SKIPPED
            out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=stage))
            if stage != Stage.SKIPPED and audit_pick(t.doc.id, i, self.audit_fraction):
                out.append(Escalation(t, v.hidden, None, audit_of=int(v.settled_probs().argmax())))
        return out

    def _decide(self, s: CascadeState) -> list[Out]:
        settled = {i: v for i, v in s.verdicts.items() if v.stage != Stage.UNCERTAIN}
        uncertain = {i: v for i, v in s.verdicts.items() if v.stage == Stage.UNCERTAIN}
        known = sorted(settled)
        # A chunk without any estimate cannot be skipped: its answer is unbounded only
        # in theory, but a document label must rest on some answer for every chunk.
        decided = all(v.probs is not None for v in uncertain.values()) and STRATEGIES[
            self.strategy
        ].decided(
            np.stack([settled[i].settled_probs() for i in known]) if known else np.empty((0, 0)),
            np.asarray([float(s.tasks[i].n_tokens) for i in known]),
            [float(s.tasks[i].n_tokens) for i in uncertain],
        )
        out: list[Out] = [Outcome(s.meta, None, s.suspended)]
        for i, v in sorted(settled.items()):
            t = s.tasks[i]
            out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=v.stage))
            if audit_pick(t.doc.id, i, self.audit_fraction):
                out.append(Escalation(t, v.hidden, None, audit_of=int(v.settled_probs().argmax())))
        for i, v in sorted(uncertain.items()):
            t = s.tasks[i]
            if decided:
                out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=Stage.SKIPPED))
            else:
                out.append(Escalation(t, v.hidden, v.probs))
        return out

    def snapshot(self) -> CascadeState:
        assert self.state is not None
        s = self.state
        return CascadeState(
            s.meta, dict(s.tasks), dict(s.verdicts), set(s.arrived), s.decided, s.suspended
        )


@dataclass(frozen=True)
class CascadeOut:
    settled: Stream[ChunkResult]
    escalations: Stream[Escalation]
    outcomes: Stream[Outcome]  # one per document decided
    dead: Stream[DeadLetter]  # texts cut at the chunk limit whose stop did not come


@operator
def cascade(
    step_id: str,
    up: Stream[ChunkTask],
    model: Loaded,
    in_force: Cascade,
    settings: CascadeSettings,
    threads: int,
    engine: Engine,
    strategy: Aggregation,
    stop: StopRule | None = None,
    guard: Guard | None = None,
) -> CascadeOut:
    """Cheap stages per chunk on the document's worker, read in order up to a certified
    ``stop`` (``None``: every chunk); escalations leave for any worker. ``in_force`` is
    the calibration the run prepared (the one its records name)."""

    @functools.cache
    def stages() -> CheapStages:
        # Once per process: the heads that settle the chunks are the calibration's whose
        # cascade.json sha256 the records carry, never a file read again here.
        encoder = worker_encoder(model, threads, "stages", engine)
        return cheap_stages(encoder, in_force, settings.audit_fraction)

    def build(resume: CascadeState | None) -> CascadeLogic:
        cheap = stages()
        turn = settings.chunks_per_turn or None
        suspends = guarantee.never_suspended if guard is None else guard.suspends
        return CascadeLogic(
            cheap, strategy, settings.audit_fraction, resume, stop, turn, suspends=suspends
        )

    keyed = op.key_on("by_record", up, lambda t: t.doc.unit)
    decided = op.key_rm("unkey", op.stateful("stages", keyed, build))
    dead, live = by_class("too_long", decided, DeadLetter)
    outcomes, chunks = by_class("outcomes", live, Outcome)
    escalations, settled = by_class("escalate", chunks, Escalation)
    return CascadeOut(settled=settled, escalations=escalations, outcomes=outcomes, dead=dead)
