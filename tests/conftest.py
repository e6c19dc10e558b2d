"""Shared fixtures: one real Kafka broker per session, and factories for topics and settings.

The broker is, in order of preference: the address in ``KASCADE_TEST_KAFKA`` (CI starts
one), a testcontainers Kafka container when a Docker engine answers, or the project's
own ``docker/kafka-local.sh`` on a free port.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from kascade.dataflow.broker import create_topics
from kascade.schemas.kafka import KafkaSettings


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real Kafka broker for the whole session."""
    explicit = os.environ.get("KASCADE_TEST_KAFKA")
    if explicit:
        yield explicit
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        # As in production and in docker/kafka-local.sh: a missing topic is an error,
        # not a topic created on first use.
        container = (
            KafkaContainer().with_kraft().with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        )
        with container:
            yield container.get_bootstrap_server()
        return
    from kascade.dataflow.ports import free_port
    from kascade.demo.local_broker import ensure_local_broker

    broker = ensure_local_broker(free_port())
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def schema_registry_url() -> Iterator[str]:
    """Base URL of a real Confluent-compatible Schema Registry for the whole session:
    ``KASCADE_TEST_REGISTRY`` (CI starts one), else Apicurio Registry started with the
    project's ``docker/registry-local.sh`` on a free port."""
    explicit = os.environ.get("KASCADE_TEST_REGISTRY")
    if explicit:
        yield explicit
        return
    from kascade.dataflow.ports import free_port
    from kascade.demo.local_broker import ensure_local_registry

    registry = ensure_local_registry(free_port())
    try:
        yield registry.url
    finally:
        registry.stop()


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(kafka_bootstrap: str) -> TopicFactory:
    """Creates a topic with a unique name: ``topic_factory("in", partitions=2)``."""

    def make(role: str = "t", partitions: int = 1) -> str:
        name = f"test-{role}-{uuid.uuid4().hex[:12]}"
        create_topics(KafkaSettings(brokers=kafka_bootstrap), {name: partitions})
        return name

    return make


@pytest.fixture
def kafka_settings(kafka_bootstrap: str, topic_factory: TopicFactory) -> KafkaSettings:
    """Bounded settings with fresh input (2 partitions), output and dead-letter topics."""
    return KafkaSettings(
        brokers=kafka_bootstrap,
        input_topic=topic_factory("in", partitions=2),
        output_topic=topic_factory("out", partitions=2),
        dead_letter_topic=topic_factory("dlq"),
        tail=False,
    )


pytest_plugins = ["toolchain_fixtures"]
