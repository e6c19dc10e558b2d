"""Kafka edges against the real broker: bounded start-up, and deliveries that cannot vanish."""

from __future__ import annotations

import time

import pytest

from kascade.dataflow.broker import KafkaUnavailable, check_cluster
from kascade.dataflow.consume import read_records
from kascade.dataflow.kafka_io import DeliveryCheckedSink, DeliveryFailed
from kascade.dataflow.ports import free_port
from kascade.operators.items import Outgoing
from kascade.schemas.kafka import KafkaSettings

pytestmark = pytest.mark.kafka


def test_an_unreachable_broker_fails_with_a_clear_error_within_the_timeout() -> None:
    settings = KafkaSettings(brokers=f"127.0.0.1:{free_port()}", connect_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=r"cannot reach Kafka at 127\.0\.0\.1"):
        check_cluster(settings, ["anything"])
    assert time.monotonic() - start < 10


def test_a_missing_topic_is_named_in_the_error(kafka_bootstrap: str, topic_factory) -> None:
    present = topic_factory("present", partitions=3)
    settings = KafkaSettings(brokers=kafka_bootstrap)
    with pytest.raises(KafkaUnavailable, match="no topic 'absent-topic'"):
        check_cluster(settings, [present, "absent-topic"])
    assert check_cluster(settings, [present]) == {present: 3}


def test_the_sink_delivers_every_record_with_its_key_and_headers(
    kafka_bootstrap: str, topic_factory
) -> None:
    topic = topic_factory("sink", partitions=2)
    part = DeliveryCheckedSink(KafkaSettings(brokers=kafka_bootstrap), topic).build("s", 0, 1)
    sent = [Outgoing(f"k{i}".encode(), f"v{i}".encode(), [("n", b"%d" % i)]) for i in range(50)]
    part.write_batch(sent)
    part.close()
    got = read_records(KafkaSettings(brokers=kafka_bootstrap), topic, expect=50)
    key = lambda r: (r.key, r.value, list(r.headers))  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, sent))


def test_a_failed_delivery_raises_instead_of_vanishing(kafka_bootstrap: str) -> None:
    # The local broker does not auto-create topics, so this write can never succeed;
    # Bytewax's own KafkaSink would drop it without a word.
    settings = KafkaSettings(
        brokers=kafka_bootstrap,
        extra={"message.timeout.ms": "1500", "topic.metadata.refresh.interval.ms": "200"},
    )
    part = DeliveryCheckedSink(settings, "no-such-topic-here").build("s", 0, 1)
    with pytest.raises(DeliveryFailed, match="no-such-topic-here"):
        part.write_batch([Outgoing(b"k", b"v")])


def test_a_sink_waits_out_an_outage_up_to_the_tolerance_then_names_the_cause() -> None:
    settings = KafkaSettings(brokers=f"127.0.0.1:{free_port()}", outage_tolerance_s=6)
    part = DeliveryCheckedSink(settings, "t").build("s", 0, 1)
    start = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=r"Kafka unreachable for \d+ s .*1 records to t"):
        part.write_batch([Outgoing(b"k", b"v")])
    assert 6 <= time.monotonic() - start < 20
