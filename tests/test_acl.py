"""A cluster that enforces ACLs: a topic this client may not see or read is named as an
authorization failure (what to grant, to whom), never as a missing topic, by every
command that checks its topics.

The broker is the real one (``docker/kafka-local.sh``), through its SASL/PLAIN listener
where ACLs bind the users ``alice`` and ``bob``; ANONYMOUS on the plaintext listener
sets the ACLs up."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from helpers import kascade_cli, produce

from kascade.schemas.kafka import KafkaSettings

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="session")
def sasl_bootstrap(kafka_bootstrap: str) -> str:
    """The broker's SASL listener: ``KASCADE_TEST_KAFKA_SASL``, else the plaintext port
    + 2 where docker/kafka-local.sh puts it."""
    explicit = os.environ.get("KASCADE_TEST_KAFKA_SASL")
    host, port = kafka_bootstrap.rsplit(":", 1)
    address = explicit or f"{host}:{int(port) + 2}"
    try:
        AdminClient(as_user("alice", address)).list_topics(timeout=10)
    except KafkaException as e:
        if explicit:
            raise
        pytest.skip(f"no SASL listener with ACLs at {address} ({e})")
    return address


def as_user(name: str, address: str) -> dict[str, str]:
    return {
        "bootstrap.servers": address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": name,
        "sasl.password": f"{name}-secret",
    }


def grant(kafka_bootstrap: str, topic: str, user: str, operation: AclOperation) -> None:
    binding = AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        operation,
        AclPermissionType.ALLOW,
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # lives until the futures end
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)


def as_alice(sasl_bootstrap: str, *args: str):
    """``kascade ARGS`` as alice, her password from the environment as it must be."""
    env = os.environ | {"KASCADE_KAFKA__SASL_PASSWORD": "alice-secret"}
    common = ["--brokers", sasl_bootstrap, "--kafka.security-protocol", "SASL_PLAINTEXT"]
    common += ["--kafka.sasl-mechanism", "PLAIN", "--kafka.sasl-username", "alice"]
    return kascade_cli(*args, *common, env=env, timeout=120)


def enforced(sasl_bootstrap: str, topic: str, describable: bool) -> None:
    """Wait until the broker's authorizer applies the new ACLs to alice."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = AdminClient(as_user("alice", sasl_bootstrap)).list_topics(topic=topic, timeout=10)
        if (meta.topics[topic].error is None) == describable:
            return
        time.sleep(0.2)
    raise AssertionError(f"the ACLs on {topic} did not take effect")


def test_a_topic_hidden_by_acls_is_an_authorization_failure_not_a_missing_topic(
    kafka_bootstrap: str, sasl_bootstrap: str, topic_factory, exported, tmp_path
) -> None:
    topic = topic_factory("acl")
    grant(kafka_bootstrap, topic, "bob", AclOperation.READ)  # bob's now; alice's not
    enforced(sasl_bootstrap, topic, describable=False)
    expected = (
        f"kascade: Kafka at {sasl_bootstrap} does not authorize this client to describe"
        f" topic '{topic}' (TOPIC_AUTHORIZATION_FAILED): grant its principal (user 'alice')"
        " DESCRIBE on it with ACLs (kafka-acls)"
    )
    for command in (
        ["sample", "--input-topic", topic, "--out", str(tmp_path / "s.jsonl")],
        ["run", "--input-topic", topic, "--model-dir", str(exported["bert"])],
    ):
        r = as_alice(sasl_bootstrap, *command)
        assert (r.returncode, r.stderr.strip().splitlines()) == (1, [expected]), r.stderr
    assert not (tmp_path / "s.jsonl").exists()
    # a topic that does not exist is still called so
    r = as_alice(sasl_bootstrap, "sample", "--input-topic", f"{topic}-nope", "--out", "x")
    assert r.returncode == 1 and "has no topic" in r.stderr, r.stderr


def test_a_topic_alice_may_describe_but_not_read_is_named_as_such_by_sample(
    kafka_bootstrap: str, sasl_bootstrap: str, topic_factory, tmp_path
) -> None:
    topic = topic_factory("acl")
    grant(kafka_bootstrap, topic, "alice", AclOperation.DESCRIBE)
    enforced(sasl_bootstrap, topic, describable=True)
    produce(
        KafkaSettings(brokers=kafka_bootstrap, input_topic=topic),
        [(None, b'{"id": "a", "text": "t"}')],
    )
    r = as_alice(sasl_bootstrap, "sample", "--input-topic", topic, "--out", str(tmp_path / "s"))
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"kascade: Kafka at {sasl_bootstrap} does not authorize this client to read topic"
        f" '{topic}' (TOPIC_AUTHORIZATION_FAILED): grant its principal (user 'alice') READ"
        " on it with ACLs (kafka-acls)"
    ]
