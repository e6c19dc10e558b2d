"""Where the stream lives and how to reach it: the Kafka section of the run settings.

Secrets (SASL and registry passwords, librdkafka's secret properties) never print: the
settings' repr masks them, and :func:`is_secret` names the librdkafka properties that
hold one, so a flag can refuse them.

>>> KafkaSettings(brokers="10.0.0.5:9092").client_config()["bootstrap.servers"]
'10.0.0.5:9092'
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import CliSuppress

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


# librdkafka properties whose values are secrets: passwords, client secrets, private
# keys and keystores, JAAS and OAuth configurations that may embed them.
_SECRET_PROPERTY = re.compile(r"password|secret|ssl\.key|keystore|jaas|oauthbearer\.config")


def is_secret(prop: str) -> bool:
    """Whether a librdkafka property holds a secret.

    >>> is_secret("ssl.key.password"), is_secret("sasl.oauthbearer.client.secret")
    (True, True)
    >>> is_secret("client.id"), is_secret("ssl.ca.location")
    (False, False)
    """
    return _SECRET_PROPERTY.search(prop.lower()) is not None


class KafkaSettings(BaseModel):
    """Where the stream lives and how to reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    brokers: str = Field(
        default="127.0.0.1:9092",
        min_length=1,
        description="Bootstrap servers, comma-separated host:port.",
    )
    input_topic: str = Field(
        default="kascade-text-in", min_length=1, description="Topic the text records are read from."
    )
    output_topic: str = Field(
        default="kascade-labels-out", min_length=1, description="Topic the labels go to."
    )
    dead_letter_topic: str = Field(
        default="kascade-dead-letter",
        min_length=1,
        description="Topic for records that could not be labeled, with the reason and the"
        " original bytes.",
    )
    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="How clients talk to the brokers (SASL_*: log in)."
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="With a SASL protocol: how to log in."
    )
    sasl_username: str | None = Field(
        default=None,
        description="With a SASL protocol: the user (its password: the environment variable"
        " KASCADE_KAFKA__SASL_PASSWORD or the config file, never a flag).",
    )
    # Not a flag: a password in argv is visible to every user of the host (ps).
    sasl_password: CliSuppress[SecretStr | None] = None
    ssl_ca_location: Path | None = Field(
        default=None, description="PEM file of the CA that signed the brokers' certificates."
    )
    extra: dict[str, str] = Field(
        default_factory=dict,
        description="Further librdkafka properties, passed through unchanged; secret ones"
        " (passwords, client secrets, keys) only from the environment or the config file,"
        " and never shown.",
    )
    connect_timeout_s: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="How long the checks at start wait for the cluster before saying it is"
        " unreachable.",
    )
    outage_tolerance_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="How long the running job rides through an unreachable cluster (it"
        " retries, holding its records) before it exits non-zero saying so.",
    )
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
    max_message_bytes: int | None = Field(
        default=None,
        ge=4096,
        description="Largest record kascade writes (larger ones are cut down or"
        " dead-lettered); default: what the cluster and the output topics accept, read at"
        " start.",
    )
    fetch_wait_max_ms: int = Field(
        default=20,
        ge=0,
        le=5000,
        description="librdkafka's default (500) adds latency to every quiet partition.",
    )
    transactional_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="With delivery=exactly_once: the prefix of the Kafka transactional ids"
        " (one per input partition), the same on every process and start of one job and"
        " different for every other job; default: kascade-<input_topic>-<output_topic>.",
    )
    commit_interval_ms: int = Field(
        default=25,
        ge=1,
        le=60_000,
        description="With delivery=exactly_once: the least time between two commits of a"
        " partition (readers see results when committed); a result after a quiet spell is"
        " committed at once, the results written during one commit share the next, and"
        " every snapshot commits too.",
    )
    transaction_timeout_s: float = Field(
        default=60.0,
        ge=1,
        le=900,
        description="With delivery=exactly_once: how long the broker keeps a dead"
        " process's open transaction (holding back read_committed consumers) before"
        " aborting it; outages longer than this restart the workers from the last"
        " snapshot. At most the broker's transaction.max.timeout.ms.",
    )

    def __repr_args__(self) -> Any:
        # A secret property in extra never reaches a log line, an error or a traceback.
        for name, value in super().__repr_args__():
            if name == "extra":
                value = {k: "**********" if is_secret(k) else v for k, v in value.items()}
            yield name, value

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

    def transactional_prefix(self) -> str:
        """Transactional ids are this plus ``-<input partition>``.

        >>> KafkaSettings(input_topic="a", output_topic="b").transactional_prefix()
        'kascade-a-b'
        """
        return self.transactional_id or f"kascade-{self.input_topic}-{self.output_topic}"

    def record_limit(self) -> int:
        """Bytes a record's value may have: the accepted size less room for the key,
        headers and batch framing (librdkafka's own default limit when unknown)."""
        return (self.max_message_bytes or 1_000_000) - 2048

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
