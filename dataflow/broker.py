"""The Kafka cluster as the job finds it before the flow starts: its clients' settings,
a bounded check that it is reachable and holds the topics (Bytewax's source would wait
forever in ``list_topics``), what it lets this principal do, and topic creation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from kascade.dataflow.health import FoldConnectionErrors
from kascade.errors import KascadeError, UsageError
from kascade.schemas.kafka import KafkaSettings, is_secret

log = logging.getLogger(__name__)
# librdkafka's own log lines, routed into Python logging instead of raw stderr; its
# reconnect attempts become state changes of the process's link to the cluster.
rdkafka_log = logging.getLogger("kascade.rdkafka")
rdkafka_log.addFilter(FoldConnectionErrors())
_startup_log = logging.getLogger("kascade.rdkafka.startup")
_startup_log.propagate = False
_startup_log.addHandler(logging.NullHandler())


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings for any client this process creates, logging through Python."""
    return settings.client_config() | {"logger": rdkafka_log}


def _startup_config(settings: KafkaSettings) -> dict[str, Any]:
    # The start-up checks' clients: a broker they cannot reach is their one-line error,
    # so librdkafka's view of the same failure (which can arrive first on a loaded
    # machine) is not shown.
    return settings.client_config() | {"logger": _startup_log}


# What every output producer adds: no duplicates from its own retries, small batches.
SINK_CONFIG = {"enable.idempotence": "true", "linger.ms": "5"}


class KafkaUnavailable(KascadeError):
    """The cluster could not be reached, or a topic the flow needs is missing."""


def check_client_config(settings: KafkaSettings) -> None:
    """Every client kascade makes accepts ``settings`` (``kafka.extra`` included), or a
    one-line :class:`UsageError` before anything starts."""
    for kind, make in (
        ("consumer", lambda c: Consumer(c | {"group.id": "kascade-config-check"})),
        ("producer", lambda c: Producer(SINK_CONFIG | c)),
    ):
        try:
            client = make(_startup_config(settings))
        except (KafkaException, ValueError, TypeError) as e:
            reason = e.args[0].str() if e.args and isinstance(e.args[0], KafkaError) else str(e)
            for prop, value in settings.extra.items():  # librdkafka may quote a value
                if is_secret(prop) and value:
                    reason = reason.replace(value, "**********")
            raise UsageError(f"invalid Kafka {kind} settings (kafka.extra?): {reason}") from None
        if isinstance(client, Consumer):
            client.close()


def check_cluster(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """Partition count of each topic, or :class:`KafkaUnavailable` within the timeout.

    Runs before the dataflow starts, because Bytewax's source would otherwise block
    forever in ``list_topics`` when the broker is down.
    """
    check_client_config(settings)
    # asking for a topic by name must not create it where the broker auto-creates topics
    admin = AdminClient(_startup_config(settings) | {"allow.auto.create.topics": "false"})
    meta = _cluster_metadata(admin, settings)
    found: dict[str, int] = {}
    missing, denied = [], []
    for topic in topics:
        t = meta.topics.get(topic)
        if t is not None and t.error is None:
            found[topic] = len(t.partitions)
        elif _authorization_failed(admin, topic, settings):
            denied.append(topic)
        else:
            missing.append(topic)
    if denied:
        raise not_authorized(settings, denied, "describe")
    if missing:
        raise KafkaUnavailable(
            f"Kafka at {settings.brokers} has no topic {', '.join(repr(t) for t in missing)};"
            " create it first (kascade topics)"
        )
    return found


def _authorization_failed(admin: AdminClient, topic: str, settings: KafkaSettings) -> bool:
    """Whether ``topic`` is hidden from this client by ACLs rather than absent: a listing
    of all topics leaves out the ones a principal may not describe, and only a request
    for the topic by name says which it is."""
    try:
        t = admin.list_topics(topic=topic, timeout=settings.connect_timeout_s).topics.get(topic)
    except KafkaException:
        return False
    return t is not None and t.error is not None and t.error.code() in DENIED


DENIED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)


def _cluster_metadata(admin: AdminClient, settings: KafkaSettings) -> Any:
    try:
        return admin.list_topics(timeout=settings.connect_timeout_s)
    except KafkaException as e:
        raise KafkaUnavailable(
            f"cannot reach Kafka at {settings.brokers} within "
            f"{settings.connect_timeout_s:g}s: {e.args[0].str() if e.args else e}"
        ) from None


def not_authorized(settings: KafkaSettings, topics: list[str], operation: str) -> KafkaUnavailable:
    """The one-line error for topics the cluster's ACLs keep from this client."""
    user = f" (user {settings.sasl_username!r})" if settings.sasl_username else ""
    return KafkaUnavailable(
        f"Kafka at {settings.brokers} does not authorize this client to {operation} topic"
        f" {', '.join(repr(t) for t in topics)} (TOPIC_AUTHORIZATION_FAILED): grant its"
        f" principal{user} {operation.upper()} on it with ACLs (kafka-acls)"
    )


def accepted_record_bytes(settings: KafkaSettings, topics: Iterable[str]) -> int:
    """The largest record every one of ``topics`` and kascade's producer accept."""
    admin = AdminClient(_startup_config(settings))
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    limits = [int(settings.extra.get("message.max.bytes", 1_000_000))]
    try:
        described = admin.describe_configs(resources, request_timeout=settings.connect_timeout_s)
        for future in described.values():
            entries = future.result(timeout=settings.connect_timeout_s)
            limits.append(int(entries["max.message.bytes"].value))
    except KafkaException as e:
        raise KafkaUnavailable(f"cannot read topic configs from {settings.brokers}: {e}") from None
    return min(limits)


def create_topics(settings: KafkaSettings, topics: dict[str, int]) -> list[str]:
    """Create the topics that do not exist yet (name -> partitions); returns those created.

    Raises :class:`UsageError` for settings or a request the cluster refuses (an unknown
    property, too few partitions), :class:`KafkaUnavailable` for anything else."""
    check_client_config(settings)
    timeout = settings.connect_timeout_s
    admin = AdminClient(client_config(settings))
    existing = _cluster_metadata(admin, settings).topics
    wanted = [
        NewTopic(name, num_partitions=parts, replication_factor=-1)
        for name, parts in topics.items()
        if name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as e:
            error: KafkaError = e.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            refused = f"cannot create topic {name}: {error.str()}"
            if error.code() in _REFUSED_REQUESTS:
                raise UsageError(refused) from None
            raise KafkaUnavailable(refused) from None
    return created


# What the cluster answers to a topic request that cannot work as given.
_REFUSED_REQUESTS = {
    KafkaError.INVALID_PARTITIONS,
    KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.INVALID_CONFIG,
    KafkaError.POLICY_VIOLATION,
}
