"""What a calibration certifies and how: one model for ``kascade calibrate``'s flags and
the code (:func:`kascade.toolchain.calibrate.calibrate`).

Kept apart from :mod:`kascade.toolchain.calibrate` so the command line builds its flags
without importing the fitting libraries. The chunking and the engine are the sections
``kascade run`` has (``--chunking.max-tokens``, ``--encoder.backend`` ...): a cascade is
certified for the chunks and the engine a run will use, so they are spelled alike.

>>> CalibrateConfig(epsilon=0.02).delta
0.05
>>> CalibrateConfig(chunking={"max_tokens": 128}).chunking.overlap
32
"""

from __future__ import annotations

import argparse

from pydantic import Field
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict

from kascade.schemas import Aggregation
from kascade.schemas.cascade import DEFAULT_DELTA, DEFAULT_EPSILON
from kascade.schemas.engine import EngineChoice
from kascade.schemas.flags import add_alias, flags_for
from kascade.schemas.settings import ChunkSettings


class CalibrateConfig(BaseSettings):
    """How ``kascade calibrate`` certifies; ``KASCADE_CALIBRATE_*`` variables work too."""

    model_config = SettingsConfigDict(
        env_prefix="KASCADE_CALIBRATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    epsilon: float = Field(
        default=DEFAULT_EPSILON,
        gt=0,
        lt=1,
        description="Max share of the chunks the cheap stages settle that disagree with the"
        " full model.",
    )
    delta: float = Field(
        default=DEFAULT_DELTA,
        gt=0,
        lt=1,
        description="Allowed probability that the certified bound does not hold.",
    )
    epsilon_doc: float = Field(
        default=DEFAULT_EPSILON,
        gt=0,
        lt=1,
        description="Max share of early-stopped documents labeled otherwise than a full"
        " read (with --documents).",
    )
    aggregation: Aggregation = Field(
        default=Aggregation.TOKEN_MEAN,
        description="How the run combines chunks; the document stop is certified for it.",
    )
    seed: int = Field(default=0, description="Of the head/certification split.")
    processes: int | None = Field(
        default=None,
        ge=1,
        description="Worker processes running the full model, one thread each (none: one"
        " per core); the result is the same for any number.",
    )
    chunking: ChunkSettings = Field(
        default_factory=ChunkSettings,
        description="As kascade run will make chunks: the bound holds for those.",
    )
    encoder: EngineChoice = Field(
        default_factory=EngineChoice,
        description="As kascade run will run the model: the certificate names the engine.",
    )


def add_calibrate_flags(parser: argparse.ArgumentParser) -> CliSettingsSource[CalibrateConfig]:
    """One flag per :class:`CalibrateConfig` field on ``parser``, with ``kascade run``'s
    short forms of the chunking flags."""
    source = flags_for(CalibrateConfig, parser)
    add_alias(parser, "--chunking.max-tokens", "--chunk-tokens")
    add_alias(parser, "--chunking.overlap", "--overlap")
    return source
