"""Events shaped by someone else, end to end through the real broker and a real Schema
Registry (Apicurio Registry's Confluent-compatible API): Avro in and enriched Avro out,
JSON Schema in, plain text in, JSON events enriched, headers carried everywhere, and
records that do not fit their schema or mapping dead-lettered with their bytes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from bytewax.testing import run_main
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from helpers import documents, kascade_cli

from kascade.dataflow.consume import read_records
from kascade.dataflow.flow import build_flow
from kascade.dataflow.ports import free_port
from kascade.operators.items import Outgoing
from kascade.schemas import DeadLetter, Enrichment, OutputRecord
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import Settings

pytestmark = pytest.mark.kafka

CHUNKING = {"max_tokens": 64, "overlap": 8, "max_chunks": 20}
TRACE = ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
TICKET = {
    "type": "record",
    "name": "Ticket",
    "namespace": "com.acme.support",
    "fields": [
        {"name": "ticket_id", "type": "string"},
        {"name": "subject", "type": "string"},
        {"name": "body", "type": "string"},
        {"name": "priority", "type": "int"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
MESSAGE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "ChatMessage",
    "type": "object",
    "properties": {"room": {"type": "string"}, "body": {"type": "string"}},
    "required": ["room", "body"],
}


def _produce(brokers: str, topic: str, records: list[Outgoing]) -> None:
    producer = Producer({"bootstrap.servers": brokers})
    for r in records:
        producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers) or None)
    assert producer.flush(30) == 0


def _run(kafka: KafkaSettings, model_dir: Path, **formats: dict) -> None:
    """The flow over ``kafka``'s topics to their end, with ``formats`` (input, output,
    registry sections) on top of the tests' model and chunking."""
    settings = Settings(kafka=kafka, model_dir=model_dir, chunking=CHUNKING, **formats)
    run_main(build_flow(settings))


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def _dead(k: KafkaSettings, expect: int) -> list[tuple[DeadLetter, Outgoing]]:
    got = read_records(k, k.dead_letter_topic, expect=expect, timeout_s=10)
    return [(DeadLetter.model_validate_json(r.value), r) for r in got]


def test_avro_events_become_enriched_avro_events_keyed_and_headed_like_their_input(
    kafka_settings: KafkaSettings, schema_registry_url: str, exported: dict[str, Path]
) -> None:
    registry = SchemaRegistryClient({"url": schema_registry_url})
    ser = AvroSerializer(registry, json.dumps(TICKET))
    docs = documents(12)
    events = {
        f"T-{i}": {
            "ticket_id": f"T-{i}",
            "subject": f"Ticket {i}",
            "body": d.text,
            "priority": i % 3,
            "tags": ["web"],
        }
        for i, d in enumerate(docs)
    }
    ctx = _ctx(kafka_settings.input_topic)
    good = [
        Outgoing(f"key-{t}".encode(), ser(e, ctx), [TRACE, ("n", t.encode())])
        for t, e in events.items()
    ]
    framed = ser(events["T-0"], ctx)
    bad = [
        Outgoing(b"bad-1", b'{"ticket_id": "plain json"}', [TRACE]),  # not the wire format
        Outgoing(b"bad-2", framed[:5] + b"\x02", [TRACE]),  # bytes the schema cannot read
    ]
    _produce(kafka_settings.brokers, kafka_settings.input_topic, good + bad)

    _run(
        kafka_settings,
        exported["bert"],
        input={"format": "avro", "text": ["subject", "body"], "id": "ticket_id"},
        output={"shape": "enriched", "format": "avro"},
        registry={"url": schema_registry_url},
    )

    out = read_records(kafka_settings, kafka_settings.output_topic, expect=len(good))
    assert len(out) == len(good)
    read = AvroDeserializer(registry)
    octx = _ctx(kafka_settings.output_topic)
    labels = set(json.loads((exported["bert"] / "manifest.json").read_text())["labels"])
    for r in out:
        value = read(r.value, octx)
        enrichment = Enrichment.model_validate(value.pop("kascade"))
        assert value == events[value["ticket_id"]]  # the event itself is untouched
        assert enrichment.label in labels and enrichment.chunks.total >= 1
        assert r.key == f"key-{value['ticket_id']}".encode()
        headers = dict(r.headers)
        assert headers["traceparent"] == TRACE[1] and headers["n"] == value["ticket_id"].encode()
        assert headers["kascade-label"] == enrichment.label.encode()
        assert headers["kascade-model"].startswith(enrichment.model.name.encode())
    subject = registry.get_latest_version(f"{kafka_settings.output_topic}-value")
    fields = [f["name"] for f in json.loads(subject.schema.schema_str)["fields"]]
    assert fields == ["ticket_id", "subject", "body", "priority", "tags", "kascade"]

    dead = _dead(kafka_settings, expect=2)
    assert sorted((d.reason.value, r.key) for d, r in dead) == [
        ("not_decodable", b"bad-1"),
        ("not_decodable", b"bad-2"),
    ]
    for d, r in dead:
        assert d.original() in {b.value for b in bad}
        assert d.original_headers() == [TRACE]
        assert d.source is not None
        assert dict(r.headers) == {
            "traceparent": TRACE[1],
            "kascade-reason": b"not_decodable",
            "kascade-origin": d.source.key.encode(),
        }


def test_json_schema_events_are_read_and_a_record_breaking_its_schema_is_dead_lettered(
    kafka_settings: KafkaSettings, schema_registry_url: str, exported: dict[str, Path]
) -> None:
    registry = SchemaRegistryClient({"url": schema_registry_url})
    ser = JSONSerializer(json.dumps(MESSAGE), registry)
    ctx = _ctx(kafka_settings.input_topic)
    docs = documents(6)
    good = [
        Outgoing(d.id.encode(), ser({"room": "r1", "body": d.text}, ctx), [TRACE]) for d in docs
    ]
    # A producer that frames a value its schema forbids (no "body"): the serializer
    # would refuse it, so it is written by hand after a valid record's 5-byte header.
    breaking = Outgoing(b"breaks", good[0].value[:5] + b'{"room": "r1"}', [TRACE])
    _produce(kafka_settings.brokers, kafka_settings.input_topic, [*good, breaking])

    _run(
        kafka_settings,
        exported["bert"],
        input={"format": "json_schema", "text": ["body"], "id": "@key", "metadata": ["room"]},
        output={"format": "json_schema"},
        registry={"url": schema_registry_url},
    )

    out = read_records(kafka_settings, kafka_settings.output_topic, expect=len(good))
    read = JSONDeserializer(None, schema_registry_client=registry)
    records = [
        OutputRecord.model_validate(read(r.value, _ctx(kafka_settings.output_topic))) for r in out
    ]
    assert sorted(r.id for r in records) == sorted(d.id for d in docs)
    assert all(r.metadata == {"room": "r1"} for r in records)
    assert all(dict(r.headers)["traceparent"] == TRACE[1] for r in out)
    ((dead, _),) = _dead(kafka_settings, expect=1)
    assert dead.reason.value == "schema" and "'body' is a required property" in dead.detail
    assert dead.original() == breaking.value and dead.original_key() == b"breaks"


def test_plain_text_values_are_classified_with_their_key_as_id(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(5)
    records = [Outgoing(d.id.encode(), d.text.encode(), [TRACE]) for d in docs]
    records.append(Outgoing(None, b"a message without a key", [TRACE]))
    _produce(kafka_settings.brokers, kafka_settings.input_topic, records)

    _run(
        kafka_settings,
        exported["bert"],
        input={"format": "text"},
    )

    out = read_records(kafka_settings, kafka_settings.output_topic, expect=len(docs))
    assert sorted(OutputRecord.model_validate_json(r.value).id for r in out) == sorted(
        d.id for d in docs
    )
    assert sorted(r.key for r in out) == sorted(d.id.encode() for d in docs)
    ((dead, _),) = _dead(kafka_settings, expect=1)
    assert dead.reason.value == "schema"
    assert dead.detail == "input field key: the record has no Kafka key to be its id"


def test_json_events_are_enriched_under_the_configured_field(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(4)
    events = [
        {"news": {"id": d.id, "title": "T", "paragraphs": [d.text, "End."]}, "source": "wire"}
        for d in docs
    ]
    records = [Outgoing(None, json.dumps(e).encode(), [TRACE]) for e in events]
    records.append(Outgoing(None, b'{"news": {"id": "no-title"}}', [TRACE]))
    _produce(kafka_settings.brokers, kafka_settings.input_topic, records)

    _run(
        kafka_settings,
        exported["bert"],
        input={"format": "json", "text": ["news.title", "news.paragraphs"], "id": "news.id"},
        output={"shape": "enriched", "field": "topic"},
    )

    out = read_records(kafka_settings, kafka_settings.output_topic, expect=len(docs))
    values = [json.loads(r.value) for r in out]
    by_id = {v["news"]["id"]: v for v in values}
    assert set(by_id) == {d.id for d in docs}
    for e in events:
        v = by_id[e["news"]["id"]]
        assert Enrichment.model_validate(v.pop("topic")).chunks.total >= 1
        assert v == e
    assert all(r.key is None for r in out)  # keyed like the input, which had no key
    ((dead, raw),) = _dead(kafka_settings, expect=1)
    assert dead.detail == "input field news.title: missing"
    assert dict(raw.headers)["traceparent"] == TRACE[1]


def test_an_unreachable_registry_fails_the_start_with_one_line(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    k = kafka_settings
    start = time.monotonic()
    r = kascade_cli(
        "run",
        "--bounded",
        "--model-dir",
        str(exported["bert"]),
        "--brokers",
        k.brokers,
        "--kafka.input-topic",
        k.input_topic,
        "--kafka.output-topic",
        k.output_topic,
        "--kafka.dead-letter-topic",
        k.dead_letter_topic,
        "--input.format",
        "avro",
        "--input.text",
        "body",
        "--registry.url",
        f"http://127.0.0.1:{free_port()}",
        "--registry.timeout-s",
        "2",
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - start < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kascade: cannot use the Schema Registry at http://127.0.0.1:")
