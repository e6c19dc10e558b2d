"""Decode and check input records; what fails becomes a dead-letter record, not a crash.

The pure core is :func:`decode`; :func:`validate` wraps it as a Bytewax operator that
splits a stream of Kafka messages into documents and dead letters.

>>> pos = SourcePosition(topic="t", partition=0, offset=7)
>>> decode(Origin(pos, b'{"id": "d1", "text": "hi"}'), max_bytes=100).doc.id
'd1'
>>> decode(Origin(pos, b'{"id": "d1"}'), max_bytes=100).reason.value
'schema'
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.dataflow import Stream, operator

from kascade.errors import KascadeError
from kascade.operators import inflight
from kascade.operators.formats import Read, Reader, Unreadable
from kascade.operators.items import Envelope, Origin
from kascade.operators.streams import by_class
from kascade.schemas import (
    DeadLetter,
    DeadLetterReason,
    InputDocument,
    SourcePosition,
)
from kascade.schemas.events import InputSettings, RegistrySettings
from kascade.schemas.quarantine import Coordinates

RawMessage = KafkaSourceMessage[bytes | None, bytes | None]


KASCADE_RECORDS = Reader(InputSettings(), RegistrySettings())


def decode(
    origin: Origin,
    *,
    max_bytes: int,
    stage: str = "validate",
    reader: Reader = KASCADE_RECORDS,
) -> Read | DeadLetter:
    """The document in the record ``origin`` (read as ``reader`` says), or a dead letter
    saying exactly why there is none."""
    raw = origin.raw
    if raw is None or raw == b"":
        return origin.dead_letter(DeadLetterReason.EMPTY, "record has no value", stage)
    if len(raw) > max_bytes:
        detail = f"value is {len(raw)} bytes; the limit is {max_bytes}"
        return origin.dead_letter(DeadLetterReason.OVERSIZE, detail, stage)
    try:
        topic = None if origin.position is None else origin.position.topic
        return reader.read(raw, key=origin.key, topic=topic, headers=origin.headers)
    except Unreadable as e:
        return origin.dead_letter(e.reason, e.detail, stage)


def origin_of(msg: RawMessage) -> Origin:
    """The record a Kafka message (or a consumer error's message) carries."""
    return Origin(_position(msg), msg.value, msg.key, list(msg.headers or ()), _timestamp_ms(msg))


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
    """A valid document and the record it came from (whose bytes a later stage's dead
    letter carries); the latency clock starts at its timestamp."""

    doc: InputDocument
    origin: Origin
    event: Any = None  # the decoded input event, kept for enriched output
    schema_id: int | None = None

    @property
    def position(self) -> SourcePosition | None:
        return self.origin.position

    @property
    def timestamp_ms(self) -> int | None:
        return self.origin.timestamp_ms

    @property
    def envelope(self) -> Envelope:
        return Envelope(self.origin.key, self.origin.headers, self.event, self.schema_id)

    def dead_letter(self, reason: DeadLetterReason, detail: str, stage: str) -> DeadLetter:
        """A later stage's rejection of this record, with its original bytes."""
        return self.origin.dead_letter(reason, detail, stage)


def failure(e: BaseException) -> str:
    """An exception as a dead letter's detail: its type and message."""
    return f"{type(e).__name__}: {e}"


def check(
    msg: RawMessage,
    *,
    max_bytes: int,
    stage: str,
    condemned: Mapping[Coordinates, str] | None = None,
    reader: Reader = KASCADE_RECORDS,
) -> Received | DeadLetter:
    """One Kafka message as a document or a dead letter; raises only
    :class:`KascadeError` (a registry unreachable for longer than tolerated).

    ``condemned`` names records that killed worker processes before (by topic,
    partition, offset, with why): they are dead-lettered unread.
    """
    origin = origin_of(msg)
    position = origin.position
    if condemned and position is not None:
        why = condemned.get((position.topic, position.partition, position.offset))
        if why is not None:
            return origin.dead_letter(DeadLetterReason.WORKER_DIED, why, stage)
    try:
        with inflight.inside(position, stage):
            result = decode(origin, max_bytes=max_bytes, stage=stage, reader=reader)
    except KascadeError:
        raise  # not about this record: the job cannot go on as configured
    except Exception as e:  # whatever else a record can do to a parser is data too
        return origin.dead_letter(DeadLetterReason.PROCESSING, failure(e), stage)
    if isinstance(result, DeadLetter):
        return result
    return Received(result.doc, origin, event=result.event, schema_id=result.schema_id)


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
    reader: Reader = KASCADE_RECORDS,
) -> ValidateOut:
    """Decode every Kafka message into a :class:`Received` or a :class:`DeadLetter`."""

    checked = op.map(
        "check",
        up,
        functools.partial(
            check, max_bytes=max_bytes, stage=step_id, condemned=condemned, reader=reader
        ),
    )
    docs, dead = by_class("split", checked, Received)
    return ValidateOut(docs=docs, dead=dead)


@operator
def kafka_errors(
    step_id: str, up: Stream[KafkaError[bytes | None, bytes | None]]
) -> Stream[DeadLetter]:
    """Consumer errors as dead letters, keeping the bytes librdkafka handed over."""

    def to_dead_letter(err: KafkaError[bytes | None, bytes | None]) -> DeadLetter:
        return origin_of(err.msg).dead_letter(DeadLetterReason.KAFKA_ERROR, str(err.err), step_id)

    return op.map("to_dead_letter", up, to_dead_letter)
