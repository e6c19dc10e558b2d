"""Typed items that travel between the flow's operators (and between worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kascade.schemas import (
    Aggregation,
    DeadLetter,
    DeadLetterReason,
    KafkaHeaders,
    Reading,
    SourcePosition,
    Stage,
)


@dataclass(frozen=True)
class Origin:
    """A record as it was read: made once at ingest, and the one way to make its dead
    letter (its original bytes, key and headers, and where it was read).

    >>> pos = SourcePosition(topic="t", partition=0, offset=7)
    >>> Origin(pos, b"{}").dead_letter(DeadLetterReason.SCHEMA, "no text", "validate").source.key
    't:0:7'
    """

    position: SourcePosition | None
    raw: bytes | None
    key: bytes | None = None
    headers: KafkaHeaders = ()
    timestamp_ms: int | None = None  # the record's Kafka timestamp: the latency clock

    def dead_letter(self, reason: DeadLetterReason, detail: str, stage: str) -> DeadLetter:
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


@dataclass(frozen=True)
class Envelope:
    """What an output record keeps of its input beyond the document: the Kafka key and
    headers, and for enriched output the decoded event and the schema it was written with."""

    key: bytes | None
    headers: KafkaHeaders = ()
    event: Any = None
    schema_id: int | None = None  # the input's writer schema in the registry


@dataclass(frozen=True)
class Outgoing:
    """A record for a Kafka topic: the result of the input record at ``origin`` (a label
    or a dead letter), bound for ``topic``."""

    key: bytes | None
    value: bytes
    headers: KafkaHeaders = ()
    topic: str | None = None
    origin: SourcePosition | None = None


def unit_of(position: SourcePosition | None, doc_id: str) -> str:
    """The key of a record's document in every keyed step (:attr:`DocMeta.unit`)."""
    # Without a position (a test's hand-made record) the id is all there is.
    return f"id:{doc_id}" if position is None else position.key


@dataclass(frozen=True)
class DocMeta:
    """What the reduce step needs to know about a document, carried with each chunk."""

    id: str
    # The text's chunks: all of them once it is tokenized to its end; while a certified
    # stop reads it (tokenizing only as far as it reads), those made so far and one more
    # where another follows: enough for its length bucket (one chunk, or more).
    total_chunks: int
    lang: str | None
    metadata: dict[str, Any] | None
    timestamp_ms: int | None
    source: SourcePosition | None = None  # where the document was read, for dead letters
    # Only the first chunk carries it, so a large event is not copied with every chunk.
    envelope: Envelope | None = None
    text_tokens: int = 0  # the text's tokens, where it is tokenized to its end
    text_chars: int = 0

    @property
    def unit(self) -> str:
        """The key of this document's state in every keyed step: its input record's
        position. Ids repeat (an update, a re-send, two producers); positions do not,
        so two records with one id in flight at once are never taken for one.

        >>> DocMeta("d", 1, None, None, None, SourcePosition(topic="t", partition=2,
        ...         offset=9)).unit
        't:2:9'
        """
        return unit_of(self.source, self.id)


@dataclass(frozen=True)
class Outcome:
    """How the cascade read one document, sent once when it is decided: how far, and
    whether the live test had suspended the cheap stages for any of its chunks
    (:mod:`.guarantee`)."""

    doc: DocMeta
    reading: Reading
    suspended: bool = False

    @property
    def chunks_expected(self) -> int:
        """Chunk results that make the document complete."""
        return self.reading.chunks_read


@dataclass(frozen=True)
class ChunkTask:
    """A chunk on its way to be classified."""

    doc: DocMeta
    index: int
    ids: np.ndarray
    n_tokens: int
    end_token: int = 0  # the text's tokens up to this chunk's end


@dataclass(frozen=True)
class ChunkResult:
    """A classified chunk: probabilities, or the error that prevented them."""

    doc: DocMeta
    index: int
    n_tokens: int
    probs: np.ndarray | None
    stage: Stage
    error: str | None = None
    audit_of: int | None = None  # for an audit: the label index the cheap stage chose


@dataclass(frozen=True)
class Escalation:
    """A chunk for the full model, sent by the cascade: uncertain, or an audit.

    ``hidden`` is the prefix graph's output, so the full model runs only the suffix;
    ``fallback`` is the cheap estimate that stands (marked degraded) if the call fails.
    """

    task: ChunkTask
    hidden: np.ndarray | None
    fallback: np.ndarray | None
    audit_of: int | None = None


@dataclass(frozen=True)
class FullRead:
    """A document the certified stop ended early with ``label``, for the full model to
    read to its end (the live test of the stop): every chunk in order, a read one with
    its prefix output (``hidden``, by chunk index) where the cheap stages kept it.

    The full model reads on only while the chunks left could change the label a full
    read gives under ``strategy`` (the reduce's, as the stop was certified)."""

    tasks: list[ChunkTask]
    hidden: dict[int, np.ndarray]
    label: int
    strategy: Aggregation


@dataclass(frozen=True)
class StopChecked:
    """A stopped document read to its end by the full model: did the label agree?"""

    doc: DocMeta
    agree: bool
