"""Decode and check input records; what fails becomes a dead-letter record, not a crash.

The pure core is :func:`decode`; :func:`validate` wraps it as a Bytewax operator that
splits a stream of Kafka messages into documents and dead letters.

>>> pos = SourcePosition(topic="t", partition=0, offset=7)
>>> decode(b'{"id": "d1", "text": "hi"}', key=None, position=pos, max_bytes=100).id
'd1'
>>> decode(b'{"id": "d1"}', key=None, position=pos, max_bytes=100).reason.value
'schema'
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.dataflow import Stream, operator
from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, SourcePosition
from pydantic import ValidationError

RawMessage = KafkaSourceMessage[bytes | None, bytes | None]


def decode(
    raw: bytes | None,
    *,
    key: bytes | None,
    position: SourcePosition | None,
    max_bytes: int,
    timestamp_ms: int | None = None,
    stage: str = "validate",
) -> InputDocument | DeadLetter:
    """A validated document, or a dead letter saying exactly why ``raw`` is not one."""

    def reject(reason: DeadLetterReason, detail: str) -> DeadLetter:
        return DeadLetter(
            reason=reason,
            detail=detail,
            stage=stage,
            source=position,
            key_b64=None if key is None else DeadLetter.encode(key),
            original_b64=DeadLetter.encode(raw),
            timestamp_ms=timestamp_ms,
        )

    if raw is None or raw == b"":
        return reject(DeadLetterReason.EMPTY, "record has no value")
    if len(raw) > max_bytes:
        return reject(
            DeadLetterReason.OVERSIZE, f"value is {len(raw)} bytes; the limit is {max_bytes}"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return reject(DeadLetterReason.NOT_UTF8, f"not UTF-8: {e}")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        return reject(DeadLetterReason.NOT_JSON, f"not JSON: {e}")
    try:
        return InputDocument.model_validate(parsed)
    except ValidationError as e:
        return reject(DeadLetterReason.SCHEMA, _one_line(e))


def _one_line(e: ValidationError) -> str:
    parts = []
    for err in e.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _position(msg: RawMessage) -> SourcePosition | None:
    if msg.topic is None or msg.partition is None or msg.offset is None or msg.offset < 0:
        return None
    return SourcePosition(topic=msg.topic, partition=msg.partition, offset=msg.offset)


def _timestamp_ms(msg: RawMessage) -> int | None:
    # confluent-kafka gives (type, ms); type 0 means the broker had no timestamp.
    if msg.timestamp is None or msg.timestamp[0] == 0:
        return None
    return msg.timestamp[1]


@dataclass(frozen=True)
class Received:
    """A valid document and where it came from; the latency clock starts at ``timestamp_ms``."""

    doc: InputDocument
    position: SourcePosition | None
    timestamp_ms: int | None
    raw: bytes  # the original value, for a dead letter if a later stage rejects it
    key: bytes | None = None


@dataclass(frozen=True)
class ValidateOut:
    """Documents that passed, and dead letters for everything that did not."""

    docs: Stream[Received]
    dead: Stream[DeadLetter]


@operator
def validate(
    step_id: str,
    up: Stream[RawMessage],
    max_bytes: int,
) -> ValidateOut:
    """Decode every Kafka message into a :class:`Received` or a :class:`DeadLetter`."""

    def check(msg: RawMessage) -> Received | DeadLetter:
        position = _position(msg)
        ts = _timestamp_ms(msg)
        result = decode(
            msg.value,
            key=msg.key,
            position=position,
            max_bytes=max_bytes,
            timestamp_ms=ts,
            stage=step_id,
        )
        if isinstance(result, DeadLetter):
            return result
        assert msg.value is not None  # decode() dead-letters empty values
        return Received(doc=result, position=position, timestamp_ms=ts, raw=msg.value, key=msg.key)

    checked = op.map("check", up, check)
    split = op.branch("split", checked, lambda x: isinstance(x, Received))
    return ValidateOut(docs=split.trues, dead=split.falses)  # type: ignore[arg-type]


@operator
def kafka_errors(
    step_id: str, up: Stream[KafkaError[bytes | None, bytes | None]]
) -> Stream[DeadLetter]:
    """Consumer errors as dead letters, keeping the bytes librdkafka handed over."""

    def to_dead_letter(err: KafkaError[bytes | None, bytes | None]) -> DeadLetter:
        msg = err.msg
        return DeadLetter(
            reason=DeadLetterReason.KAFKA_ERROR,
            detail=str(err.err),
            stage=step_id,
            source=_position(msg),
            key_b64=None if msg.key is None else DeadLetter.encode(msg.key),
            original_b64=DeadLetter.encode(msg.value),
            timestamp_ms=_timestamp_ms(msg),
        )

    return op.map("to_dead_letter", up, to_dead_letter)
