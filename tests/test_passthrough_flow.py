"""Kafka -> decode + validate -> Kafka, end to end through the real broker.

Every valid document arrives exactly once; every invalid record lands on the
dead-letter topic with its reason and its original bytes. Runs on one worker and on a
two-worker cluster.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from bytewax.testing import cluster_main, run_main
from confluent_kafka import Producer

from dataflow.consume import read_all
from dataflow.flow import build_passthrough_flow
from schemas import DeadLetter, InputDocument
from schemas.settings import KafkaSettings, Settings

pytestmark = pytest.mark.kafka

MAX_BYTES = 2_000


def _run_single(flow) -> None:
    run_main(flow)


def _run_two_workers(flow) -> None:
    cluster_main(flow, addresses=[], proc_id=0, worker_count_per_proc=2)


@pytest.fixture(params=[_run_single, _run_two_workers], ids=["one_worker", "two_workers"])
def entry_point(request):
    return request.param


def _produce(settings: KafkaSettings, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": settings.brokers})
    for key, value in records:
        producer.produce(settings.input_topic, key=key, value=value)
    assert producer.flush(30) == 0


def test_valid_documents_pass_exactly_once_and_bad_records_are_dead_lettered(
    kafka_settings: KafkaSettings, entry_point
) -> None:
    valid = [
        InputDocument(id=f"doc-{i}", text=f"text number {i} " * (i % 7), lang="en")
        for i in range(40)
    ]
    invalid = {
        b"not json at all": "not_json",
        b'{"id": "x", "text": "caf\xe9"}': "not_utf8",
        b'{"id": "x"}': "schema",
        b'{"id": "x", "text": 5}': "schema",
        json.dumps({"id": "big", "text": "a" * MAX_BYTES}).encode(): "oversize",
        b"": "empty",
    }
    records = [(d.id.encode(), d.model_dump_json().encode()) for d in valid]
    records += [(b"bad", raw) for raw in invalid]
    _produce(kafka_settings, records)

    entry_point(build_passthrough_flow(Settings(kafka=kafka_settings, max_text_bytes=MAX_BYTES)))

    out = read_all(kafka_settings, kafka_settings.output_topic)
    ids = Counter(json.loads(v)["id"] for _, v in out)
    assert ids == Counter(d.id for d in valid)
    assert all(k == json.loads(v)["id"].encode() for k, v in out)
    assert {InputDocument.model_validate_json(v) for _, v in out} == set(valid)

    dead = [
        DeadLetter.model_validate_json(v)
        for _, v in read_all(kafka_settings, kafka_settings.dead_letter_topic)
    ]
    assert {d.original(): d.reason.value for d in dead} == invalid
    assert len(dead) == len(invalid)
    assert all(d.source is not None and d.source.topic == kafka_settings.input_topic for d in dead)
    assert all(d.original_key() == b"bad" for d in dead)
