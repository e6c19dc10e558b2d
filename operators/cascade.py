"""The cascade: cheap heads on the model's own latent space settle the chunks whose
full-model answer would not change; only the rest pay for the transformer.

Its parts: the calibration in force (:mod:`~kascade.operators.calibration`), the cheap
verdicts S0 and S1 per chunk (:mod:`~kascade.operators.verdicts`), the turns a document
reads in (:mod:`~kascade.operators.turns`), the exit rules that end its reading
(:mod:`~kascade.operators.exits`: the document stop's rule from
:mod:`~kascade.operators.reading`, or everything read), the audit draw
(:mod:`~kascade.operators.audits`); S2 is the rest of the model (the suffix graph, in
:mod:`~kascade.operators.full_model`), fed the prefix's output so nothing is computed twice.

Per document (:class:`CascadeLogic`), chunks are read in order, until a certified
document stop makes the full read's label certain (the rest never computed) or to the
end, where the uncertain chunks go to the full model only if their answers could still
change the document's label (:meth:`Strategy.decided`; if not, their S1 estimate stands).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import bytewax.operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import StatefulLogic

from kascade.operators import guarantee, inflight, metrics
from kascade.operators.audits import stop_audit_pick
from kascade.operators.calibration import Cascade
from kascade.operators.chunking import Chunker, meta_of
from kascade.operators.encoder import Loaded
from kascade.operators.exits import certified_stop, full_read, read_all, stop_reached
from kascade.operators.full_model import worker_encoder
from kascade.operators.guarantee import Guard
from kascade.operators.items import (
    ChunkResult,
    ChunkTask,
    DocMeta,
    Escalation,
    FullRead,
    Outcome,
    unit_of,
)
from kascade.operators.streams import by_class
from kascade.operators.turns import Turns
from kascade.operators.validate import Received, failure

# Snapshots taken before these moved to verdicts name them as this module's: pickle finds
# them here.
from kascade.operators.verdicts import CascadeState, CheapStages, Verdict, cheap_stages
from kascade.schemas import Aggregation, DeadLetter, DeadLetterReason, Reading, Stage, StopReason
from kascade.schemas.cascade import StopRule
from kascade.schemas.engine import Engine
from kascade.schemas.settings import CascadeSettings, ChunkSettings

Out = ChunkResult | Escalation | FullRead | Outcome | DeadLetter
T = TypeVar("T")


class _Unreadable(Exception):
    """The tokenizer failed on a document's text (its dead letter says how)."""


@dataclass
class CascadeLogic(StatefulLogic[Received, Out, CascadeState]):
    """Per document: make its chunks and read them in order (in
    :mod:`~kascade.operators.turns`), each through the verdict source (the cheap stages,
    or the full model where the live test suspended them), until an exit rule
    (:mod:`~kascade.operators.exits`) ends the reading: the certified ``stop`` knows the
    label, or every chunk is read.

    With a ``stop`` the text is tokenized only as far as reading goes (a long document
    stopped after two chunks costs two chunks' tokens); a text whose stop has not come
    within ``max_chunks`` chunks is dead-lettered ``too_long``. Without one every chunk
    is read, so the text is tokenized whole first and one over the limit is dead-lettered
    before any of it is computed. A text the tokenizer fails on is dead-lettered too.
    """

    cheap: CheapStages
    chunker: Chunker
    max_chunks: int
    strategy: Aggregation
    audit_fraction: float = 0.0  # of the settled chunks, for the live test of the bound
    state: CascadeState | None = None
    stop: StopRule | None = None  # None: read every chunk
    turn: int | None = None  # chunks read per turn (None: every chunk that is ready)
    # Whether the live test suspended the cheap stages for a document's kind of text: the
    # full model decides its chunks (the process's Guard.suspends, by the cascade's scope).
    suspends: Callable[[DocMeta], bool] = guarantee.never_suspended
    # Whether the live test of the stop left it in force (Guard.stop_in_force), and the
    # share of stopped documents read to their end by the full model too, for that test.
    stop_in_force: Callable[[], bool] = guarantee.always
    stop_audit_fraction: float = 0.0
    stage: str = "cascade"  # the step named in its dead letters
    _turns: Turns = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turns = Turns(self.turn)

    def on_item(self, value: Received) -> tuple[list[Out], bool]:
        if self.state is not None:  # a replay of the document being read: read once
            return [], self._keep(self.state)
        s = self.state = CascadeState(
            meta_of(value),
            text=self.chunker.tokens(value.doc.text),
            origin=value.origin,
        )
        return self._read_on(s, first=True), self._keep(s)

    def on_notify(self) -> tuple[list[Out], bool]:
        assert self.state is not None
        self._turns.next_turn()
        return self._read_on(self.state), self._keep(self.state)

    def on_eof(self) -> tuple[list[Out], bool]:
        # This execution ends (end of input, or a drain): no turn comes after this one.
        s = self.state
        if s is None or s.decided:
            return [], StatefulLogic.RETAIN
        self._turns.end()
        return self._read_on(s), self._keep(s)

    def notify_at(self) -> datetime | None:
        s = self.state
        return self._turns.notify_at(s is not None and not s.decided)

    @staticmethod
    def _keep(s: CascadeState) -> bool:
        return StatefulLogic.DISCARD if s.decided else StatefulLogic.RETAIN

    def _read_on(self, s: CascadeState, first: bool = False) -> list[Out]:
        """Read the chunks that are next in order (as many as this turn allows); the
        document's results once an exit rule ends the reading, or its dead letter."""
        try:
            with inflight.inside(s.meta.source, self.stage):
                if first:
                    early = self._open(s)
                    if early is not None:
                        s.decided = True
                        return early
                return self._read(s)
        except _Unreadable as e:
            s.decided = True
            return [self._dead_letter(s, DeadLetterReason.PROCESSING, str(e))]

    def _open(self, s: CascadeState) -> list[Out] | None:
        """A document's results or dead letter where they are known before reading: a text
        without tokens, or (reading all) one over the chunk limit."""
        assert s.text is not None  # a new document's
        metrics.DOCS_IN.inc()
        if self.stop is None or not self.stop_in_force():
            count = self._chunking(self.chunker.count, s.text)
            if count > self.max_chunks:
                detail = (
                    f"{len(s.text.ids)} tokens make {count} chunks; the limit is {self.max_chunks}"
                )
                return [self._dead_letter(s, DeadLetterReason.TOO_LONG, detail)]
        if not self._chunking(self.chunker.exists, s.text, 0):
            return [Outcome(s.meta, self._reading(s, StopReason.END), s.suspended)]
        return None

    def _read(self, s: CascadeState) -> list[Out]:
        while self._ready(s) and self._turns.take():
            task = s.tasks[s.read]
            verdict = self._verdict(task, s)
            if verdict.stage != Stage.UNCERTAIN:
                metrics.CHUNKS_SETTLED.labels(verdict.stage).inc()
            s.verdicts[task.index] = verdict
            follows = self._follows(s)
            stop = self.stop if self.stop_in_force() else None
            label = stop_reached(stop, s, self.strategy) if stop is not None and follows else None
            if label is not None:
                s.decided = True
                reading = self._reading(s, StopReason.CERTAIN)
                return [*certified_stop(s, reading, self.audit_fraction), *self._full(s, label)]
            if not follows:
                s.decided = True
                reading = self._reading(s, StopReason.END)
                return list(read_all(s, reading, self.strategy, self.audit_fraction))
            if s.read >= self.max_chunks:
                s.decided = True
                detail = (
                    f"more than {self.max_chunks} chunks (the limit), and reading its first"
                    f" {self.max_chunks} did not make the label certain"
                )
                return [self._dead_letter(s, DeadLetterReason.TOO_LONG, detail)]
        return []

    def _ready(self, s: CascadeState) -> bool:
        """Whether the next chunk in order is there to read; it is made here, from the text
        tokenized as far as it and the knowledge of whether another follows need."""
        if s.decided:
            return False
        if s.read in s.tasks or s.text is None:  # no text: a snapshot's, every chunk made
            return s.read in s.tasks
        k = s.read
        c = self._chunking(self.chunker.chunk, s.text, k)
        follows = self._chunking(self.chunker.exists, s.text, k + 1)
        if s.text.complete and s.meta.text_tokens != len(s.text.ids):
            s.meta = dataclasses.replace(
                s.meta, total_chunks=self.chunker.count(s.text), text_tokens=len(s.text.ids)
            )
        elif not s.text.complete:
            s.meta = dataclasses.replace(s.meta, total_chunks=k + 1 + follows)
        meta = s.meta if k == 0 else dataclasses.replace(s.meta, envelope=None)
        s.tasks[k] = c.task(meta)
        metrics.CHUNKS_IN.inc()
        return True

    def _follows(self, s: CascadeState) -> bool:
        """Whether the text has a chunk after those read (within the limit or not)."""
        if s.text is None:
            return s.read < s.meta.total_chunks
        return self._chunking(self.chunker.exists, s.text, s.read)

    def _reading(self, s: CascadeState, stopped: StopReason) -> Reading:
        t = s.text
        last = s.tasks[s.read - 1] if s.read else None
        tokens_read = last.end_token if last is not None else 0
        complete = t is None or t.complete
        chars_read = None
        if t is not None:
            chars_read = len(t.text) if stopped == StopReason.END else t.offsets[tokens_read - 1][1]
        return Reading(
            chunks_read=s.read,
            chunks_total=s.meta.total_chunks if complete else None,
            tokens_read=tokens_read,
            tokens_total=s.meta.text_tokens if complete else None,
            chars_read=chars_read,
            chars_total=s.meta.text_chars if t is not None else None,
            stopped=stopped,
        )

    def _chunking(self, fn: Callable[..., T], *args: object) -> T:
        """A chunker call; a failure of the tokenizer is the document's, not the worker's."""
        try:
            with metrics.STAGE_SECONDS.labels("chunk").time():
                return fn(*args)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # pyo3's PanicException (a Rust panic) included
            raise _Unreadable(failure(e)) from e

    def _full(self, s: CascadeState, label: int) -> list[FullRead]:
        """Where the draw picks this stopped document, the whole of it for the full model
        too (the live test of the stop; the document's output stands as stopped)."""
        if not stop_audit_pick(s.meta.id, self.stop_audit_fraction):
            return []
        try:  # None: past the chunk limit, where no full read is defined
            read = self._chunking(full_read, s, label, self.chunker, self.max_chunks, self.strategy)
            return [] if read is None else [read]
        except _Unreadable:
            return []  # the tokenizer failed on the rest: only the audit is not made

    def _dead_letter(self, s: CascadeState, reason: DeadLetterReason, detail: str) -> DeadLetter:
        # Only a document read from its text is dead-lettered here, and it has its origin.
        assert s.origin is not None
        return s.origin.dead_letter(reason, detail, self.stage)

    def _verdict(self, task: ChunkTask, s: CascadeState) -> Verdict:
        """The cheap stages' verdict on a chunk, or uncertain (the full model decides)
        where the live test rejected the bound or the cheap stages failed."""
        if self.suspends(task.doc):
            s.suspended = True
            return Verdict(Stage.UNCERTAIN, None)
        try:
            return self.cheap(task)  # inside the record, as _read_on noted
        except Exception:  # the cheap stages are an optimisation: the full model decides
            metrics.CHEAP_FAILURES.inc()
            return Verdict(Stage.UNCERTAIN, None)

    def snapshot(self) -> CascadeState:
        assert self.state is not None
        s = self.state
        text = s.text
        if text is not None:  # the tokens so far are the state's too (lists: copied)
            text = dataclasses.replace(text, ids=list(text.ids), offsets=list(text.offsets))
        return dataclasses.replace(s, tasks=dict(s.tasks), verdicts=dict(s.verdicts), text=text)


@dataclass(frozen=True)
class CascadeOut:
    settled: Stream[ChunkResult]
    escalations: Stream[Escalation | FullRead]  # for the full model
    outcomes: Stream[Outcome]  # one per document decided
    dead: Stream[DeadLetter]  # too long (the stop did not come within the limit), unreadable


def _suspends(guard: Guard, in_force: Cascade, doc: DocMeta) -> bool:
    return guard.suspends(in_force.scope_of(doc.lang, doc.total_chunks))


@operator
def cascade(
    step_id: str,
    up: Stream[Received],
    model: Loaded,
    in_force: Cascade,
    settings: CascadeSettings,
    chunking: ChunkSettings,
    threads: int,
    engine: Engine,
    strategy: Aggregation,
    stop: StopRule | None = None,
    guard: Guard | None = None,
) -> CascadeOut:
    """Each document chunked and read on its worker, its chunks through the cheap stages
    in order up to a certified ``stop`` (``None``: every chunk); escalations leave for any
    worker. ``in_force`` is the calibration the run prepared (the one its records name)."""

    @functools.cache
    def stages() -> CheapStages:
        # Once per process: the heads that settle the chunks are the calibration's whose
        # cascade.json sha256 the records carry, never a file read again here.
        encoder = worker_encoder(model, threads, "stages", engine)
        return cheap_stages(encoder, in_force, settings.audit_fraction)

    chunker = Chunker.of(model.tokenizer, chunking.max_tokens, chunking.overlap)

    def build(resume: CascadeState | None) -> CascadeLogic:
        suspends: Callable[[DocMeta], bool] = guarantee.never_suspended
        if guard is not None:
            suspends = functools.partial(_suspends, guard, in_force)
        return CascadeLogic(
            stages(),
            chunker,
            chunking.max_chunks,
            strategy,
            settings.audit_fraction,
            resume,
            stop,
            settings.chunks_per_turn or None,
            suspends=suspends,
            stop_in_force=guarantee.always if guard is None else guard.stop_in_force,
            stop_audit_fraction=settings.stop_audit_fraction,
            stage=step_id,
        )

    keyed = op.key_on("by_record", up, lambda r: unit_of(r.position, r.doc.id))
    decided = op.key_rm("unkey", op.stateful("stages", keyed, build))
    dead, live = by_class("dead", decided, DeadLetter)
    outcomes, chunks = by_class("outcomes", live, Outcome)
    settled, escalations = by_class("escalate", chunks, ChunkResult)
    return CascadeOut(settled=settled, escalations=escalations, outcomes=outcomes, dead=dead)
