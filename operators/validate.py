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

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.dataflow import Stream, operator
from kascade.operators import inflight
from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, SourcePosition
from kascade.schemas.quarantine import Coordinates
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
        return DeadLetter.of(
            reason,
            detail,
            stage=stage,
            raw=raw,
            key=key,
            source=position,
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
    except (ValueError, RecursionError) as e:
        # JSONDecodeError is a ValueError, and so is an integer of more than 4,300 digits;
        # nesting deeper than the interpreter's stack is a RecursionError.
        return reject(DeadLetterReason.NOT_JSON, f"not JSON: {type(e).__name__}: {e}")
    surrogate = _lone_surrogate(parsed)
    if surrogate is not None:
        return reject(DeadLetterReason.NOT_UTF8, surrogate)
    try:
        return InputDocument.model_validate(parsed)
    except ValidationError as e:
        return reject(DeadLetterReason.SCHEMA, _one_line(e))


def _lone_surrogate(parsed: object) -> str | None:
    """Why ``parsed`` holds text that is not Unicode (``None`` if it has none).

    JSON may escape a lone surrogate (``"\\ud800"``); Python then holds a string that
    no UTF-8 encoder, tokenizer or serializer downstream accepts.

    >>> _lone_surrogate({"text": "ok \U0001f600"}) is None
    True
    >>> _lone_surrogate(json.loads('{"text": "x\\ud800"}'))
    'text holds a lone surrogate (\\\\ud800): not Unicode text'
    """
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        escape = ascii(e.object[e.start : e.end])[1:-1]
        return f"text holds a lone surrogate ({escape}): not Unicode text"
    except (RecursionError, ValueError):
        return "nested too deeply to check"
    return None


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

    def dead_letter(self, reason: DeadLetterReason, detail: str, stage: str) -> DeadLetter:
        """A later stage's rejection of this record, with its original bytes."""
        return DeadLetter.of(
            reason,
            detail,
            stage=stage,
            raw=self.raw,
            key=self.key,
            source=self.position,
            timestamp_ms=self.timestamp_ms,
        )


def failure(e: BaseException) -> str:
    """An exception as a dead letter's detail: its type and message."""
    return f"{type(e).__name__}: {e}"


def check(
    msg: RawMessage,
    *,
    max_bytes: int,
    stage: str,
    condemned: Mapping[Coordinates, str] | None = None,
) -> Received | DeadLetter:
    """One Kafka message as a document or a dead letter; never raises.

    ``condemned`` names records that killed worker processes before (by topic,
    partition, offset, with why): they are dead-lettered unread.
    """
    position = _position(msg)
    ts = _timestamp_ms(msg)
    if condemned and position is not None:
        why = condemned.get((position.topic, position.partition, position.offset))
        if why is not None:
            return DeadLetter.of(
                DeadLetterReason.WORKER_DIED,
                why,
                stage=stage,
                raw=msg.value,
                key=msg.key,
                source=position,
                timestamp_ms=ts,
            )
    try:
        with inflight.inside(position, stage):
            result = decode(
                msg.value,
                key=msg.key,
                position=position,
                max_bytes=max_bytes,
                timestamp_ms=ts,
                stage=stage,
            )
    except Exception as e:  # whatever else a record can do to a parser is data too
        return DeadLetter.of(
            DeadLetterReason.PROCESSING,
            failure(e),
            stage=stage,
            raw=msg.value,
            key=msg.key,
            source=position,
            timestamp_ms=ts,
        )
    if isinstance(result, DeadLetter):
        return result
    assert msg.value is not None  # decode() dead-letters empty values
    return Received(doc=result, position=position, timestamp_ms=ts, raw=msg.value, key=msg.key)


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
    condemned: Mapping[Coordinates, str] | None = None,
) -> ValidateOut:
    """Decode every Kafka message into a :class:`Received` or a :class:`DeadLetter`."""

    checked = op.map(
        "check",
        up,
        functools.partial(check, max_bytes=max_bytes, stage=step_id, condemned=condemned),
    )
    split = op.branch("split", checked, lambda x: isinstance(x, Received))
    return ValidateOut(docs=split.trues, dead=split.falses)  # type: ignore[arg-type]


@operator
def kafka_errors(
    step_id: str, up: Stream[KafkaError[bytes | None, bytes | None]]
) -> Stream[DeadLetter]:
    """Consumer errors as dead letters, keeping the bytes librdkafka handed over."""

    def to_dead_letter(err: KafkaError[bytes | None, bytes | None]) -> DeadLetter:
        msg = err.msg
        return DeadLetter.of(
            DeadLetterReason.KAFKA_ERROR,
            str(err.err),
            stage=step_id,
            raw=msg.value,
            key=msg.key,
            source=_position(msg),
            timestamp_ms=_timestamp_ms(msg),
        )

    return op.map("to_dead_letter", up, to_dead_letter)
