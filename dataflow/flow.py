"""Assembles kascade's dataflows from settings: one function from ``Settings`` to ``Dataflow``.

Every flow shares the same edges: Kafka in, decode + validate, and a dead-letter topic
that receives the original bytes and the reason for anything the flow could not handle.
"""

from __future__ import annotations

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError
from bytewax.dataflow import Dataflow, Stream

from dataflow.kafka_io import DeliveryCheckedSink, source
from operators import metrics
from operators.cascade import cascade
from operators.chunking import chunk
from operators.encoder import Loaded, load_model_dir
from operators.full_model import classify
from operators.items import ChunkResult
from operators.reduce import Labeling, assemble
from operators.validate import Received, kafka_errors, validate
from schemas import DeadLetter, ModelIdentity, OutputRecord
from schemas.cascade import CASCADE_FILE
from schemas.manifest import TOKENIZER
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
        metrics.DEAD_LETTERS.labels(d.reason.value).inc()
        return d.original_key(), d.model_dump_json().encode()

    op.output(
        "dead_letter_out",
        op.map("dead_letter_serialize", dead, serialize),
        DeliveryCheckedSink(settings.kafka, settings.kafka.dead_letter_topic),
    )


def model_identity(model: Loaded) -> ModelIdentity:
    m = model.manifest
    return ModelIdentity(name=m.source, variant=m.variant, manifest_sha256=model.manifest_sha256)


def _serialize_output(record: OutputRecord) -> tuple[bytes, bytes]:
    metrics.DOCS_OUT.labels(str(record.degraded).lower()).inc()
    metrics.DOC_LATENCY.observe(record.latency_ms / 1000)
    return record.id.encode(), record.model_dump_json().encode()


def use_cascade(settings: Settings, model: Loaded) -> bool:
    """Whether the flow runs the cheap stages (``cascade.mode`` and ``cascade.json``)."""
    present = (model.directory / CASCADE_FILE).is_file()
    if settings.cascade.mode == "on" and not present:
        raise ValueError(f"cascade mode is on but {model.directory} has no {CASCADE_FILE}")
    return settings.cascade.mode == "on" or (settings.cascade.mode == "auto" and present)


def _record_audit(_step: str, result: ChunkResult) -> None:
    if result.probs is not None:
        agree = int(result.probs.argmax()) == result.audit_of
        metrics.AUDITS.labels(str(agree).lower()).inc()


def build_flow(settings: Settings, model: Loaded | None = None) -> Dataflow:
    """The classifying flow: Kafka -> chunks -> full model on any worker -> per-document
    label -> Kafka, with dead letters for what cannot be read or is too long.

    ``model`` defaults to ``settings.model_dir``, verified against its manifest.
    """
    if model is None:
        if settings.model_dir is None:
            raise ValueError("settings.model_dir is required to classify")
        model = load_model_dir(settings.model_dir)
    if settings.chunking.max_tokens > model.manifest.max_length:
        raise ValueError(
            f"chunk size {settings.chunking.max_tokens} exceeds the model's maximum length"
            f" {model.manifest.max_length}"
        )
    labeling = Labeling(
        labels=model.manifest.labels,
        aggregation=settings.aggregation,
        model=model_identity(model),
    )
    flow = Dataflow("kascade")
    docs, dead = ingest(flow, settings)
    chunked = chunk("chunk", docs, model.directory / TOKENIZER, settings.chunking)
    if use_cascade(settings, model):
        cheap = cascade(
            "cascade",
            chunked.chunks,
            model.directory,
            settings.cascade,
            settings.encoder.threads,
            settings.aggregation,
        )
        # Chunks of one document may run on different workers: the full model is the cost.
        spread = op.redistribute("spread", cheap.escalations)
        full = classify("classify", spread, model.directory, settings.encoder, graphs="stages")
        audits = op.branch("is_audit", full, lambda r: r.audit_of is not None)
        op.inspect("audit_agreement", audits.trues, _record_audit)
        results = op.merge("results", cheap.settled, audits.falses)
    else:
        spread = op.redistribute("spread", chunked.chunks)
        results = classify("classify", spread, model.directory, settings.encoder)
    records = assemble("assemble", results, chunked.empty, labeling)
    op.output(
        "kafka_out",
        op.map("serialize", records, _serialize_output),
        DeliveryCheckedSink(settings.kafka, settings.kafka.output_topic),
    )
    dead_letter_output(op.merge("all_dead", dead, chunked.dead), settings)
    return flow
