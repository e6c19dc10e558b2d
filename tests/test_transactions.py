"""The transactional committer and the exactly-once sink's pieces against the real broker:
results are invisible to read_committed readers until committed, committed within the
interval without the worker waiting, and a producer whose id was taken over cannot
commit."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from kascade.dataflow.broker import SINK_CONFIG
from kascade.dataflow.consume import read_records
from kascade.dataflow.exactly_once import Ledger, committed_since, fence, route
from kascade.dataflow.transactions import Committer, TransactionFailed, transactional_config
from kascade.operators.formats import origin_header
from kascade.operators.items import Outgoing
from kascade.schemas import SourcePosition
from kascade.schemas.kafka import KafkaSettings

pytestmark = pytest.mark.kafka


def _committer(k: KafkaSettings, tid: str, interval_s: float) -> Committer:
    producer = Producer(
        transactional_config(SINK_CONFIG | {"bootstrap.servers": k.brokers}, tid, 30)
    )
    producer.init_transactions(30)
    return Committer(producer, interval_s=interval_s, tolerance_s=20, name=tid)


def _results(topic: str, n: int, partition: int = 0) -> list[Outgoing]:
    return [
        Outgoing(
            f"k{i}".encode(),
            b"v",
            origin_header(SourcePosition(topic="in", partition=partition, offset=i)),
            topic,
            SourcePosition(topic="in", partition=partition, offset=i),
        )
        for i in range(n)
    ]


def test_results_are_invisible_to_read_committed_readers_until_their_commit(
    kafka_settings: KafkaSettings,
) -> None:
    k = kafka_settings
    committer = _committer(k, f"t-{k.output_topic}", interval_s=3600)
    committer.send(_results(k.output_topic, 20))
    time.sleep(2)  # produced, the transaction open
    assert read_records(k, k.output_topic) == []
    offsets = committer.commit_all()
    assert len(read_records(k, k.output_topic)) == 20
    assert sum(offsets.values()) >= 20  # where a resume would read from: after them
    committer.close()


def test_results_are_committed_within_the_interval_without_the_worker_waiting(
    kafka_settings: KafkaSettings,
) -> None:
    k = kafka_settings
    committer = _committer(k, f"t-{k.output_topic}", interval_s=0.1)
    began = time.monotonic()
    committer.send(_results(k.output_topic, 50))
    assert time.monotonic() - began < 0.05  # handed over: the commit is the thread's
    got = read_records(k, k.output_topic, expect=50, timeout_s=10)
    assert len(got) == 50 and time.monotonic() - began < 5
    committer.close()


def test_a_result_after_a_quiet_spell_is_committed_at_once_and_the_next_within_the_interval(
    kafka_settings: KafkaSettings,
) -> None:
    k = kafka_settings
    interval_s = 6.0
    committer = _committer(k, f"t-{k.output_topic}", interval_s=interval_s)
    time.sleep(interval_s + 0.2)  # quiet: the last commit (the start) is an interval ago
    began = time.monotonic()
    committer.send(_results(k.output_topic, 1))
    assert len(read_records(k, k.output_topic, expect=1, timeout_s=10)) == 1
    assert time.monotonic() - began < interval_s / 2  # not an interval after it came
    second = _results(k.output_topic, 2)[1:]
    committer.send(second)  # the commit before it began just now: it waits its turn
    time.sleep(0.5)
    assert len(read_records(k, k.output_topic)) == 1
    assert time.monotonic() - began < interval_s  # so it was read before its turn came
    assert len(read_records(k, k.output_topic, expect=2, timeout_s=2 * interval_s)) == 2
    committer.close()


def test_a_producer_whose_id_was_taken_over_cannot_commit(kafka_settings: KafkaSettings) -> None:
    k = kafka_settings
    tid = f"t-{k.output_topic}"
    zombie = _committer(k, tid, interval_s=3600)
    zombie.send(_results(k.output_topic, 5))
    fence({"bootstrap.servers": k.brokers}, [tid], 30)  # its replacement starts
    with pytest.raises(TransactionFailed):
        zombie.commit_all()
    assert read_records(k, k.output_topic) == []  # its open transaction was aborted


def test_a_resume_finds_the_results_of_its_own_input_partition_committed_after_its_offsets(
    kafka_settings: KafkaSettings,
) -> None:
    k = kafka_settings
    committer = _committer(k, f"t-{k.output_topic}", interval_s=3600)
    committer.send(_results(k.output_topic, 3, partition=0))
    before = committer.commit_all()
    committer.send(_results(k.output_topic, 5, partition=0)[3:])
    committer.send(_results(k.dead_letter_topic, 2, partition=1))
    committer.commit_all()
    committer.close()
    found, ends = committed_since(k, before, "in:0:")
    assert found == {"in:0:3", "in:0:4"}  # not before the offsets, not partition 1's
    assert committed_since(k, ends, "in:0:")[0] == set()


def test_results_route_to_the_sink_partition_of_their_input_partition() -> None:
    (item,) = _results("out", 1, partition=3)
    assert route(item, "in") == ("3", item)
    assert route(item, "another-input") == ("0", item)
    ledger = Ledger(replayed={"in:3:0"})
    assert ledger.repeats(item.origin) and not ledger.repeats(item.origin)
