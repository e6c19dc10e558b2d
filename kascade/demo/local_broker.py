"""Drives ``docker/kafka-local.sh`` and ``docker/registry-local.sh``: a real single-node
Kafka broker and a real Schema Registry for demos, tests and benchmarks, and fresh topics
on it for one run. Not part of the runtime: a job reaches the brokers its settings name."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from kascade.dataflow.broker import create_topics
from kascade.schemas.kafka import KafkaSettings

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SCRIPT = DOCKER / "kafka-local.sh"
REGISTRY_SCRIPT = DOCKER / "registry-local.sh"


@dataclass(frozen=True)
class LocalBroker:
    """A broker on 127.0.0.1:``port``; ``started`` says whether this process started it."""

    port: int
    started: bool

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the broker, but only if this process started it."""
        if self.started:
            _script("stop", self.port)


@dataclass(frozen=True)
class LocalRegistry:
    """A Schema Registry on 127.0.0.1:``port``; ``started`` as for :class:`LocalBroker`."""

    port: int
    started: bool

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def stop(self) -> None:
        if self.started:
            _run(REGISTRY_SCRIPT, "KASCADE_REGISTRY_PORT", "stop", self.port)


def _script(command: str, port: int, timeout_s: float = 600) -> None:
    _run(SCRIPT, "KASCADE_KAFKA_PORT", command, port, timeout_s)


def _run(script: Path, port_variable: str, command: str, port: int, timeout_s: float = 600) -> None:
    if not script.exists():
        raise FileNotFoundError(
            f"{script} not found: the local broker and registry need a kascade source"
            " checkout; otherwise pass --kafka.brokers / --registry.url"
        )
    env = os.environ | {port_variable: str(port)}
    subprocess.run(["bash", str(script), command], env=env, check=True, timeout=timeout_s)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def ensure_local_broker(port: int = 9092) -> LocalBroker:
    """Use a broker already listening on ``port``, or start one with the script."""
    if port_open(port):
        return LocalBroker(port=port, started=False)
    _script("start", port)
    return LocalBroker(port=port, started=True)


def ensure_local_registry(port: int = 8081) -> LocalRegistry:
    """Use a registry already listening on ``port``, or start one with the script."""
    if port_open(port):
        return LocalRegistry(port=port, started=False)
    _run(REGISTRY_SCRIPT, "KASCADE_REGISTRY_PORT", "start", port)
    return LocalRegistry(port=port, started=True)


def fresh_topics(brokers: str, prefix: str, *, partitions: int = 2) -> KafkaSettings:
    """Bounded settings on newly created, uniquely named topics (for one demo or benchmark
    run, so nothing from an earlier run is read again)."""
    run = uuid.uuid4().hex[:8]
    k = KafkaSettings(
        brokers=brokers,
        input_topic=f"{prefix}-{run}-text-in",
        output_topic=f"{prefix}-{run}-labels-out",
        dead_letter_topic=f"{prefix}-{run}-dead-letter",
        tail=False,
    )
    create_topics(
        k, {k.input_topic: partitions, k.output_topic: partitions, k.dead_letter_topic: 1}
    )
    return k
