"""Per-document reduce: a document's chunk verdicts become one output record.

The strategies themselves live in :mod:`kascade.operators.aggregation`.

>>> import numpy as np
>>> v = [ChunkVerdict(0, 30, np.array([0.9, 0.1])), ChunkVerdict(1, 10, np.array([0.2, 0.8]))]
>>> aggregate(v, Aggregation.TOKEN_MEAN, ["a", "b"]).label
'a'
>>> aggregate(v, Aggregation.MAJORITY, ["a", "b"]).scores
{'a': 0.5, 'b': 0.5}
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator
from bytewax.operators import StatefulLogic

from kascade.operators import metrics
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.items import ChunkResult, DocMeta, Envelope, Outcome
from kascade.schemas import (
    Aggregation,
    CascadeUse,
    ChunkCounts,
    ModelIdentity,
    OutputRecord,
    Reading,
    Stage,
    StopReason,
)


@dataclass(frozen=True)
class ChunkVerdict:
    """A chunk's probabilities (``None`` if no stage could classify it)."""

    index: int
    n_tokens: int
    probs: np.ndarray | None


@dataclass(frozen=True)
class DocumentLabel:
    label: str | None
    score: float
    scores: dict[str, float]


def aggregate(
    verdicts: list[ChunkVerdict], strategy: Aggregation, labels: list[str]
) -> DocumentLabel:
    """The document label from its chunks' verdicts; no usable verdict gives ``None``."""
    usable = [(v, v.probs) for v in verdicts if v.probs is not None]
    if not usable:
        return DocumentLabel(None, 0.0, {})
    probs = np.stack([p for _, p in usable]).astype(np.float64)
    weights = np.asarray([max(v.n_tokens, 1) for v, _ in usable], dtype=np.float64)
    winner, scores = STRATEGIES[strategy].combine(probs, weights)
    return DocumentLabel(
        labels[winner], float(scores[winner]), dict(zip(labels, scores, strict=True))
    )


@dataclass(frozen=True)
class Labeling:
    """What every output record needs besides the chunks: labels, strategy, model."""

    labels: list[str]
    aggregation: Aggregation
    model: ModelIdentity
    cascade: CascadeUse = CascadeUse.OFF


@dataclass
class Assembly:
    """The chunks of one document seen so far, by index (so a replayed chunk is not
    counted twice), and how the cascade read it, once it says."""

    meta: DocMeta
    results: dict[int, ChunkResult] = field(default_factory=dict)
    outcome: Outcome | None = None

    def add(self, item: ChunkResult | Outcome) -> None:
        if isinstance(item, Outcome):
            self.outcome = item
            return
        self.results[item.index] = item
        if item.doc.envelope is not None:
            self.meta = item.doc  # the first chunk's carries the input's envelope

    def complete(self, with_outcome: bool) -> bool:
        """Every result in; ``with_outcome``: and the cascade said how far it read."""
        if self.outcome is not None:
            return len(self.results) >= self.outcome.chunks_expected
        return not with_outcome and len(self.results) >= self.meta.total_chunks


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def reading_of(meta: DocMeta, outcome: Outcome | None = None) -> Reading:
    """How much of the document was read: what a certified stop recorded, else all of it.

    >>> meta = DocMeta("d", total_chunks=3, lang=None, metadata=None, timestamp_ms=None,
    ...                text_tokens=700)
    >>> reading_of(meta).stopped.value, reading_of(meta).tokens_read
    ('end', 700)
    """
    if outcome is not None:
        return outcome.reading
    return Reading(
        chunks_read=meta.total_chunks,
        chunks_total=meta.total_chunks,
        tokens_read=meta.text_tokens,
        tokens_total=meta.text_tokens,
        chars_read=meta.text_chars,
        chars_total=meta.text_chars,
        stopped=StopReason.END,
    )


def label_document(
    meta: DocMeta,
    results: list[ChunkResult],
    labeling: Labeling,
    now_ms: int,
    outcome: Outcome | None = None,
) -> OutputRecord:
    """The output record of a complete document (read as ``outcome`` says; ``None``: all
    of it, the cascade not suspended)."""
    reading = reading_of(meta, outcome)
    suspended = outcome is not None and outcome.suspended
    verdicts = [ChunkVerdict(r.index, r.n_tokens, r.probs) for r in results]
    doc = aggregate(verdicts, labeling.aggregation, labeling.labels)
    stages = Counter(r.stage for r in results if r.probs is not None)
    reasons = sorted({r.error for r in results if r.error})
    latency = 0.0 if meta.timestamp_ms is None else max(0.0, float(now_ms - meta.timestamp_ms))
    return OutputRecord(
        id=meta.id,
        label=doc.label,
        score=doc.score,
        scores=doc.scores,
        aggregation=labeling.aggregation,
        chunks=ChunkCounts(
            total=reading.chunks_total,
            settled_s0=stages[Stage.S0],
            settled_s1=stages[Stage.S1],
            full_model=stages[Stage.FULL],
            skipped=stages[Stage.SKIPPED],
            unread=None
            if reading.chunks_total is None
            else reading.chunks_total - reading.chunks_read,
            failed=sum(1 for r in results if r.error),
        ),
        model=labeling.model,
        latency_ms=latency,
        degraded=bool(reasons),
        reasons=reasons,
        cascade=CascadeUse.SUSPENDED if suspended else labeling.cascade,
        reading=reading,
        lang=meta.lang,
        metadata=meta.metadata,
        source=meta.source,
    )


def label_or_degraded(
    meta: DocMeta,
    results: list[ChunkResult],
    labeling: Labeling,
    now_ms: int,
    outcome: Outcome | None = None,
) -> OutputRecord:
    """:func:`label_document`, or if that fails a degraded record without a label
    saying why: a document's output never takes the job down with it."""
    try:
        return label_document(meta, results, labeling, now_ms, outcome)
    except Exception as e:
        return OutputRecord(
            id=meta.id,
            label=None,
            score=0.0,
            scores={},
            aggregation=labeling.aggregation,
            chunks=ChunkCounts(total=meta.total_chunks, failed=meta.total_chunks),
            model=labeling.model,
            latency_ms=0.0,
            degraded=True,
            reasons=[f"reduce failed: {type(e).__name__}: {e}"[:500]],
            cascade=labeling.cascade,
            source=meta.source,
        )


@dataclass(frozen=True)
class Labeled:
    """A document's output record and what its input record said besides the text."""

    record: OutputRecord
    envelope: Envelope | None = None


def labeled(
    meta: DocMeta,
    results: list[ChunkResult],
    labeling: Labeling,
    now_ms: int,
    outcome: Outcome | None = None,
) -> Labeled:
    record = label_or_degraded(meta, results, labeling, now_ms, outcome)
    reading = record.reading
    if reading is not None:
        metrics.TOKENS.labels("read").inc(reading.tokens_read)
        if reading.skipped_tokens is not None:
            metrics.TOKENS.labels("skipped").inc(reading.skipped_tokens)
        if reading.chars_read is not None and reading.skipped_chars is not None:
            metrics.CHARS.labels("read").inc(reading.chars_read)
            metrics.CHARS.labels("skipped").inc(reading.skipped_chars)
    return Labeled(record, meta.envelope)


Part = ChunkResult | Outcome  # what assembles a document


@dataclass
class AssembleLogic(StatefulLogic[Part, Labeled, Assembly]):
    """Per document: collect chunk results (and, ``with_outcome``, how the cascade read
    it); emit one record when all are in."""

    labeling: Labeling
    state: Assembly | None = None
    now_ms: Callable[[], int] = _wall_ms
    with_outcome: bool = False

    def on_item(self, value: Part) -> tuple[list[Labeled], bool]:
        if self.state is None:
            self.state = Assembly(value.doc)
        a = self.state
        a.add(value)
        if not a.complete(self.with_outcome):
            return [], StatefulLogic.RETAIN
        out = labeled(a.meta, list(a.results.values()), self.labeling, self.now_ms(), a.outcome)
        return [out], StatefulLogic.DISCARD

    def snapshot(self) -> Assembly:
        assert self.state is not None
        return Assembly(self.state.meta, dict(self.state.results), self.state.outcome)


@operator
def assemble(
    step_id: str,
    results: Stream[ChunkResult],
    empty: Stream[DocMeta],
    labeling: Labeling,
    outcomes: Stream[Outcome] | None = None,
) -> Stream[Labeled]:
    """One :class:`Labeled` record per document, from its chunk results (or none at all)
    and, where a cascade reads the documents, its one :class:`Outcome` per document."""
    parts: Stream[Part] = results if outcomes is None else op.merge("parts", results, outcomes)
    keyed = op.key_on("by_record", parts, lambda r: r.doc.unit)
    with_outcome = outcomes is not None
    records = op.stateful(
        "collect", keyed, lambda resume: AssembleLogic(labeling, resume, with_outcome=with_outcome)
    )
    no_chunks = op.map("no_chunks", empty, lambda meta: labeled(meta, [], labeling, _wall_ms()))
    return op.merge("documents", op.key_rm("unkey", records), no_chunks)
