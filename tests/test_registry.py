"""The registry seen from a worker: outages are ridden out up to the tolerance, then
named; errors about a record or a schema pass on at once."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError

from kascade.dataflow.ports import free_port
from kascade.operators.registry import RegistryUnavailable, is_outage, riding_outages
from kascade.schemas.events import RegistrySettings

SETTINGS = RegistrySettings(url="http://registry:8081", outage_tolerance_s=30)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def sleep(self, s: float) -> None:
        self.waits.append(s)
        self.now += s


def test_an_outage_longer_than_the_tolerance_stops_with_the_cause() -> None:
    clock = _Clock()

    def down() -> None:
        raise SchemaRegistryError(503, 50301, "unavailable")

    with pytest.raises(RegistryUnavailable, match=r"unreachable for 3\d s .*tolerance_s = 30"):
        riding_outages(SETTINGS, down, sleep=clock.sleep, clock=lambda: clock.now)
    assert clock.waits[:4] == [0.5, 1.0, 2.0, 4.0] and max(clock.waits) == 10.0


def test_a_missing_schema_is_not_an_outage_and_is_not_retried() -> None:
    calls = []

    def missing() -> None:
        calls.append(1)
        raise SchemaRegistryError(404, 40403, "Schema not found")

    with pytest.raises(SchemaRegistryError):
        riding_outages(SETTINGS, missing, sleep=lambda s: None)
    assert calls == [1]


def test_a_refused_connection_counts_as_an_outage() -> None:
    client = SchemaRegistryClient({"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0})
    with pytest.raises(Exception) as e:
        client.get_subjects()
    assert is_outage(e.value)
