"""A record kascade could not handle, as it goes to the dead-letter topic: the reason, the
stage that refused it and the original bytes, key and headers, so it can be replayed.

>>> d = DeadLetter.of(DeadLetterReason.NOT_UTF8, "byte 0xff at 0", stage="decode",
...     raw=b"\\xff", key=b"k", source=None, timestamp_ms=None)
>>> d.reason, d.original(), d.original_key()
(<DeadLetterReason.NOT_UTF8: 'not_utf8'>, b'\\xff', b'k')
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from kascade.schemas.records import SourcePosition

MAX_DETAIL = 2000  # characters of a dead letter's detail
PREFIX_BYTES = 4096  # of an original value too large to carry whole

# Kafka record headers as confluent-kafka hands them over: (name, value or None).
KafkaHeaders = Sequence[tuple[str, bytes | None]]


class DeadLetterReason(StrEnum):
    """Closed set of reasons a record goes to the dead-letter topic."""

    NOT_UTF8 = "not_utf8"
    NOT_JSON = "not_json"
    # Not in the Confluent wire format, an unknown schema id, or bytes its writer schema
    # does not read.
    NOT_DECODABLE = "not_decodable"
    SCHEMA = "schema"
    OVERSIZE = "oversize"
    EMPTY = "empty"
    TOO_LONG = "too_long"
    KAFKA_ERROR = "kafka_error"
    PROCESSING = "processing"
    WORKER_DIED = "worker_died"  # the process died on it repeatedly (see restarts)


class Header(BaseModel):
    """A Kafka record header, carried with a dead letter so the record can be replayed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    value_b64: str | None = Field(description="Header value, base64; null for a null value.")


class DeadLetter(BaseModel):
    """A record kascade could not handle, with the reason and the original bytes."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        title="kascade dead-letter record",
        json_schema_extra={
            "$id": "https://kascade.dev/schemas/deadletter.schema.json",
        },
    )

    reason: DeadLetterReason
    detail: str = Field(description="Human-readable explanation.")
    stage: str = Field(description="Dataflow step that rejected the record.")
    source: SourcePosition | None = Field(description="Position of the original record.")
    key_b64: str | None = Field(default=None, description="Original Kafka key, base64.")
    original_b64: str = Field(
        description="Original Kafka value, base64 (empty when null); only a prefix when"
        " original_truncated, the whole value staying in the input topic at `source`."
    )
    original_truncated: bool = Field(
        default=False,
        description="The dead letter would exceed what the broker accepts: original_b64 holds"
        " a prefix of the value, original_size and original_sha256 describe all of it.",
    )
    original_size: int | None = Field(default=None, ge=0, description="Bytes of the value.")
    original_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    timestamp_ms: int | None = Field(default=None, description="Kafka timestamp of the input.")
    headers: list[Header] = Field(
        default_factory=list, description="The original record's Kafka headers."
    )

    @classmethod
    def of(
        cls,
        reason: DeadLetterReason,
        detail: str,
        *,
        stage: str,
        raw: bytes | None,
        key: bytes | None,
        source: SourcePosition | None,
        timestamp_ms: int | None,
        headers: KafkaHeaders = (),
    ) -> DeadLetter:
        """A dead letter for the record ``(key, raw, headers)`` read at ``source``."""
        return cls(
            reason=reason,
            detail=detail[:MAX_DETAIL],
            stage=stage,
            source=source,
            key_b64=None if key is None else cls.encode(key),
            original_b64=cls.encode(raw),
            timestamp_ms=timestamp_ms,
            headers=[
                Header(key=k, value_b64=None if v is None else cls.encode(v)) for k, v in headers
            ],
        )

    def fitted(self, max_bytes: int) -> DeadLetter:
        """This dead letter, or, when its JSON would exceed ``max_bytes``, the same one
        with the original value cut to a prefix (its size and sha256 kept).

        >>> d = DeadLetter.of(DeadLetterReason.OVERSIZE, "big", stage="s", raw=b"x" * 5000,
        ...     key=None, source=None, timestamp_ms=None)
        >>> small = d.fitted(2000)
        >>> small.original_truncated, small.original_size, len(small.model_dump_json()) <= 2000
        (True, 5000, True)
        """
        if len(self.model_dump_json()) <= max_bytes:
            return self
        raw = self.original()
        head = self.model_copy(
            update={
                "original_b64": "",
                "original_truncated": True,
                "original_size": len(raw),
                "original_sha256": hashlib.sha256(raw).hexdigest(),
                "key_b64": None if self.key_b64 is None else self.key_b64[:MAX_DETAIL],
                "headers": [],  # they stay with the original in the input topic too
            }
        )
        room = max_bytes - len(head.model_dump_json())
        keep = max(0, min(PREFIX_BYTES, room * 3 // 4 - 4))
        return head.model_copy(update={"original_b64": self.encode(raw[:keep])})

    @staticmethod
    def encode(raw: bytes | None) -> str:
        """Base64 text of raw bytes; ``None`` (a Kafka tombstone) encodes as ``""``.

        >>> DeadLetter.encode(b"\\xff")
        '/w=='
        """
        return base64.b64encode(raw or b"").decode("ascii")

    def original(self) -> bytes:
        """The original value's bytes, exactly as read."""
        return base64.b64decode(self.original_b64)

    def original_headers(self) -> list[tuple[str, bytes | None]]:
        """The original record's headers, as confluent-kafka takes them."""
        return [
            (h.key, None if h.value_b64 is None else base64.b64decode(h.value_b64))
            for h in self.headers
        ]

    def original_key(self) -> bytes | None:
        """The original key's bytes, or ``None`` when the record had no key."""
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)
