"""Per-document reduce: named strategies, and a state machine that counts each chunk once."""

from __future__ import annotations

import numpy as np
import pytest

from kascade.operators.items import ChunkResult, DocMeta
from kascade.operators.reduce import (
    AssembleLogic,
    ChunkVerdict,
    Labeling,
    aggregate,
    label_document,
)
from kascade.schemas import Aggregation, ModelIdentity

LABELS = ["a", "b", "c"]
LABELING = Labeling(
    LABELS,
    Aggregation.TOKEN_MEAN,
    ModelIdentity(name="m", variant="fp32", manifest_sha256="0" * 64),
)


def v(i: int, n: int, *p: float) -> ChunkVerdict:
    return ChunkVerdict(i, n, np.array(p))


def test_token_mean_is_the_weighted_average() -> None:
    doc = aggregate(
        [v(0, 3, 0.6, 0.4, 0.0), v(1, 1, 0.0, 0.2, 0.8)], Aggregation.TOKEN_MEAN, LABELS
    )
    assert doc.scores == pytest.approx({"a": 0.45, "b": 0.35, "c": 0.2})
    assert (doc.label, doc.score) == ("a", pytest.approx(0.45))


def test_max_takes_the_label_of_the_most_confident_chunk() -> None:
    doc = aggregate([v(0, 500, 0.6, 0.4, 0.0), v(1, 10, 0.0, 0.05, 0.95)], Aggregation.MAX, LABELS)
    assert doc.label == "c"
    assert sum(doc.scores.values()) == pytest.approx(1.0)


def test_majority_counts_votes_and_breaks_ties_by_token_mean() -> None:
    chunks = [
        v(0, 10, 0.9, 0.1, 0),
        v(1, 10, 0.1, 0.9, 0),
        v(2, 50, 0.2, 0.8, 0),
        v(3, 10, 0.7, 0.3, 0),
    ]
    doc = aggregate(chunks, Aggregation.MAJORITY, LABELS)
    assert doc.scores == {"a": 0.5, "b": 0.5, "c": 0.0}
    assert doc.label == "b"  # tie 2-2; b has the higher token-weighted mean


def test_no_usable_verdict_gives_no_label() -> None:
    doc = aggregate([ChunkVerdict(0, 10, None)], Aggregation.TOKEN_MEAN, LABELS)
    assert (doc.label, doc.score, doc.scores) == (None, 0.0, {})


META = DocMeta(id="d", total_chunks=3, lang="en", metadata={"k": 1}, timestamp_ms=1_000)


def r(i: int, probs=(0.2, 0.7, 0.1), error: str | None = None) -> ChunkResult:
    return ChunkResult(META, i, 10, None if error else np.array(probs), stage="full", error=error)


def test_the_record_is_emitted_once_every_chunk_is_in_and_state_is_discarded() -> None:
    logic = AssembleLogic(LABELING, now_ms=lambda: 1_250)
    assert logic.on_item(r(0)) == ([], AssembleLogic.RETAIN)
    assert logic.on_item(r(1)) == ([], AssembleLogic.RETAIN)
    out, discard = logic.on_item(r(2))
    assert discard is AssembleLogic.DISCARD
    ((record, envelope),) = [(o.record, o.envelope) for o in out]
    assert (record.id, record.label, record.latency_ms, envelope) == ("d", "b", 250.0, None)
    assert record.chunks.total == 3 and record.chunks.full_model == 3
    assert record.metadata == {"k": 1} and record.lang == "en"


def test_a_replayed_chunk_is_not_counted_twice() -> None:
    logic = AssembleLogic(LABELING)
    logic.on_item(r(0))
    assert logic.on_item(r(0)) == ([], AssembleLogic.RETAIN)
    assert logic.on_item(r(1))[0] == []
    assert len(logic.on_item(r(2))[0]) == 1


def test_state_survives_a_snapshot_and_restore() -> None:
    logic = AssembleLogic(LABELING)
    logic.on_item(r(0))
    logic.on_item(r(1))
    snapshot = logic.snapshot()
    logic.on_item(r(0, probs=(1.0, 0.0, 0.0)))  # later changes do not leak into the snapshot
    assert snapshot.results[0].probs[1] == pytest.approx(0.7)
    resumed = AssembleLogic(LABELING, snapshot)
    out, _ = resumed.on_item(r(2))
    assert len(out) == 1 and out[0].record.chunks.total == 3


def test_one_failed_chunk_marks_the_document_degraded_but_keeps_the_label() -> None:
    record = label_document(
        META, [r(0), r(1, error="full model failed: boom"), r(2)], LABELING, 2_000
    )
    assert record.degraded and record.reasons == ["full model failed: boom"]
    assert record.label == "b" and record.chunks.failed == 1 and record.chunks.full_model == 2


def test_a_document_whose_chunks_all_failed_has_no_label_and_says_why() -> None:
    record = label_document(META, [r(i, error="x") for i in range(3)], LABELING, 2_000)
    assert record.label is None and record.degraded and record.chunks.failed == 3
