"""Read a topic from the beginning to its current end, as a ``read_committed`` consumer
does: for the demo and the tests."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kascade.dataflow.broker import client_config
from kascade.dataflow.kafka_io import headers_of
from kascade.operators.items import Outgoing
from kascade.schemas.kafka import KafkaSettings


def read_all(
    settings: KafkaSettings, topic: str, *, expect: int | None = None, timeout_s: float = 30.0
) -> list[tuple[bytes | None, bytes]]:
    """Every ``(key, value)`` on ``topic`` now, or once ``expect`` records have arrived
    (see :func:`read_records`)."""
    return [
        (r.key, r.value) for r in read_records(settings, topic, expect=expect, timeout_s=timeout_s)
    ]


def read_records(
    settings: KafkaSettings, topic: str, *, expect: int | None = None, timeout_s: float = 30.0
) -> list[Outgoing]:
    """Every record on ``topic`` now (key, value, headers), or once ``expect`` records
    have arrived.

    Without ``expect``, stops at the end of every partition; with it, keeps polling
    until that many records are read or ``timeout_s`` passes (then returns what it has).
    """
    consumer = Consumer(
        client_config(settings)
        | {
            "group.id": f"kascade-read-{uuid.uuid4()}",
            # Only what kascade committed: with delivery=exactly_once, results of a
            # transaction that was aborted (a worker died before its commit) are there
            # too, written again by the resumed run.
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=settings.connect_timeout_s)
        parts = list(meta.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Outgoing] = []
        at_end: set[int | None] = set()  # partitions at their end (EOF events name one)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if expect is None and len(at_end) == len(parts):
                break
            if expect is not None and len(out) >= expect:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise KafkaException(err)
            at_end.discard(msg.partition())
            # kascade writes no tombstones; an empty value reads as empty bytes
            out.append(Outgoing(msg.key(), msg.value() or b"", headers_of(msg)))
        return out
    finally:
        consumer.close()
