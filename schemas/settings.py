"""Run settings: one frozen, validated model built from flags, environment and a file.

Precedence, highest first: explicit values (CLI flags), ``KASCADE_*`` environment
variables (nested with ``__``, e.g. ``KASCADE_KAFKA__BROKERS``), a TOML config file,
defaults. Cross-field rules are checked when the settings are built, so a bad
combination fails at start-up, not mid-stream.

>>> s = Settings(kafka={"brokers": "10.0.0.5:9092"})
>>> s.kafka.client_config()["bootstrap.servers"]
'10.0.0.5:9092'
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from schemas.records import Aggregation

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSettings(BaseModel):
    """Where the stream lives and how to reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    brokers: str = Field(default="127.0.0.1:9092", min_length=1)
    input_topic: str = Field(default="kascade-text-in", min_length=1)
    output_topic: str = Field(default="kascade-labels-out", min_length=1)
    dead_letter_topic: str = Field(default="kascade-dead-letter", min_length=1)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    extra: dict[str, str] = Field(
        default_factory=dict,
        description="Further librdkafka properties, passed through unchanged.",
    )
    connect_timeout_s: float = Field(default=15.0, gt=0, le=600)
    tail: bool = Field(
        default=True, description="Keep waiting for new records; false stops at the end."
    )
    batch_size: int = Field(
        default=16,
        ge=1,
        le=10_000,
        description="Records taken from Kafka per step: small keeps latency low under a"
        " backlog, since a batch's labels leave together.",
    )
    batch_max_bytes: int = Field(
        default=16_384,
        ge=1,
        le=64 * 1024 * 1024,
        description="Text bytes per step (at least one record): bounds a step's model work"
        " when documents are long, as batch_size does when they are short.",
    )
    fetch_wait_max_ms: int = Field(
        default=20,
        ge=0,
        le=5000,
        description="librdkafka's default (500) adds latency to every quiet partition.",
    )

    @model_validator(mode="after")
    def _sasl_is_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL"):
            missing = [
                name
                for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"{self.security_protocol} needs {', '.join(missing)}")
        return self

    def client_config(self) -> dict[str, str]:
        """librdkafka properties shared by consumers, producers and admin clients.

        The password is revealed only here, for the client; reprs show ``**********``.
        """
        config = {
            "bootstrap.servers": self.brokers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            config["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location is not None:
            config["ssl.ca.location"] = str(self.ssl_ca_location)
        config.update(self.extra)
        return config


class ChunkSettings(BaseModel):
    """How documents become token chunks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(
        default=256, ge=64, le=8192, description="Tokens per chunk, special tokens included."
    )
    overlap: int = Field(default=32, ge=0, description="Tokens shared by consecutive chunks.")
    max_chunks: int = Field(
        default=256, ge=1, description="Longer documents are dead-lettered as too_long."
    )

    @model_validator(mode="after")
    def _overlap_fits(self) -> ChunkSettings:
        if self.overlap >= self.max_tokens // 2:
            raise ValueError("overlap must be less than half of max_tokens")
        return self


class EncoderSettings(BaseModel):
    """How the full model runs on each worker process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(default=1, ge=1, description="ONNX Runtime intra-op threads.")
    micro_batch: int = Field(
        default=1,
        ge=1,
        le=64,
        description="1: one chunk per call, no padding (fastest measured on CPU);"
        " more: length-sorted padded batches.",
    )


class CascadeSettings(BaseModel):
    """Whether and how the cheap stages settle chunks before the full model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: on when the model directory has cascade.json."
    )
    operating_point: str | None = Field(default=None, description="Default: the file's own.")
    audit_fraction: float = Field(
        default=0.01, ge=0.0, le=1.0, description="Settled chunks also sent to the full model."
    )


class Settings(BaseSettings):
    """Everything a kascade run needs, validated before anything starts."""

    model_config = SettingsConfigDict(
        env_prefix="KASCADE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    max_text_bytes: int = Field(
        default=1_000_000,
        gt=0,
        description="Larger input values are dead-lettered as oversize before parsing.",
    )
    model_dir: Path | None = Field(default=None, description="Model directory to serve.")
    chunking: ChunkSettings = Field(default_factory=ChunkSettings)
    encoder: EncoderSettings = Field(default_factory=EncoderSettings)
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    workers: int = Field(default=1, ge=1, le=256, description="Worker processes on this host.")
    recovery_dir: Path | None = Field(
        default=None, description="Bytewax recovery store; enables resuming after a crash."
    )
    snapshot_interval_s: float = Field(default=5.0, gt=0, le=3600)
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="Prometheus port of process 0 (+i for i)."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Address the metrics bind.")
    allow_oversubscribe: bool = Field(
        default=False, description="Allow workers x threads above this host's cores."
    )

    @model_validator(mode="after")
    def _fits_the_host(self) -> Settings:
        cores = os.cpu_count() or 1
        wanted = self.workers * self.encoder.threads
        if wanted > cores and not self.allow_oversubscribe:
            raise ValueError(
                f"workers x threads = {wanted} exceeds this host's {cores} cores;"
                " CPU inference slows down when oversubscribed (allow_oversubscribe=true"
                " to insist)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file.get()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


# Which TOML file the Settings being built reads; a context variable rather than a
# class attribute so concurrent loads (tests, threads) cannot see each other's file.
_config_file: ContextVar[Path | None] = ContextVar("kascade_config_file", default=None)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``overrides`` (flags) > environment > ``config_file`` (TOML) > defaults.

    Nested overrides are dicts (``kafka={"brokers": ...}``) merged key by key into the
    lower sources, so a flag for one Kafka field keeps the others from the file.
    """
    if config_file is not None and not Path(config_file).is_file():
        raise FileNotFoundError(f"config file not found: {config_file}")
    token = _config_file.set(Path(config_file) if config_file is not None else None)
    try:
        return Settings(**overrides)
    finally:
        _config_file.reset(token)
