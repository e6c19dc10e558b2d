"""Decode and check input records; what fails becomes a dead-letter record, not a crash.

The pure core is :func:`decode`; :func:`validate` wraps it as a Bytewax operator that
splits a stream of Kafka messages into documents and dead letters.

>>> pos = SourcePosition(topic="t", partition=0, offset=7)
>>> decode(b'{"id": "d1", "text": "hi"}', key=None, position=pos, max_bytes=100).doc.id
'd1'
>>> decode(b'{"id": "d1"}', key=None, position=pos, max_bytes=100).reason.value
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
from kascade.operators.items import Envelope
from kascade.operators.streams import by_class
from kascade.schemas import (
    DeadLetter,
    DeadLetterReason,
    InputDocument,
    KafkaHeaders,
    SourcePosition,
)
from kascade.schemas.events import InputSettings, RegistrySettings
from kascade.schemas.quarantine import Coordinates

RawMessage = KafkaSourceMessage[bytes | None, bytes | None]


KASCADE_RECORDS = Reader(InputSettings(), RegistrySettings())


def decode(
    raw: bytes | None,
    *,
    key: bytes | None,
    position: SourcePosition | None,
    max_bytes: int,
    timestamp_ms: int | None = None,
    stage: str = "validate",
    reader: Reader = KASCADE_RECORDS,
    headers: KafkaHeaders = (),
) -> Read | DeadLetter:
    """The document in ``raw`` (read as ``reader`` says), or a dead letter saying
    exactly why there is none."""

    def reject(reason: DeadLetterReason, detail: str) -> DeadLetter:
        return DeadLetter.of(
            reason,
            detail,
            stage=stage,
            raw=raw,
            key=key,
            source=position,
            timestamp_ms=timestamp_ms,
            headers=headers,
        )

    if raw is None or raw == b"":
        return reject(DeadLetterReason.EMPTY, "record has no value")
    if len(raw) > max_bytes:
        return reject(
            DeadLetterReason.OVERSIZE, f"value is {len(raw)} bytes; the limit is {max_bytes}"
        )
    try:
        return reader.read(
            raw, key=key, topic=None if position is None else position.topic, headers=headers
        )
    except Unreadable as e:
        return reject(e.reason, e.detail)


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
    headers: KafkaHeaders = ()
    event: Any = None  # the decoded input event, kept for enriched output
    schema_id: int | None = None

    @property
    def envelope(self) -> Envelope:
        return Envelope(self.key, self.headers, self.event, self.schema_id)

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
            headers=self.headers,
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
    reader: Reader = KASCADE_RECORDS,
) -> Received | DeadLetter:
    """One Kafka message as a document or a dead letter; raises only
    :class:`KascadeError` (a registry unreachable for longer than tolerated).

    ``condemned`` names records that killed worker processes before (by topic,
    partition, offset, with why): they are dead-lettered unread.
    """
    position = _position(msg)
    ts = _timestamp_ms(msg)
    headers = list(msg.headers or ())

    def reject(reason: DeadLetterReason, detail: str) -> DeadLetter:
        return DeadLetter.of(
            reason,
            detail,
            stage=stage,
            raw=msg.value,
            key=msg.key,
            source=position,
            timestamp_ms=ts,
            headers=headers,
        )

    if condemned and position is not None:
        why = condemned.get((position.topic, position.partition, position.offset))
        if why is not None:
            return reject(DeadLetterReason.WORKER_DIED, why)
    try:
        with inflight.inside(position, stage):
            result = decode(
                msg.value,
                key=msg.key,
                position=position,
                max_bytes=max_bytes,
                timestamp_ms=ts,
                stage=stage,
                reader=reader,
                headers=headers,
            )
    except KascadeError:
        raise  # not about this record: the job cannot go on as configured
    except Exception as e:  # whatever else a record can do to a parser is data too
        return reject(DeadLetterReason.PROCESSING, failure(e))
    if isinstance(result, DeadLetter):
        return result
    assert msg.value is not None  # decode() dead-letters empty values
    return Received(
        doc=result.doc,
        position=position,
        timestamp_ms=ts,
        raw=msg.value,
        key=msg.key,
        headers=headers,
        event=result.event,
        schema_id=result.schema_id,
    )


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
        msg = err.msg
        return DeadLetter.of(
            DeadLetterReason.KAFKA_ERROR,
            str(err.err),
            stage=step_id,
            raw=msg.value,
            key=msg.key,
            source=_position(msg),
            timestamp_ms=_timestamp_ms(msg),
            headers=list(msg.headers or ()),
        )

    return op.map("to_dead_letter", up, to_dead_letter)
