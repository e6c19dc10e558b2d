"""Fine-tuning hyperparameters: one model for ``kascade train``'s flags and the code.

Kept apart from :mod:`kascade.toolchain.train` so the command line can build its flags
without importing torch.
"""

from __future__ import annotations

import argparse

from pydantic import Field
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict

from kascade.schemas.flags import flags_for


class TrainConfig(BaseSettings):
    """How ``kascade train`` fine-tunes; ``KASCADE_TRAIN_*`` variables work too."""

    model_config = SettingsConfigDict(env_prefix="KASCADE_TRAIN_", extra="forbid", frozen=True)

    epochs: int = Field(default=4, ge=1, description="Passes over the training data.")
    batch_size: int = Field(default=16, ge=1, description="Examples per optimizer step.")
    learning_rate: float = Field(default=5e-5, gt=0, description="Of the encoder (AdamW).")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW's weight decay.")
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1, description="Share of linear warmup.")
    max_length: int = Field(default=128, ge=8, description="Tokens per training example.")
    seed: int = Field(default=0, description="Of the head's initialization and the shuffling.")
    threads: int | None = Field(default=None, ge=1, description="torch threads (default: all).")


def add_train_flags(parser: argparse.ArgumentParser) -> CliSettingsSource[TrainConfig]:
    """One flag per :class:`TrainConfig` field on ``parser``."""
    return flags_for(TrainConfig, parser)
