"""What reading and writing other people's events costs per record, next to a model call.

python -m bench.formats [--registry URL]   # default: starts docker/registry-local.sh

Reads a ~2,000-character ticket in each input format and writes its result in each
output shape, through the same Reader and Writer the flow uses (schemas cached after
the first record, as in a running job); prints the median microseconds of 5 x 2,000.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench.env import environment
from kascade.dataflow.ports import free_port
from kascade.demo.local_broker import ensure_local_registry
from kascade.operators.formats import Reader, Writer
from kascade.operators.items import Envelope
from kascade.schemas import ChunkCounts, ModelIdentity, OutputRecord
from kascade.schemas.events import InputSettings, OutputSettings, RegistrySettings

TICKET = {
    "type": "record",
    "name": "Ticket",
    "namespace": "bench",
    "fields": [{"name": n, "type": "string"} for n in ("ticket_id", "subject", "body")],
}
MAPPED = {"text": ["subject", "body"], "id": "ticket_id"}


def median_us(call: Callable[[], object], n: int = 2000, repeats: int = 5) -> float:
    call()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            call()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def measure(url: str) -> dict[str, float]:
    reg = RegistrySettings(url=url)
    event = {"ticket_id": "T-1", "subject": "Printer", "body": "word " * 400}
    ctx = SerializationContext("bench-in", MessageField.VALUE)
    avro = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(TICKET))(event, ctx)
    own = json.dumps({"id": "T-1", "text": event["subject"] + "\n\n" + event["body"]}).encode()
    cases = {
        "kascade record": (Reader(InputSettings(), reg), own),
        "json, mapped": (
            Reader(InputSettings(format="json", **MAPPED), reg, True),
            json.dumps(event).encode(),
        ),
        "avro, mapped": (Reader(InputSettings(format="avro", **MAPPED), reg, True), avro),
    }
    out = {}
    for name, (reader, raw) in cases.items():
        out[f"read {name}"] = median_us(
            lambda r=reader, v=raw: r.read(v, key=b"k", topic="bench-in", headers=())
        )
    read = cases["avro, mapped"][0].read(avro, key=b"k", topic="bench-in", headers=())
    record = OutputRecord(
        id="T-1",
        label="a",
        score=0.9,
        scores={"a": 0.9, "b": 0.1},
        aggregation="token_mean",
        chunks=ChunkCounts(total=2, full_model=2),
        latency_ms=1.0,
        model=ModelIdentity(name="m", variant="v", manifest_sha256="0" * 64),
    )
    envelope = Envelope(b"k", (), read.event, read.schema_id)
    shapes = {
        "label record, json": OutputSettings(),
        "enriched, json": OutputSettings(shape="enriched"),
        "enriched, avro": OutputSettings(shape="enriched", format="avro"),
    }
    for name, shape in shapes.items():
        writer = Writer(shape, reg, "bench-out")
        out[f"write {name}"] = median_us(lambda w=writer: w.value(record, envelope))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", help="Confluent-compatible registry URL")
    args = parser.parse_args()
    local = None if args.registry else ensure_local_registry(free_port())
    try:
        results = measure(args.registry if local is None else local.url)
    finally:
        if local is not None:
            local.stop()
    print(json.dumps({"environment": environment(), "median_us": results}, indent=1))


if __name__ == "__main__":
    main()
