"""Kafka at the edges of the flow: the source with a byte budget, a delivery-checked sink.

Bytewax's own Kafka connectors have two gaps that lose data or time in production:
the source lists topics with no timeout (an unreachable broker hangs start-up forever:
:mod:`~kascade.dataflow.broker` checks first and fails fast with a clear message) and
``KafkaSink`` never looks at delivery reports (failed writes vanish):
:class:`DeliveryCheckedSink` raises the first failed delivery instead of dropping it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import datetime
from typing import Any

from bytewax.connectors.kafka import KafkaError as KafkaSourceError
from bytewax.connectors.kafka import KafkaSource, KafkaSourceMessage
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    Message,
    Producer,
)

from kascade.dataflow.broker import SINK_CONFIG, KafkaUnavailable, client_config
from kascade.dataflow.channel import announce_joined
from kascade.dataflow.health import LINK, means_unreachable
from kascade.errors import KascadeError
from kascade.operators.items import Outgoing
from kascade.schemas.kafka import KafkaSettings

log = logging.getLogger(__name__)
# Set on SIGTERM/SIGINT: sources end as if their input had, so the flow drains.
DRAIN = threading.Event()
# How often a waiting sink wakes to check the outage against its tolerance.
_FLUSH_SLICE_S = 5.0


def headers_of(msg: Message) -> list[tuple[str, bytes | None]]:
    """A consumed message's headers as kascade carries them: pairs, in order ([] for none)."""
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw  # a dict only on the produce side
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]


class DeliveryFailed(KascadeError):
    """Kafka did not accept a record the flow produced."""


def source(settings: KafkaSettings, topics: list[str]) -> ByteBudgetSource:
    """Bytewax's Kafka source with our client settings and a byte budget per step;
    offsets live in Bytewax recovery."""
    config = client_config(settings)
    brokers = config.pop("bootstrap.servers").split(",")
    # Bytewax passes these to its admin client too, which warns about consumer-only
    # keys; the consumers are what they are for.
    config["fetch.wait.max.ms"] = str(settings.fetch_wait_max_ms)
    kafka = KafkaSource(
        brokers,
        topics,
        tail=settings.tail,
        # No consumer group commits: without a recovery store a restart reads every
        # partition from its beginning again, so it may classify twice, never skip.
        starting_offset=OFFSET_BEGINNING,
        add_config=config,
        batch_size=settings.batch_size,
        raise_on_errors=False,
    )
    return ByteBudgetSource(kafka, settings.batch_max_bytes)


SourceItem = KafkaSourceMessage | KafkaSourceError


def _offset(item: SourceItem) -> int | None:
    return item.msg.offset if isinstance(item, KafkaSourceError) else item.offset


def _size(item: SourceItem) -> int:
    value = item.msg.value if isinstance(item, KafkaSourceError) else item.value
    return len(value or b"")


def _is_link_error(item: SourceItem) -> bool:
    """A consumer error about the connection, not about a record: no dead letter for it."""
    if not isinstance(item, KafkaSourceError):
        return False
    message = item.err.str() if hasattr(item.err, "str") else str(item.err)
    if item.msg.value is None and means_unreachable(f"{item.err!r} {message}"):
        LINK.down(message[:120])
        return True
    return False


class _ByteBudgetPartition(StatefulSourcePartition[SourceItem, int | None]):
    """Hands on at most ``max_bytes`` of record values per step (at least one record),
    keeping the rest of the consumer's batch for the next steps.

    Every label of a step leaves together, so a step's size bounds the latency a
    backlog adds: 16 records of 4,000 tokens are ~250 chunks, seconds of model time.
    """

    def __init__(self, inner: StatefulSourcePartition[SourceItem, int | None], max_bytes: int):
        self._inner = inner
        self._max_bytes = max_bytes
        self._held: deque[SourceItem] = deque()

    def next_batch(self) -> list[SourceItem]:
        if DRAIN.is_set():
            raise StopIteration  # records held back are resumed from their own offset
        if not self._held:
            fetched = self._inner.next_batch()  # StopIteration at the end passes on
            self._held.extend(x for x in fetched if not _is_link_error(x))
            if self._held:
                LINK.up()
        batch: list[SourceItem] = []
        size = 0
        while self._held and (not batch or size + _size(self._held[0]) <= self._max_bytes):
            item = self._held.popleft()
            batch.append(item)
            size += _size(item)
        return batch

    def next_awake(self) -> datetime | None:
        return None if self._held else self._inner.next_awake()

    def snapshot(self) -> int | None:
        # Held records have been consumed but not handed on: resume at the first of them.
        return _offset(self._held[0]) if self._held else self._inner.snapshot()

    def close(self) -> None:
        self._inner.close()


class ByteBudgetSource(FixedPartitionedSource[SourceItem, int | None]):
    """A Kafka source whose steps carry at most ``max_bytes`` of record values."""

    def __init__(self, kafka: KafkaSource, max_bytes: int):
        self._kafka = kafka
        self._max_bytes = max_bytes

    def list_parts(self) -> list[str]:
        announce_joined()  # Bytewax lists partitions once every peer is connected
        return self._kafka.list_parts()

    def build_part(
        self, step_id: str, for_part: str, resume_state: int | None
    ) -> _ByteBudgetPartition:
        inner = self._kafka.build_part(step_id, for_part, resume_state)
        start = "the beginning" if resume_state is None else f"offset {resume_state} (snapshot)"
        log.info("reading partition %s from %s", for_part, start)
        return _ByteBudgetPartition(inner, self._max_bytes)


class _DeliveryCheckedPartition(StatelessSinkPartition[Outgoing]):
    def __init__(self, config: dict[str, Any], topic: str | None, tolerance_s: float):
        self._producer = Producer(config)
        self._topic = topic
        self._tolerance_s = tolerance_s
        self._error: str | None = None
        self._written: set[str] = set()
        self.delivered = 0

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            if self._error is None:
                self._error = f"delivery to {msg.topic()} failed: {err.str()}"
            log.error("kafka delivery failed: %s", err.str())
        else:
            self.delivered += 1
            LINK.up()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise DeliveryFailed(self._error)

    def _topics(self) -> str:
        return ", ".join(sorted(self._written)) or str(self._topic)

    def write_batch(self, items: list[Outgoing]) -> None:
        self._raise_if_failed()
        for item in items:
            topic = item.topic or self._topic
            if topic is None:
                raise ValueError("a record without a topic for a sink without a default one")
            self._written.add(topic)
            while True:
                try:
                    self._producer.produce(
                        topic,
                        value=item.value,
                        key=item.key,
                        headers=list(item.headers) or None,
                        on_delivery=self._on_delivery,
                    )
                    break
                except BufferError:
                    # Local queue full: serve delivery reports to make room, then retry.
                    self._producer.poll(0.1)
            self._producer.poll(0)
        # Flush before returning, so that when Bytewax snapshots this epoch every record
        # it produced is acknowledged: a crash after the snapshot cannot lose output.
        self._flush()

    def _flush(self) -> None:
        """Wait until every record is acknowledged: through an outage of up to the
        tolerance (librdkafka keeps retrying them that long), then give up loudly."""
        started = time.monotonic()
        while True:
            remaining = self._producer.flush(_FLUSH_SLICE_S)
            self._raise_if_failed()
            if not remaining:
                return
            waited = time.monotonic() - started
            if waited >= self._tolerance_s:
                raise KafkaUnavailable(
                    f"Kafka unreachable for {waited:.0f} s (kafka.outage_tolerance_s ="
                    f" {self._tolerance_s:g}): {remaining} records to {self._topics()} not"
                    " acknowledged; they are re-read from the input on restart"
                )
            LINK.down(f"{remaining} records to {self._topics()} waiting")

    def close(self) -> None:
        self._flush()


class DeliveryCheckedSink(DynamicSink[Outgoing]):
    """Writes :class:`Outgoing` records to their topic (``topic`` for those that name
    none); a failed delivery raises, never vanishes. At least once: after a crash, what
    followed the last snapshot is written again.

    Each worker gets its own producer; records keyed by document id land on the
    partition Kafka's partitioner picks for that key.
    """

    def __init__(self, settings: KafkaSettings, topic: str | None = None) -> None:
        # librdkafka retries each record for longer than the job tolerates an outage, so
        # the sink, not a record's timeout, decides when an outage has lasted too long.
        retry = {"message.timeout.ms": str(int((settings.outage_tolerance_s + 30) * 1000))}
        self._config = SINK_CONFIG | retry | client_config(settings)  # kafka.extra may override
        self._topic = topic
        self._tolerance_s = settings.outage_tolerance_s

    def build(
        self, step_id: str, worker_index: int, worker_count: int
    ) -> _DeliveryCheckedPartition:
        return _DeliveryCheckedPartition(self._config, self._topic, self._tolerance_s)
