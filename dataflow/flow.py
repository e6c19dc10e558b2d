"""Assembles kascade's dataflows from settings: one function from ``Settings`` to ``Dataflow``.

Every flow shares the same edges: Kafka in, decode + validate, and a dead-letter topic
that receives the original bytes and the reason for anything the flow could not handle.
"""

from __future__ import annotations

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError
from bytewax.dataflow import Dataflow, Stream

from dataflow.kafka_io import DeliveryCheckedSink, source
from operators.validate import Received, kafka_errors, validate
from schemas import DeadLetter
from schemas.settings import Settings


def ingest(flow: Dataflow, settings: Settings) -> tuple[Stream[Received], Stream[DeadLetter]]:
    """Kafka input decoded into documents, plus dead letters for what could not be read."""
    raw = op.input("kafka_in", flow, source(settings.kafka, [settings.kafka.input_topic]))
    split = op.branch("kafka_ok", raw, lambda m: not isinstance(m, KafkaError))
    checked = validate("validate", split.trues, max_bytes=settings.max_text_bytes)
    consumer_errors = kafka_errors("kafka_errors", split.falses)  # type: ignore[arg-type]
    return checked.docs, op.merge("dead", checked.dead, consumer_errors)


def dead_letter_output(dead: Stream[DeadLetter], settings: Settings) -> None:
    """Write dead letters to their topic, keyed like the original record."""

    def serialize(d: DeadLetter) -> tuple[bytes | None, bytes]:
        return d.original_key(), d.model_dump_json().encode()

    op.output(
        "dead_letter_out",
        op.map("dead_letter_serialize", dead, serialize),
        DeliveryCheckedSink(settings.kafka, settings.kafka.dead_letter_topic),
    )


def build_passthrough_flow(settings: Settings) -> Dataflow:
    """Kafka -> validate -> Kafka: every valid document re-emitted, normalized, by id.

    The foundation the classifying flow builds on; it proves the edges (bounded start,
    dead letters, delivery-checked output) on their own.
    """
    flow = Dataflow("kascade_passthrough")
    docs, dead = ingest(flow, settings)
    out = op.map(
        "serialize",
        docs,
        lambda r: (r.doc.id.encode(), r.doc.model_dump_json(exclude_none=True).encode()),
    )
    op.output("kafka_out", out, DeliveryCheckedSink(settings.kafka, settings.kafka.output_topic))
    dead_letter_output(dead, settings)
    return flow
