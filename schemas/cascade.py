"""The cascade's versioned data: heads and calibrated thresholds, stored as
``cascade.json`` in a model directory by ``kascade calibrate``.

An operating point is a pair of confidence thresholds (S0, S1) with the guarantee it was
certified for: with probability at least ``1 - delta`` over the calibration draw, the
chunks the cheap stages accept disagree with the full model on at most ``epsilon`` of
them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

CASCADE_FILE = "cascade.json"
CASCADE_VERSION = 1


class HeadWeights(BaseModel):
    """A multinomial logistic regression: ``softmax(features @ weight.T + bias)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature: str = Field(description="'embeddings' (S0) or 'hidden' (S1), mean-pooled.")
    weight: list[list[float]] = Field(description="labels x hidden_size")
    bias: list[float]


class OperatingPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold_s0: float = Field(ge=0.0, le=1.01, description="> 1 disables the stage")
    threshold_s1: float = Field(ge=0.0, le=1.01)
    epsilon: float = Field(gt=0, lt=1)
    delta: float = Field(gt=0, lt=1)
    expected_share_s0: float
    expected_share_s1: float
    calibration_accepted: int
    calibration_disagreements: int


class CascadeSpec(BaseModel):
    """Heads and operating points fitted for one model directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = CASCADE_VERSION
    model_manifest_sha256: str = Field(description="Manifest digest of the model it fits.")
    cascade_layer: int
    labels: list[str]
    s0: HeadWeights
    s1: HeadWeights
    operating_points: dict[str, OperatingPoint]
    default_operating_point: str
    report: dict = Field(default_factory=dict, description="Calibration measurements.")
