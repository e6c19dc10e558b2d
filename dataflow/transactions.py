"""A Kafka transactional producer that commits in a thread of its own.

A commit takes 10-30 ms on a local broker (docs/BENCHMARKS.md, section 17); made on the
worker's thread it would stall the model that often. :class:`Committer` takes records
from the worker without blocking, produces them into an open transaction, and commits it
as soon as the previous commit began ``interval_s`` ago or more: a record after a quiet
spell is committed at once, and under load the records that came during one commit
share the next (a group commit: at most one commit per interval, none waited for without
need). :meth:`Committer.commit_all` (called when Bytewax snapshots) blocks until
everything handed over is committed.

Errors follow librdkafka's transactional contract: a retriable one is retried until the
outage tolerance is spent; one that needs an abort aborts, and the transaction's records
(kept until committed) are produced again in a new one; a fatal one (this producer was
fenced: another process took its transactional id over) stops the committer, and the
worker's next call raises it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kascade.dataflow.health import LINK
from kascade.errors import KascadeError
from kascade.operators.items import Outgoing

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Records handed over and not yet produced beyond which the worker waits (an outage):
# the sink holds the flow back instead of its memory growing without bound.
MAX_WAITING = 20_000
# A transaction whose commit keeps needing an abort is given up after this many tries.
MAX_ABORTS = 5
_SLICE_S = 5.0
_RETRY_PAUSE_S = 0.2


class TransactionFailed(KascadeError):
    """A transaction could not be committed; what it held is re-read from the input."""


class Committer:
    """Produces what the worker hands over into transactions, committed on an interval.

    ``committed()`` tells, per output topic partition, the offset after the last record
    this producer committed: where a resume reads from to learn what it committed since.
    """

    def __init__(
        self,
        producer: Producer,
        *,
        interval_s: float,
        tolerance_s: float,
        name: str,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._producer = producer
        self._interval_s = interval_s
        self._tolerance_s = tolerance_s
        self._name = name
        self._now = now
        self._cond = threading.Condition()
        # Shared with the worker's thread, under _cond:
        self._outbox: list[Outgoing] = []
        self._flush = False
        self._stopping = False
        self._failed: BaseException | None = None
        self._stalled = False  # a commit is retrying through an outage
        self._committed: dict[TopicPartition, int] = {}
        # The committer's thread only:
        self._txn: list[Outgoing] = []
        self._txn_offsets: dict[TopicPartition, int] = {}
        self._txn_due: float | None = None
        # When the previous commit began; a new producer counts its start as one, so
        # its first interval is a whole one, like every later one.
        self._last_commit = now()
        self._delivery_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # The worker's side.

    def send(self, items: list[Outgoing]) -> None:
        """Hand records over for the next transaction; waits only while the committer is
        far behind (an outage), and raises what made it stop."""
        if not items:
            return
        with self._cond:
            # While a commit waits out an outage, so does the flow (as a sink that
            # flushes would): reading on would only pile results up in memory.
            while (self._stalled or len(self._outbox) >= MAX_WAITING) and self._failed is None:
                self._cond.wait(_SLICE_S)
            self._raise_if_failed()
            self._outbox.extend(items)
            self._cond.notify_all()

    def commit_all(self) -> dict[TopicPartition, int]:
        """Commit everything handed over so far; returns :meth:`committed`."""
        with self._cond:
            self._flush = True
            self._cond.notify_all()
            while self._flush and self._failed is None:
                self._cond.wait(_SLICE_S)
            self._raise_if_failed()
            return dict(self._committed)

    def close(self) -> None:
        """Commit what is left and stop the thread."""
        try:
            self.commit_all()
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            self._thread.join(_SLICE_S)

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            if isinstance(self._failed, KascadeError):
                raise self._failed
            raise TransactionFailed(f"{self._name}: {self._failed}") from self._failed

    # The committer's thread.

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._outbox or self._flush or self._stopping or self._due()):
                        self._cond.wait(self._wait_s())
                    batch, self._outbox = self._outbox, []
                    flush, stopping = self._flush, self._stopping
                    self._cond.notify_all()  # a worker waiting for room
                if batch:
                    self._produce(batch)
                if self._txn and (flush or self._due()):
                    self._commit()
                if flush:
                    with self._cond:
                        if not self._outbox:  # all handed over before the request is in
                            self._flush = False
                            self._cond.notify_all()
                if stopping:
                    return
        except BaseException as e:  # the worker raises it on its next call
            with self._cond:
                self._failed = e
                self._cond.notify_all()

    def _due(self) -> bool:
        return self._txn_due is not None and self._now() >= self._txn_due

    def _wait_s(self) -> float | None:
        return None if self._txn_due is None else max(0.0, self._txn_due - self._now())

    def _produce(self, batch: list[Outgoing]) -> None:
        if not self._txn:
            self._producer.begin_transaction()
            self._txn_due = max(self._now(), self._last_commit + self._interval_s)
        for item in batch:
            self._send_one(item)
        self._txn.extend(batch)
        self._producer.poll(0)

    def _send_one(self, item: Outgoing) -> None:
        # The flow addresses each record it hands this producer (output or dead letters).
        assert item.topic is not None, "a record for the exactly-once producer names its topic"
        while True:
            try:
                self._producer.produce(
                    item.topic,
                    value=item.value,
                    key=item.key,
                    headers=list(item.headers) or None,
                    on_delivery=self._on_delivery,
                )
                return
            except BufferError:  # the local queue is full: serve reports to make room
                self._producer.poll(0.1)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._delivery_error = f"delivery to {msg.topic()} failed: {err.str()}"
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        self._txn_offsets[tp] = max(self._txn_offsets.get(tp, 0), offset + 1)

    def _commit(self) -> None:
        """Commit the open transaction: through retriable errors up to the tolerance, and
        through aborts by producing its records again."""
        started = self._last_commit = self._now()
        aborts = 0
        aborting = False
        while True:
            try:
                if aborting:
                    self._retry_aborted()
                    aborting = False
                self._producer.flush(_SLICE_S)
                self._producer.commit_transaction(_SLICE_S)
                break
            except KafkaException as e:
                err: KafkaError = e.args[0]
                waited = self._now() - started
                cause = self._delivery_error or err.str()
                if err.fatal():
                    raise TransactionFailed(f"{self._name}: {err.str()}") from None
                if err.txn_requires_abort() and not aborting:
                    aborts += 1
                    if aborts > MAX_ABORTS:
                        raise TransactionFailed(f"{self._name}: {cause}") from None
                    log.warning(
                        "%s: transaction aborted (%s); producing it again", self._name, cause
                    )
                    aborting = True
                    continue
                if (err.retriable() or aborting) and waited < self._tolerance_s:
                    LINK.down(f"{self._name}: {err.str()}")
                    self._stall(True)
                    time.sleep(_RETRY_PAUSE_S)  # some errors return at once
                    continue
                raise TransactionFailed(
                    f"{self._name}: no commit within {waited:.0f} s: {cause}"
                ) from None
        LINK.up()
        self._stall(False)
        with self._cond:
            for tp, offset in self._txn_offsets.items():
                self._committed[tp] = max(self._committed.get(tp, 0), offset)
        self._txn, self._txn_offsets, self._txn_due = [], {}, None
        self._delivery_error = None

    def _stall(self, stalled: bool) -> None:
        with self._cond:
            if self._stalled != stalled:
                self._stalled = stalled
                self._cond.notify_all()

    def _retry_aborted(self) -> None:
        self._producer.abort_transaction(_SLICE_S)
        self._txn_offsets, self._delivery_error = {}, None
        self._producer.begin_transaction()
        for item in self._txn:
            self._send_one(item)


def transactional_config(
    base: dict[str, Any], transactional_id: str, timeout_s: float
) -> dict[str, Any]:
    """``base`` producer settings for the transactional id: records may wait for their
    broker no longer than their transaction may stay open (librdkafka requires it)."""
    timeout_ms = str(int(timeout_s * 1000))
    return base | {
        "transactional.id": transactional_id,
        "transaction.timeout.ms": timeout_ms,
        "message.timeout.ms": timeout_ms,
    }
