"""The cascade's versioned data: heads and calibrated thresholds, stored as
``cascade.json`` in a model directory by ``kascade calibrate``.

An operating point is a pair of confidence thresholds (S0, S1) with the guarantee it was
certified for: with probability at least ``1 - delta`` over the calibration draw, the
chunks the cheap stages accept disagree with the full model on at most ``epsilon`` of
them.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kascade.errors import UsageError
from kascade.schemas.engine import Engine
from kascade.schemas.records import Aggregation

CASCADE_FILE = "cascade.json"
# The guarantee kascade calibrate certifies unless told otherwise.
DEFAULT_EPSILON = 0.01
DEFAULT_DELTA = 0.05
# 2: records the chunking and tokenizer it was certified on; 3: may hold a document stop;
# 4: names the engine (earlier versions were all made with ONNX Runtime in FP32);
# 5: may certify per stratum (language and document length); its document stop counts
# groups of related documents once
CASCADE_VERSION = 5
READABLE_VERSIONS = (2, 3, 4, 5)
# A text's language where its record names none (BCP-47 "undetermined").
UNDETERMINED = "und"
# Document lengths a calibration tells apart: a text of one chunk, and one of more.
SHORT, LONG = "short", "long"
LENGTHS = (SHORT, LONG)
# The stratum of every kind of text no other stratum names (languages the calibration held
# too little of, or none): the live test's pool has the same name.
POOL = "other"
# A stratum's languages where the calibration named none: it covers every language.
ANY_LANGUAGE = "*"


def length_of(chunks: int) -> str:
    """The length bucket of a document of ``chunks`` chunks.

    >>> length_of(1), length_of(7)
    ('short', 'long')
    """
    return SHORT if chunks <= 1 else LONG


class CascadeMismatch(UsageError):
    """A ``cascade.json`` that cannot serve this run (missing, stale, other chunking)."""


class CertifiedChunking(BaseModel):
    """The chunks a calibration measured: its guarantee holds for these chunks only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(gt=0)
    overlap: int = Field(ge=0)
    tokenizer_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    def describe(self) -> str:
        return f"{self.max_tokens}-token chunks with overlap {self.overlap}"


class LanguageCalibration(BaseModel):
    """The certified operating point as it fell on one language's certification chunks.

    Not a guarantee per language (the test covers the pooled set): where a language's
    observed disagreement is above epsilon, its text is served worse than the bound says.

    >>> LanguageCalibration(certify=200, accepted=120, disagreements=3).settled_share
    0.6
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    certify: int = Field(ge=0, description="This language's certification chunks.")
    accepted: int = Field(ge=0, description="Of those, settled by S0 or S1.")
    disagreements: int = Field(ge=0, description="Settled chunks the full model labels otherwise.")

    @property
    def settled_share(self) -> float:
        return self.accepted / self.certify if self.certify else 0.0

    @property
    def agreement(self) -> float:
        """Agreement with the full model among the settled chunks (1.0 if none settled)."""
        return 1 - self.disagreements / self.accepted if self.accepted else 1.0


class CalibrationReport(BaseModel):
    """What ``kascade calibrate`` measured on its certification chunks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunks: int = Field(description="Calibration chunks in all.")
    fit: int = Field(description="Chunks the heads were fitted on.")
    certify: int = Field(description="Chunks the thresholds were certified on.")
    head_agreement_s0: float
    head_agreement_s1: float
    head_c_s0: float | None = Field(
        None, description="Inverse L2 strength of S0's head, chosen by held-out log-loss."
    )
    head_c_s1: float | None = Field(None, description="The same for S1's head.")
    accepted_s0: int
    disagreements_s0: int
    accepted_s1: int
    disagreements_s1: int
    certified_upper_bound_at_delta: float
    by_language: dict[str, LanguageCalibration] = Field(
        default_factory=dict,
        description="The default operating point per language of the calibration text;"
        " empty when the text carried no language.",
    )


class HeadWeights(BaseModel):
    """A multinomial logistic regression: ``softmax(features @ weight.T + bias)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature: str = Field(description="'embeddings' (S0) or 'hidden' (S1), mean-pooled.")
    weight: list[list[float]] = Field(description="labels x hidden_size")
    bias: list[float]

    @model_validator(mode="after")
    def _a_matrix_of_numbers(self) -> HeadWeights:
        rows = {len(r) for r in self.weight}
        if not self.weight or len(rows) != 1 or 0 in rows:
            raise ValueError(f"{self.feature} head: weight is not a non-empty matrix")
        if len(self.bias) != len(self.weight):
            raise ValueError(
                f"{self.feature} head: {len(self.bias)} biases for {len(self.weight)} rows"
            )
        values = [v for r in self.weight for v in r] + self.bias
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"{self.feature} head: weights must be finite numbers")
        return self

    def shape(self) -> tuple[int, int]:
        return len(self.weight), len(self.weight[0])


class Stratum(BaseModel):
    """One kind of text with thresholds of its own, certified on its own chunks at its
    share of delta: the chunks the cheap stages settle in it disagree with the full model
    on at most epsilon, whatever the stream's mix of strata.

    >>> Stratum(name="other", threshold_s0=1.0025, threshold_s1=1.01, delta=0.05,
    ...         certify=40, accepted=0, disagreements=0, upper_bound_at_delta=1.0).certified
    False
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    languages: list[str] = Field(
        default_factory=list,
        description="The languages it covers; empty: the pool, every language (and length)"
        " no other stratum covers, those the calibration never saw included.",
    )
    lengths: list[str] = Field(default_factory=lambda: list(LENGTHS))
    threshold_s0: float = Field(gt=0.0, le=1.01)
    threshold_s1: float = Field(gt=0.0, le=1.01, description="> 1: not certified, full model")
    delta: float = Field(gt=0, lt=1, description="Its share of the calibration's delta.")
    certify: int = Field(ge=0, description="Its certification chunks.")
    accepted: int = Field(ge=0)
    disagreements: int = Field(ge=0)
    upper_bound_at_delta: float

    @property
    def certified(self) -> bool:
        return self.threshold_s1 <= 1.0

    @property
    def pool(self) -> bool:
        return not self.languages

    def covers(self, lang: str, length: str) -> bool:
        langs = self.languages
        return (lang in langs or ANY_LANGUAGE in langs) and length in self.lengths


class OperatingPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold_s0: float = Field(gt=0.0, le=1.01, description="> 1 disables the stage")
    threshold_s1: float = Field(gt=0.0, le=1.01)
    epsilon: float = Field(gt=0, lt=1)
    delta: float = Field(gt=0, lt=1)
    expected_share_s0: float
    expected_share_s1: float
    calibration_accepted: int
    calibration_disagreements: int
    strata: list[Stratum] = Field(
        default_factory=list,
        description="Thresholds per kind of text, the pool's being the two above; empty:"
        " the two above for every chunk (one certificate for the calibration's mix).",
    )

    @model_validator(mode="after")
    def _one_pool(self) -> OperatingPoint:
        if not self.strata:
            return self
        names = [s.name for s in self.strata]
        if len(set(names)) != len(names):
            raise ValueError(f"strata named twice in {names}")
        if sum(s.pool for s in self.strata) != 1:
            raise ValueError("strata need exactly one pool (a stratum without languages)")
        if any(x not in LENGTHS for s in self.strata for x in s.lengths):
            raise ValueError(f"stratum lengths are among {LENGTHS}")
        return self

    def stratum(self, lang: str | None, chunks: int) -> Stratum | None:
        """The stratum of a chunk of a ``chunks``-chunk document in ``lang`` (``None``:
        the point has no strata)."""
        return self.stratum_at(lang or UNDETERMINED, length_of(chunks))

    def stratum_at(self, lang: str, length: str) -> Stratum | None:
        return stratum_in(self.strata, lang, length) if self.strata else None


def stratum_in(strata: list[Stratum], lang: str, length: str) -> Stratum:
    """The stratum of ``strata`` (one of them the pool) that covers this kind of text."""
    for s in strata:
        if s.covers(lang, length):
            return s
    return next(s for s in strata if s.pool)


class StopRule(BaseModel):
    """When reading a document may stop: after at least ``min_chunks`` chunks, when the
    last ``min_chunks`` read were all settled by the cheap stages with one label (and each
    looked on-topic to the stop's on-topic head with probability >= ``min_on_topic``), and
    the token-weighted mean of every chunk read so far puts that label ahead of the next by
    at least ``min_lead``.

    >>> StopRule(min_chunks=2, min_lead=0.5, min_on_topic=0.8).describe()
    'the last 2 chunks settled alike and on-topic (>= 0.8), lead >= 0.5'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_chunks: int = Field(ge=1)
    min_lead: float = Field(ge=0.0, le=1.0)
    min_on_topic: float = Field(
        default=0.0, ge=0.0, le=1.0, description="0: the on-topic head is not asked."
    )

    def describe(self) -> str:
        last = (
            "the last chunk settled"
            if self.min_chunks == 1
            else f"the last {self.min_chunks} chunks settled alike"
        )
        if self.min_on_topic > 0:
            last += f" and on-topic (>= {self.min_on_topic:g})"
        return f"{last}, lead >= {self.min_lead:g}"


class DocumentStop(BaseModel):
    """A certified stop: with probability at least ``1 - delta`` over the calibration
    draw, of the documents whose reading it ends early, at most ``epsilon`` get another
    label than the full model gives reading every chunk (documents drawn like the
    calibration documents, chunked as ``CascadeSpec.chunking``, cheap stages at the
    default operating point)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: StopRule
    on_topic: HeadWeights | None = Field(
        None,
        description="P(a chunk's full-model label is its document's full-read label), on"
        " the mean embeddings: [off-topic, on-topic]. Fitted on other documents than the"
        " stop was certified on; None when the rule does not ask it.",
    )
    aggregation: Aggregation = Field(
        description="How the full read combines chunks: the label the stop is held to."
    )
    epsilon: float = Field(gt=0, lt=1)
    delta: float = Field(gt=0, lt=1)
    documents: int = Field(ge=0, description="Calibration documents it was certified on.")
    draws: int | None = Field(
        None,
        ge=0,
        description="Of those, the independent draws the test counted: one document per"
        " group of related documents (translations, copies of one source). None in files"
        " written before groups were counted, where every document was one.",
    )
    stopped: int = Field(ge=0, description="Of the draws, documents it stopped early.")
    disagreements: int = Field(ge=0, description="Stopped draws labeled otherwise.")
    upper_bound_at_delta: float
    chunks_read_share: float = Field(
        description="Chunks read over chunks in all, on the calibration documents."
    )
    tokens_read_share: float = Field(
        description="Tokens read over tokens in all, on the calibration documents."
    )


class CascadeSpec(BaseModel):
    """Heads and operating points fitted for one model directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = CASCADE_VERSION
    model_manifest_sha256: str = Field(description="Manifest digest of the model it fits.")
    chunking: CertifiedChunking
    engine: Engine = Field(
        default_factory=Engine,
        description="The engine whose numbers were calibrated: another engine computes"
        " other hidden states and other full-model labels.",
    )
    cascade_layer: int
    labels: list[str]
    s0: HeadWeights
    s1: HeadWeights
    operating_points: dict[str, OperatingPoint]
    default_operating_point: str
    report: CalibrationReport
    document_stop: DocumentStop | None = Field(
        None, description="Certified on multi-chunk documents by kascade calibrate --documents."
    )
