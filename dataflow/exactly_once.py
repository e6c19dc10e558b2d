"""Exactly-once delivery: the result of each input record (a label or a dead letter)
reaches its topic once, for consumers reading with ``isolation.level=read_committed``,
whatever process dies when.

Bytewax resumes from its last snapshot and replays what followed it; it says nothing
when a snapshot is durable. So results are written in Kafka transactions that commit
*before* each snapshot, and a resume learns from Kafka itself what it committed after
the snapshot it resumed from (README, "Exactly once: how it holds"):

- One sink partition per input partition, each with its own transactional id
  (``<kafka.transactional_id>-<partition>``): every result goes to the partition of its
  input record (its *origin*), and every result carries its origin in the
  ``kascade-origin`` header.
- A partition commits what it was given as soon as its previous commit began
  ``kafka.commit_interval_ms`` ago (:class:`~kascade.dataflow.transactions.Committer`:
  a group commit, so a result waits at most that long plus one commit) and always before
  its snapshot is taken; the snapshot (:class:`Ledger`) holds, per output topic
  partition, the offset after its last committed record.
- At every start, before any partition is built, the job fences each of its
  transactional ids (:func:`fence`): a zombie of the previous run can no longer commit,
  and its open transactions are aborted.
- A partition that resumes reads, from its snapshot's offsets to the end of both topics,
  the committed results of its own input partition: those are the results the replay
  brings again, and it drops them (once each).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from kascade.dataflow.broker import SINK_CONFIG, KafkaUnavailable, client_config
from kascade.dataflow.kafka_io import headers_of
from kascade.dataflow.transactions import Committer, TransactionFailed, transactional_config
from kascade.errors import UsageError
from kascade.operators import metrics
from kascade.operators.formats import ORIGIN_HEADER
from kascade.operators.items import Outgoing
from kascade.schemas import SourcePosition
from kascade.schemas.kafka import KafkaSettings

log = logging.getLogger(__name__)

# In the recovery directory: where each output topic partition ended when the store was
# created, for a partition that resumes without a snapshot of its own.
START_FILE = "delivery-start.json"

TopicPartitionKey = tuple[str, int]


@dataclass
class Ledger:
    """A sink partition's account of its own output, kept in Bytewax's snapshots.

    ``scan_from``: per output topic partition, the offset after the last record this
    partition committed before the snapshot; a resume reads from there. ``replayed``:
    origins whose results were committed after the snapshot the run resumed from; the
    replay brings each again, and it is dropped.

    >>> ledger = Ledger(replayed={"in:0:5"})
    >>> origin = SourcePosition(topic="in", partition=0, offset=5)
    >>> ledger.repeats(origin), ledger.repeats(origin)
    (True, False)
    >>> ledger.committed({("out", 1): 40}); ledger.committed({("out", 1): 12}); ledger.scan_from
    {('out', 1): 40}
    """

    scan_from: dict[TopicPartitionKey, int] = field(default_factory=dict)
    replayed: set[str] = field(default_factory=set)

    def repeats(self, origin: SourcePosition | None) -> bool:
        """Whether this result was committed before the replay: drop it (once)."""
        if origin is None or origin.key not in self.replayed:
            return False
        self.replayed.discard(origin.key)
        return True

    def committed(self, offsets: dict[TopicPartitionKey, int]) -> None:
        for tp, offset in offsets.items():
            self.scan_from[tp] = max(self.scan_from.get(tp, 0), offset)

    def copy(self) -> Ledger:
        return Ledger(dict(self.scan_from), set(self.replayed))


def part_name(partition: int) -> str:
    """Sink partitions sort like the input partitions they serve (Bytewax indexes them
    sorted)."""
    return f"{partition:05d}"


def route(item: Outgoing, input_topic: str) -> tuple[str, Outgoing]:
    """``(sink partition key, item)``: a result goes to its input record's partition."""
    o = item.origin
    return (str(o.partition) if o is not None and o.topic == input_topic else "0", item)


def _end_offsets(consumer: Consumer, topics: list[str], timeout_s: float) -> dict:
    """``{(topic, partition): (low, high)}`` watermarks of every partition of ``topics``."""
    ends = {}
    for topic in topics:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        for p in meta.partitions:
            tp = TopicPartition(topic, p)
            ends[(topic, p)] = consumer.get_watermark_offsets(tp, timeout_s, cached=False)
    return ends


def _consumer(settings: KafkaSettings) -> Consumer:
    return Consumer(
        client_config(settings)
        | {
            "group.id": f"kascade-resume-{uuid.uuid4().hex}",
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": "50",
        }
    )


def record_start(settings: KafkaSettings, recovery_dir: Path) -> None:
    """Note where the output topics end, once, before the recovery store first exists."""
    path = recovery_dir / START_FILE
    if path.exists():
        return
    if any(recovery_dir.glob("part-*")):
        # Without the note, a resume cannot tell which committed results came after its
        # snapshot; and a store from before exactly-once delivery keys documents by id.
        raise UsageError(
            f"{recovery_dir} holds snapshots of a run without exactly-once delivery "
            "(an at_least_once run or an older kascade): drain that job and start with an "
            "empty --recovery-dir, or run with --delivery at_least_once"
        )
    consumer = _consumer(settings)
    try:
        topics = [settings.output_topic, settings.dead_letter_topic]
        ends = _end_offsets(consumer, topics, settings.connect_timeout_s)
    except KafkaException as e:
        raise KafkaUnavailable(f"cannot read where the output topics end: {e}") from None
    finally:
        consumer.close()
    recovery_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({f"{t}:{p}": high for (t, p), (_, high) in ends.items()}))
    os.replace(tmp, path)


def _read_start(recovery_dir: Path | None) -> dict[TopicPartitionKey, int] | None:
    if recovery_dir is None or not (recovery_dir / START_FILE).is_file():
        return None
    raw = json.loads((recovery_dir / START_FILE).read_text())
    return {(k.rpartition(":")[0], int(k.rpartition(":")[2])): v for k, v in raw.items()}


def _position(msg: Message) -> tuple[TopicPartitionKey, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return (topic, partition), offset


def committed_since(
    settings: KafkaSettings, scan_from: dict[TopicPartitionKey, int], origin_prefix: str
) -> tuple[set[str], dict[TopicPartitionKey, int]]:
    """The origins starting with ``origin_prefix`` of results committed to the output
    and dead-letter topics from ``scan_from`` (a partition it does not name: from its
    beginning) to their ends; and where each topic partition ended.

    Called after this producer's transactional id was fenced, so none of its own
    transactions is still open: everything it ever committed lies before the ends.
    """
    consumer = _consumer(settings)
    try:
        topics = [settings.output_topic, settings.dead_letter_topic]
        ends = _end_offsets(consumer, topics, settings.connect_timeout_s)
        starts = {tp: scan_from.get(tp, low) for tp, (low, _) in ends.items()}
        todo = {tp for tp, (_, high) in ends.items() if starts[tp] < high}
        consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in todo])
        found: set[str] = set()
        # Another job's transaction still open on these topics holds read_committed
        # readers back until the broker aborts it.
        deadline = time.monotonic() + settings.transaction_timeout_s + settings.connect_timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TransactionFailed(
                    f"could not read the output topics to their ends ({sorted(todo)}) within"
                    f" {settings.transaction_timeout_s + settings.connect_timeout_s:g} s: a"
                    " transaction of another producer stays open on them"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            tp, offset = _position(msg)
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                if offset >= ends[tp][1]:  # the end event's offset is the next one
                    todo.discard(tp)
                continue
            origin = dict(headers_of(msg)).get(ORIGIN_HEADER)
            if isinstance(origin, bytes) and origin.startswith(origin_prefix.encode()):
                found.add(origin.decode(errors="replace"))
            if offset + 1 >= ends[tp][1]:
                todo.discard(tp)
        return found, {tp: high for tp, (_, high) in ends.items()}
    finally:
        consumer.close()


def fence(config: dict[str, Any], ids: list[str], timeout_s: float) -> None:
    """Take every transactional id over (in parallel): each open transaction a previous
    run left is aborted, and a process of that run still alive can no longer commit."""

    def take(transactional_id: str) -> None:
        producer = Producer(transactional_config(config, transactional_id, timeout_s))
        producer.init_transactions(timeout_s)

    try:
        with ThreadPoolExecutor(max_workers=min(8, len(ids))) as pool:
            list(pool.map(take, ids))
    except KafkaException as e:
        raise TransactionFailed(f"cannot take the job's transactional ids over: {e}") from None


class _Part(StatefulSinkPartition[Outgoing, Ledger]):
    def __init__(self, committer: Committer, ledger: Ledger) -> None:
        self._committer = committer
        self._ledger = ledger

    def write_batch(self, values: list[Outgoing]) -> None:
        fresh = [v for v in values if not self._ledger.repeats(v.origin)]
        if len(fresh) < len(values):
            metrics.REPLAYS_DROPPED.inc(len(values) - len(fresh))
        self._committer.send(fresh)

    def snapshot(self) -> Ledger:
        # Bytewax calls this at the end of every epoch in which the partition wrote, after
        # the epoch's writes and before the next epoch's: the commit precedes the snapshot.
        self._ledger.committed(self._committer.commit_all())
        return self._ledger.copy()

    def close(self) -> None:
        self._committer.close()


class TransactionalSink(FixedPartitionedSink[Outgoing, Ledger]):
    """Writes each :class:`Outgoing` to its topic, once, in Kafka transactions: one sink
    partition and transactional id per input partition. Items are ``(key, Outgoing)``
    pairs from :func:`route`.

    ``recovery_dir`` is the run's Bytewax recovery store (``None``: a run without one,
    which reads its input from the beginning on every start and has nothing to resume).
    """

    def __init__(self, settings: KafkaSettings, recovery_dir: Path | None) -> None:
        self._settings = settings
        self._recovery_dir = recovery_dir
        self._config = SINK_CONFIG | client_config(settings)
        self._fenced = False
        self._lock = threading.Lock()

    def _ids(self, partitions: int) -> list[str]:
        prefix = self._settings.transactional_prefix()
        return [f"{prefix}-{p}" for p in range(partitions)]

    def list_parts(self) -> list[str]:
        k = self._settings
        consumer = _consumer(k)
        try:
            meta = consumer.list_topics(k.input_topic, timeout=k.connect_timeout_s)
            partitions = len(meta.topics[k.input_topic].partitions)
        finally:
            consumer.close()
        # Bytewax builds no partition before every worker has listed its partitions, so
        # fencing here, at every start, happens before any producer of this run exists.
        with self._lock:
            if not self._fenced:
                fence(self._config, self._ids(partitions), k.transaction_timeout_s)
                self._fenced = True
        return [part_name(p) for p in range(partitions)]

    def part_fn(self, item_key: str) -> int:
        return int(item_key)

    def build_part(self, step_id: str, for_part: str, resume_state: Ledger | None) -> _Part:
        k = self._settings
        partition = int(for_part)
        transactional_id = f"{k.transactional_prefix()}-{partition}"
        producer = Producer(
            transactional_config(self._config, transactional_id, k.transaction_timeout_s)
        )
        try:
            producer.init_transactions(k.transaction_timeout_s)
        except KafkaException as e:
            raise TransactionFailed(f"{transactional_id}: {e}") from None
        ledger = resume_state.copy() if resume_state is not None else None
        if ledger is None:
            start = _read_start(self._recovery_dir)
            ledger = Ledger(scan_from=start or {})
            if start is None:  # no recovery store: nothing before this start to resume
                return self._part(producer, transactional_id, ledger)
        replayed, ends = committed_since(k, ledger.scan_from, f"{k.input_topic}:{partition}:")
        if replayed:
            log.info(
                "%s: %d results were committed after the snapshot", transactional_id, len(replayed)
            )
        ledger.replayed |= replayed
        ledger.committed(ends)  # accounted for: the next resume reads on from here
        return self._part(producer, transactional_id, ledger)

    def _part(self, producer: Producer, name: str, ledger: Ledger) -> _Part:
        k = self._settings
        committer = Committer(
            producer,
            interval_s=k.commit_interval_ms / 1000,
            tolerance_s=k.outage_tolerance_s,
            name=name,
        )
        return _Part(committer, ledger)
