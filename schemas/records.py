"""Records that cross Kafka: what comes in, what goes out, and what could not be handled.

Every record is a frozen pydantic model; its JSON Schema (``schemas/json``) is generated
from it, so code and contract cannot drift apart.

>>> doc = InputDocument.model_validate_json(b'{"id": "a1", "text": "Rain in Lima."}')
>>> doc.id, doc.lang
('a1', None)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

_FROZEN_STRICT = ConfigDict(extra="forbid", frozen=True)
# The shape of a BCP-47 tag: subtags of letters and digits joined by hyphens. It reaches
# log lines and metric labels, so nothing else (spaces, newlines, escapes) may pass.
LANGUAGE_TAG = r"^([A-Za-z]{2,8}|[xXiI])(-[A-Za-z0-9]{1,8})*$"

DocumentId = Annotated[
    str,
    Field(min_length=1, max_length=512, description="Producer-chosen document id; output key."),
]


class InputDocument(BaseModel):
    """A document to classify, as producers write it to the input topic."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        title="kascade input document",
        json_schema_extra={
            "$id": "https://kascade.dev/schemas/input.schema.json",
        },
    )

    id: DocumentId
    text: str = Field(description="UTF-8 text of any length; split into token chunks.")
    lang: str | None = Field(
        default=None,
        min_length=2,
        max_length=35,
        pattern=LANGUAGE_TAG,
        description="Optional BCP-47 language tag (letters, digits and hyphens: en, pt-BR,"
        " zh-Hant), passed through to the output.",
    )
    metadata: dict[str, Any] | None = Field(
        default=None, description="Opaque producer data, passed through to the output."
    )


class Stage(StrEnum):
    """Where a chunk's answer came from (the first four are counted in :class:`ChunkCounts`)."""

    S0 = "s0"  # the head on mean input embeddings settled it
    S1 = "s1"  # the head on an early layer's hidden state settled it
    FULL = "full"  # the full model classified it
    SKIPPED = "skipped"  # not needed: the document's label could not change
    UNCERTAIN = "uncertain"  # the cheap stages' verdict until the full model answers


class ChunkCounts(BaseModel):
    """How a document's chunks were settled."""

    model_config = _FROZEN_STRICT

    total: NonNegativeInt | None = Field(
        description="Chunks of the whole text (null where a certified stop came before the"
        " text was tokenized to its end)."
    )
    settled_s0: NonNegativeInt = Field(
        default=0, description="Settled by the head on mean input embeddings."
    )
    settled_s1: NonNegativeInt = Field(
        default=0, description="Settled by the head on an early layer's hidden state."
    )
    full_model: NonNegativeInt = Field(default=0, description="Classified by the full model.")
    failed: NonNegativeInt = Field(
        default=0, description="Chunks whose full-model call failed; their cheap verdict stood."
    )
    skipped: NonNegativeInt = Field(
        default=0,
        description="Chunks never classified because the document label was already decided.",
    )
    unread: NonNegativeInt | None = Field(
        default=0,
        description="Chunks never read: a certified stop knew the label before them (null"
        " where it came before the text was tokenized to its end).",
    )


class StopReason(StrEnum):
    """Why reading a document ended."""

    END = "end"  # every chunk was read
    CERTAIN = "certain"  # the certified document stop knew the label a full read gives


class Reading(BaseModel):
    """How much of a document was read to label it, of how much there was.

    A certified stop tokenizes the text only as far as it reads, so the totals in tokens
    and chunks are known only where reading reached the end of the text (``None``
    otherwise); the totals in characters always are.

    >>> Reading(chunks_read=2, chunks_total=20, tokens_read=478, tokens_total=4700,
    ...         stopped="certain").skipped_tokens
    4222
    >>> Reading(chunks_read=2, tokens_read=478, chars_read=2100, chars_total=21000,
    ...         stopped="certain").skipped_chars
    18900
    """

    model_config = _FROZEN_STRICT

    chunks_read: NonNegativeInt
    chunks_total: NonNegativeInt | None = Field(
        default=None,
        description="Chunks of the whole text; null where a certified stop came before the"
        " text was tokenized to its end.",
    )
    tokens_read: NonNegativeInt = Field(
        description="Tokens of the text up to the end of the last chunk read (special tokens"
        " and overlaps not counted)."
    )
    tokens_total: NonNegativeInt | None = Field(
        default=None,
        description="Tokens of the whole text; null where a certified stop came before the"
        " text was tokenized to its end.",
    )
    chars_read: NonNegativeInt | None = Field(
        default=None, description="Characters of the text up to the end of the last chunk read."
    )
    chars_total: NonNegativeInt | None = Field(
        default=None, description="Characters of the whole text."
    )
    stopped: StopReason

    @property
    def skipped_tokens(self) -> int | None:
        return None if self.tokens_total is None else self.tokens_total - self.tokens_read

    @property
    def skipped_chars(self) -> int | None:
        if self.chars_total is None or self.chars_read is None:
            return None
        return self.chars_total - self.chars_read


class ModelIdentity(BaseModel):
    """Which model produced a label: enough to reproduce it."""

    model_config = _FROZEN_STRICT

    name: str = Field(description="Source checkpoint the model was exported from.")
    variant: str = Field(description="Quantization preset, e.g. int8-int4emb.")
    manifest_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the model directory's manifest.json."
    )
    cascade_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the cascade.json in force: which calibration settled chunks"
        " (none without a cascade).",
    )


class CascadeUse(StrEnum):
    """Whether a run's cheap stages were in force."""

    ON = "on"  # calibrated heads settled the chunks they were certified to settle
    OFF = "off"  # every chunk went to the full model, as configured
    # The model's cascade.json was certified on other chunking or another tokenizer, and
    # the run was told to go on without it (cascade.if_uncertified = "full_model").
    UNCERTIFIED = "uncertified"
    # The live test of the certified bound on the audits rejected it (cascade.on_violation
    # = "full_model"): this document's chunks went to the full model.
    SUSPENDED = "suspended"


class OutputRecord(BaseModel):
    """One label per document, written to the output topic keyed by document id."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        title="kascade output record",
        json_schema_extra={
            "$id": "https://kascade.dev/schemas/output.schema.json",
        },
    )

    id: DocumentId
    label: str | None = Field(description="Document label; null when the text has no tokens.")
    score: float = Field(ge=0.0, le=1.0, description="Aggregated probability of `label`.")
    scores: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        description="Aggregated probability per label."
    )
    aggregation: Aggregation = Field(description="Reduce strategy that combined the chunks.")
    chunks: ChunkCounts
    model: ModelIdentity
    latency_ms: float = Field(ge=0.0, description="From Kafka timestamp of the input to emit.")
    degraded: bool = Field(
        default=False, description="True when some chunk's full-model call failed."
    )
    reasons: list[str] = Field(default_factory=list, description="Why the record is degraded.")
    cascade: CascadeUse = Field(
        default=CascadeUse.OFF, description="Whether calibrated cheap stages could settle chunks."
    )
    reading: Reading | None = Field(
        default=None, description="How much of the text was read, and why reading ended."
    )
    lang: str | None = Field(default=None, pattern=LANGUAGE_TAG)
    metadata: dict[str, Any] | None = None
    source: SourcePosition | None = Field(
        default=None, description="Where the input record was read."
    )


class Enrichment(BaseModel):
    """What kascade adds to an enriched event (``output.shape = "enriched"``), under
    ``output.field``: the label record without what the event itself already says."""

    model_config = _FROZEN_STRICT

    label: str | None
    score: float = Field(ge=0.0, le=1.0)
    scores: dict[str, float]
    model: ModelIdentity
    degraded: bool
    reasons: list[str]
    cascade: CascadeUse
    chunks: ChunkCounts
    reading: Reading | None = None

    @classmethod
    def of(cls, record: OutputRecord) -> Enrichment:
        return cls.model_validate(record.model_dump(include=set(cls.model_fields)))


class Aggregation(StrEnum):
    """How chunk probabilities become a document label (a closed set)."""

    TOKEN_MEAN = "token_mean"  # mean of probabilities weighted by chunk tokens (default)
    MAX = "max"  # the label of the single most confident chunk
    MAJORITY = "majority"  # most chunk votes; ties go to the higher token-weighted mean


class SourcePosition(BaseModel):
    """Where the original record was read."""

    model_config = _FROZEN_STRICT

    topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)

    @property
    def key(self) -> str:
        """The record's identity as one string, ``topic:partition:offset`` (Kafka topic
        names have no ``:``): the key of its state in the flow and of its result in the
        exactly-once ledger.

        >>> SourcePosition(topic="text-in", partition=2, offset=9).key
        'text-in:2:9'
        """
        return f"{self.topic}:{self.partition}:{self.offset}"
