"""The source's byte budget: steps stay small, nothing is skipped or repeated, resumes are exact."""

from __future__ import annotations

from bytewax.connectors.kafka import KafkaError as KafkaSourceError
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.inputs import StatefulSourcePartition
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from kascade.dataflow.kafka_io import _ByteBudgetPartition


def message(offset: int, size: int) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=None, value=b"x" * size, topic="in", offset=offset)


class ListPartition(StatefulSourcePartition):
    """A partition over fixed records, read in consumer batches of ``batch`` like Kafka's."""

    def __init__(self, sizes: list[int], batch: int, start: int = 0):
        self.records = [message(i, n) for i, n in enumerate(sizes)]
        self.batch = batch
        self.next = start

    def next_batch(self) -> list:
        if self.next >= len(self.records):
            raise StopIteration
        out = self.records[self.next : self.next + self.batch]
        self.next += len(out)
        return out

    def snapshot(self) -> int:
        return self.next


def drain(part: _ByteBudgetPartition) -> list[list]:
    steps = []
    while True:
        try:
            steps.append(part.next_batch())
        except StopIteration:
            return steps


@given(
    sizes=st.lists(st.integers(0, 5_000), max_size=60),
    batch=st.integers(1, 20),
    budget=st.integers(1, 12_000),
)
def test_every_record_is_handed_on_once_in_order_in_steps_within_the_budget(
    sizes: list[int], batch: int, budget: int
) -> None:
    steps = drain(_ByteBudgetPartition(ListPartition(sizes, batch), budget))
    assert [m.offset for step in steps for m in step] == list(range(len(sizes)))
    for step in steps:
        assert step, "a step hands on at least one record"
        assert len(step) == 1 or sum(len(m.value) for m in step) <= budget


def test_one_record_larger_than_the_budget_still_moves_alone() -> None:
    part = _ByteBudgetPartition(ListPartition([100, 50_000, 100], batch=16), max_bytes=1_000)
    assert [[m.offset for m in step] for step in drain(part)] == [[0], [1], [2]]


@given(
    sizes=st.lists(st.integers(0, 3_000), min_size=1, max_size=40),
    batch=st.integers(1, 20),
    budget=st.integers(1, 8_000),
    steps_before_crash=st.integers(0, 10),
)
def test_a_resume_from_the_snapshot_continues_after_the_last_record_handed_on(
    sizes: list[int], batch: int, budget: int, steps_before_crash: int
) -> None:
    part = _ByteBudgetPartition(ListPartition(sizes, batch), budget)
    handed_on = []
    for _ in range(steps_before_crash):
        try:
            handed_on += part.next_batch()
        except StopIteration:
            break
    # Records the consumer fetched but the step did not hand on must be read again.
    resumed = _ByteBudgetPartition(ListPartition(sizes, batch, start=part.snapshot()), budget)
    rest = [m for step in drain(resumed) for m in step]
    assert [m.offset for m in handed_on + rest] == list(range(len(sizes)))


def test_a_consumer_error_is_budgeted_and_resumed_by_its_records_offset() -> None:
    inner = ListPartition([10, 10], batch=16)
    inner.records[1] = KafkaSourceError(KafkaError(KafkaError._MSG_TIMED_OUT), message(1, 900))
    part = _ByteBudgetPartition(inner, max_bytes=500)
    assert [m.offset for m in part.next_batch()] == [0]
    assert part.snapshot() == 1
    assert isinstance(part.next_batch()[0], KafkaSourceError)
