"""The cascade: cheap heads on the model's own latent space settle the chunks whose
full-model answer would not change; only the rest pay for the transformer.

Its parts: the calibration in force (:mod:`~kascade.operators.calibration`), the cheap
verdicts S0 and S1 per chunk (:mod:`~kascade.operators.verdicts`), the turns a document
reads in (:mod:`~kascade.operators.turns`), the exit rules that end its reading
(:mod:`~kascade.operators.exits`: the document stop's rule from
:mod:`~kascade.operators.reading`, or everything read), the audit draw
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
from datetime import datetime

import bytewax.operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import StatefulLogic

from kascade.operators import guarantee, inflight, metrics
from kascade.operators.calibration import Cascade
from kascade.operators.encoder import Loaded
from kascade.operators.exits import certified_stop, read_all, stop_reached
from kascade.operators.full_model import worker_encoder
from kascade.operators.guarantee import Guard
from kascade.operators.items import ChunkResult, ChunkTask, DocMeta, Escalation, Outcome
from kascade.operators.streams import by_class
from kascade.operators.turns import Turns

# Snapshots taken before these moved to verdicts name them as this module's: pickle finds
# them here.
from kascade.operators.verdicts import CascadeState, CheapStages, Verdict, cheap_stages
from kascade.schemas import Aggregation, DeadLetter, Stage
from kascade.schemas.cascade import StopRule
from kascade.schemas.engine import Engine
from kascade.schemas.settings import CascadeSettings

Out = ChunkResult | Escalation | Outcome | DeadLetter


@dataclass
class CascadeLogic(StatefulLogic[ChunkTask, Out, CascadeState]):
    """Per document: read the chunks in order (in :mod:`~kascade.operators.turns`),
    each through the verdict source (the cheap stages, or the full model where the live
    test suspended them), until an exit rule (:mod:`~kascade.operators.exits`) ends the
    reading: the certified ``stop`` knows the label, or every chunk is read.

    A text cut at the chunk limit whose stop did not come before it is dead-lettered
    ``too_long`` (its first chunk carries that dead letter).
    """

    cheap: CheapStages
    strategy: Aggregation
    audit_fraction: float = 0.0
    state: CascadeState | None = None
    stop: StopRule | None = None  # None: read every chunk
    turn: int | None = None  # chunks read per turn (None: every chunk that is ready)
    # Whether the live test suspended the cheap stages for a document's kind of text: the
    # full model decides its chunks (the process's Guard.suspends, by the cascade's scope).
    suspends: Callable[[DocMeta], bool] = guarantee.never_suspended
    _turns: Turns = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turns = Turns(self.turn)

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
        return self._turns.notify_at(s is not None and not s.decided and s.read in s.tasks)

    @staticmethod
    def _keep(s: CascadeState) -> bool:
        if s.decided and len(s.arrived) >= s.meta.total_chunks:
            return StatefulLogic.DISCARD
        return StatefulLogic.RETAIN

    def _read_on(self, s: CascadeState) -> list[Out]:
        """Read the chunks that are next in order (as many as this turn allows); the
        document's results once an exit rule ends the reading."""
        text_chunks = s.meta.chunks_of_text
        while s.read in s.tasks and self._turns.take():
            task = s.tasks[s.read]
            verdict = self._verdict(task, s)
            if verdict.stage != Stage.UNCERTAIN:
                metrics.CHUNKS_SETTLED.labels(verdict.stage).inc()
            s.verdicts[task.index] = verdict
            stop = self.stop
            if stop is not None and s.read < text_chunks and stop_reached(stop, s, self.strategy):
                s.decided = True
                return list(certified_stop(s, text_chunks, self.audit_fraction))
            if s.read == s.meta.total_chunks:
                s.decided = True
                over = s.tasks[0].doc.over_limit
                if over is not None:
                    return [over]
                return list(read_all(s, self.strategy, self.audit_fraction))
        return []

    def _verdict(self, task: ChunkTask, s: CascadeState) -> Verdict:
        """The cheap stages' verdict on a chunk, or uncertain (the full model decides)
        where the live test rejected the bound or the cheap stages failed."""
        if self.suspends(task.doc):
            s.suspended = True
            return Verdict(Stage.UNCERTAIN, None)
        try:
            with inflight.inside(task.doc.source, "cascade"):
                return self.cheap(task)
        except Exception:  # the cheap stages are an optimisation: the full model decides
            metrics.CHEAP_FAILURES.inc()
            return Verdict(Stage.UNCERTAIN, None)

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


def _suspends(guard: Guard, in_force: Cascade, doc: DocMeta) -> bool:
    return guard.suspends(in_force.scope_of(doc.lang, doc.chunks_of_text))


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
        suspends: Callable[[DocMeta], bool] = guarantee.never_suspended
        if guard is not None:
            suspends = functools.partial(_suspends, guard, in_force)
        return CascadeLogic(
            cheap, strategy, settings.audit_fraction, resume, stop, turn, suspends=suspends
        )

    keyed = op.key_on("by_record", up, lambda t: t.doc.unit)
    decided = op.key_rm("unkey", op.stateful("stages", keyed, build))
    dead, live = by_class("too_long", decided, DeadLetter)
    outcomes, chunks = by_class("outcomes", live, Outcome)
    escalations, settled = by_class("escalate", chunks, Escalation)
    return CascadeOut(settled=settled, escalations=escalations, outcomes=outcomes, dead=dead)
