"""How a document's reading ends, once its chunks are read in order: the two exit rules.

- :func:`certified_stop`: the cheap verdicts so far make the full read's label certain
  (the certified document stop, :mod:`~kascade.operators.reading`); the chunks read are
  the results, the rest are never computed.
- :func:`read_all`: every chunk was read; the uncertain chunks go to the full model only
  if their answers could still change the document's label under the reduce strategy
  (:meth:`~kascade.operators.aggregation.Strategy.decided`), else their estimate stands.

Either way the document's :class:`~kascade.operators.items.Outcome` goes first, and a
keyed draw of the settled chunks goes to the full model too, for the live test; a keyed
draw of the stopped documents goes to it whole (:func:`full_read`), for the live test of
the stop.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kascade.operators.aggregation import STRATEGIES
from kascade.operators.audits import audit_pick
from kascade.operators.chunking import Chunker
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, FullRead, Outcome
from kascade.operators.reading import stop_label
from kascade.operators.verdicts import CascadeState, Verdict
from kascade.schemas import Aggregation, Reading, Stage
from kascade.schemas.cascade import StopRule

Decided = list[ChunkResult | Escalation | Outcome]


def stop_reached(stop: StopRule, s: CascadeState, strategy: Aggregation) -> int | None:
    """The label the verdicts read so far make certain (its index), if they do."""
    seen = [v.seen(s.tasks[i].n_tokens) for i, v in sorted(s.verdicts.items())]
    return stop_label(stop, seen, strategy)


def certified_stop(s: CascadeState, reading: Reading, audit_fraction: float) -> Decided:
    """Results for the chunks read before a certified stop; uncertain ones among them
    keep their cheap estimate (the stop's label does not depend on them)."""
    out: Decided = [Outcome(s.meta, reading, s.suspended)]
    for i, v in sorted(s.verdicts.items()):
        t = s.tasks[i]
        stage = v.stage if v.stage != Stage.UNCERTAIN else Stage.SKIPPED
        out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=stage))
        if stage != Stage.SKIPPED:
            out += _audit(t, v, audit_fraction)
    return out


def read_all(
    s: CascadeState, reading: Reading, strategy: Aggregation, audit_fraction: float
) -> Decided:
    """Every chunk read: settle, skip or escalate them (document-level early exit)."""
    settled = {i: v for i, v in s.verdicts.items() if v.stage != Stage.UNCERTAIN}
    uncertain = {i: v for i, v in s.verdicts.items() if v.stage == Stage.UNCERTAIN}
    known = sorted(settled)
    # A chunk without any estimate cannot be skipped: its answer is unbounded only
    # in theory, but a document label must rest on some answer for every chunk.
    decided = all(v.probs is not None for v in uncertain.values()) and STRATEGIES[strategy].decided(
        np.stack([settled[i].settled_probs() for i in known]) if known else np.empty((0, 0)),
        np.asarray([float(s.tasks[i].n_tokens) for i in known]),
        [float(s.tasks[i].n_tokens) for i in uncertain],
    )
    out: Decided = [Outcome(s.meta, reading, s.suspended)]
    for i, v in sorted(settled.items()):
        t = s.tasks[i]
        out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=v.stage))
        out += _audit(t, v, audit_fraction)
    for i, v in sorted(uncertain.items()):
        t = s.tasks[i]
        if decided:
            out.append(ChunkResult(t.doc, i, t.n_tokens, v.probs, stage=Stage.SKIPPED))
        else:
            out.append(Escalation(t, v.hidden, v.probs))
    return out


def _audit(task: ChunkTask, verdict: Verdict, fraction: float) -> list[Escalation]:
    """The settled chunk again, for the full model, where the audit draw picks it."""
    if not audit_pick(task.doc.id, task.index, fraction):
        return []
    return [Escalation(task, verdict.hidden, None, audit_of=int(verdict.settled_probs().argmax()))]


def full_read(
    s: CascadeState, label: int, chunker: Chunker, max_chunks: int, strategy: Aggregation
) -> FullRead | None:
    """A document the stop ended early with ``label``, for the full model to read to its
    end: the chunks read (from their prefix output, where the cheap stages kept it) and
    the rest, tokenized now. ``None`` where the text has more than ``max_chunks`` chunks:
    no full read of it is defined (read whole, it is dead-lettered)."""
    tasks = [s.tasks[i] for i in sorted(s.tasks)]
    if s.text is not None:  # else a snapshot's, from before texts were kept: every chunk made
        meta = dataclasses.replace(s.meta, envelope=None)
        k = len(tasks)
        while chunker.exists(s.text, k):
            if k >= max_chunks:
                return None
            tasks.append(chunker.chunk(s.text, k).task(meta))
            k += 1
    hidden = {i: v.hidden for i, v in s.verdicts.items() if v.hidden is not None}
    return FullRead(tasks, hidden, label, strategy)
