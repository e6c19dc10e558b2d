"""Every input record is its own unit of work, through the real broker: records that share
an ``id`` (an update, a re-send, two producers) each get their own result, computed from
their own text, whether they arrive back to back or interleaved, short or long, with
the cascade on or off, with the certified stop, with turns or without, on one worker or
two."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from bytewax.testing import cluster_main, run_main
from helpers import SMALL_CHUNKS, produce
from test_flow import expected_record
from tiny_models import CORPUS

from kascade.dataflow.consume import read_all
from kascade.dataflow.flow import build_flow
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import load_model_dir
from kascade.schemas import DeadLetter, InputDocument, OutputRecord, StopReason
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import Settings

pytestmark = pytest.mark.kafka

SPORTS, POLITICS, TRAVEL = CORPUS[0], CORPUS[2], CORPUS[10]


def same_id_records() -> list[InputDocument]:
    """Records sharing ids in every arrangement: same and different texts, back to back
    and interleaved, short and long (up to ~12 chunks of SMALL_CHUNKS)."""
    long_sports = " ".join([SPORTS] * 60)
    long_politics = " ".join([POLITICS] * 80)
    return [
        InputDocument(id="dup", text=long_sports),  # different texts, back to back
        InputDocument(id="dup", text=long_politics),
        InputDocument(id="other", text=TRAVEL),
        InputDocument(id="same", text=long_politics),  # the same text, back to back
        InputDocument(id="same", text=long_politics),
        InputDocument(id="mix", text=long_politics),  # interleaved with others
        InputDocument(id="x", text=SPORTS),
        InputDocument(id="mix", text=SPORTS),
        InputDocument(id="y", text=long_sports),
        InputDocument(id="mix", text=long_sports),
        InputDocument(id="dup", text=TRAVEL),
        InputDocument(id="mix", text=" ".join([TRAVEL] * 40)),
    ]


def _one_worker(flow) -> None:
    run_main(flow)


def _two_workers(flow) -> None:
    cluster_main(flow, addresses=[], proc_id=0, worker_count_per_proc=2)


def check_one_result_per_record(
    k: KafkaSettings, model: Path, docs: list[InputDocument]
) -> list[OutputRecord]:
    """Every record has exactly one output (none dead-lettered), made of its own chunks."""
    out = [OutputRecord.model_validate_json(v) for _, v in read_all(k, k.output_topic)]
    dead = [DeadLetter.model_validate_json(v) for _, v in read_all(k, k.dead_letter_topic)]
    assert dead == []
    # One input partition, written in order: offset i is docs[i].
    by_offset = {r.source.offset: r for r in out if r.source is not None}
    assert len(out) == len(by_offset) == len(docs)
    tokenizer = load_model_dir(model).tokenizer
    for offset, doc in enumerate(docs):
        record = by_offset[offset]
        chunks = chunk_text(doc.text, tokenizer, **SMALL_CHUNKS.model_dump())
        assert record.id == doc.id
        reading = record.reading
        assert reading is not None and reading.chars_total == len(doc.text), (offset, doc.id)
        if reading.stopped is StopReason.END:
            assert record.chunks.total == len(chunks), (offset, doc.id)
            assert reading.tokens_total == chunks[0].text_tokens
        else:  # its own text's chunks, as far as the stop read
            assert reading.tokens_read == chunks[reading.chunks_read - 1].end_token
            assert reading.chars_read == chunks[reading.chunks_read - 1].end_char
        assert record.label is not None and not record.degraded
    return [by_offset[i] for i in range(len(docs))]


RUNS: dict[str, tuple[str, dict, Callable]] = {
    "full_model_one_worker": ("bert", {"mode": "off"}, _one_worker),
    "full_model_two_workers": ("bert", {"mode": "off"}, _two_workers),
    "cascade_turns_two_workers": (
        "calibrated",
        {"mode": "on", "audit_fraction": 0.5},
        _two_workers,
    ),
    "cascade_all_at_once_one_worker": (
        "calibrated",
        {"mode": "on", "chunks_per_turn": 0, "audit_fraction": 0.5},
        _one_worker,
    ),
    "certified_stop_two_workers": (
        "stopping",
        {"mode": "on", "reading": "certified", "audit_fraction": 0.0},
        _two_workers,
    ),
    "certified_stop_all_at_once_one_worker": (
        "stopping",
        {"mode": "on", "reading": "certified", "chunks_per_turn": 0},
        _one_worker,
    ),
}


@pytest.mark.parametrize("run", list(RUNS), ids=list(RUNS))
def test_records_sharing_an_id_each_get_one_result_from_their_own_text(
    run: str, topic_factory, kafka_settings: KafkaSettings, request: pytest.FixtureRequest
) -> None:
    model_name, cascade, entry_point = RUNS[run]
    model = (
        request.getfixturevalue("exported")["bert"]
        if model_name == "bert"
        else request.getfixturevalue(model_name)
    )
    k = kafka_settings.model_copy(update={"input_topic": topic_factory("in", partitions=1)})
    docs = same_id_records()
    produce(k, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    settings = Settings(kafka=k, model_dir=model, chunking=SMALL_CHUNKS, cascade=cascade)
    entry_point(build_flow(settings))
    records = check_one_result_per_record(k, model, docs)
    if cascade["mode"] == "off":
        # The full model's own answer for each record's own text, computed directly.
        for doc, record in zip(docs, records, strict=True):
            label, _ = expected_record(model, doc, SMALL_CHUNKS.model_dump())
            assert record.label == label, doc.id
