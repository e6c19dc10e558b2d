"""``kascade sample`` on someone else's events: Avro records through a real Schema
Registry and the run's own field mapping, spread over partitions and languages, the
records a run would dead-letter skipped, written as calibration text."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from helpers import kascade_cli, texts
from tiny_models import CORPUS

from kascade.schemas.kafka import KafkaSettings
from kascade.toolchain.data import read_examples

pytestmark = pytest.mark.kafka

POST = {
    "type": "record",
    "name": "Post",
    "namespace": "com.acme.forum",
    "fields": [
        {"name": "post_id", "type": "string"},
        {"name": "body", "type": "string"},
        {"name": "language", "type": "string"},
    ],
}


def test_sample_reads_avro_events_through_the_mapping_spread_over_partitions_and_languages(
    kafka_settings: KafkaSettings, schema_registry_url: str, tmp_path: Path
) -> None:
    registry = SchemaRegistryClient({"url": schema_registry_url})
    ser = AvroSerializer(registry, json.dumps(POST))
    ctx = SerializationContext(kafka_settings.input_topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka_settings.brokers})
    bodies = {}
    # Partition 0 is busy and mostly German; partition 1 is quiet and French.
    for i in range(300):
        lang, partition = ("de", 0) if i % 10 else ("en", 0)
        if i < 40:
            lang, partition = "fr", 1
        body = f"{CORPUS[i % len(CORPUS)]} ({i})"
        bodies[body] = lang
        event = {"post_id": f"p{i}", "body": body, "language": lang}
        producer.produce(kafka_settings.input_topic, ser(event, ctx), partition=partition)
    for bad in (b"not avro at all", b"\x00\x00\x00\x00\x01garbage"):
        for partition in (0, 1):
            producer.produce(kafka_settings.input_topic, bad, partition=partition)
    assert producer.flush(30) == 0
    config = tmp_path / "kascade.toml"
    config.write_text(
        "[input]\n"
        'format = "avro"\ntext = ["body"]\nid = "post_id"\nlang = "language"\n'
        f'[registry]\nurl = "{schema_registry_url}"\n'
    )
    out = tmp_path / "stream.jsonl"
    r = kascade_cli(
        "sample",
        "--config",
        str(config),
        "--brokers",
        kafka_settings.brokers,
        "--input-topic",
        kafka_settings.input_topic,
        "--count",
        "60",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 60
    assert out.stat().st_mode & 0o777 == 0o600  # production text: its owner's only
    assert all(bodies[row["text"]] == row["lang"] for row in rows)  # decoded, not raw bytes
    langs = Counter(row["lang"] for row in rows)
    # One from each (partition, language) in turn: the quiet partition's French (13% of
    # the topic) and the rare English (9%) are not crowded out by the busy German.
    assert langs["fr"] >= 20 and langs["en"] >= 10 and langs["de"] >= 20, langs
    assert "4 of" in r.stdout and "skipped as dead letters" in r.stdout  # the malformed ones
    examples = read_examples(out, text_column="text", label_column="lang")
    assert len(examples) == 60  # what kascade calibrate --texts reads


def test_sample_of_a_topic_without_a_readable_record_is_one_line(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_settings.brokers})
    producer.produce(kafka_settings.input_topic, b"{not json")
    assert producer.flush(30) == 0
    r = kascade_cli(
        "sample",
        "--brokers",
        kafka_settings.brokers,
        "--input-topic",
        kafka_settings.input_topic,
        "--count",
        "5",
        "--out",
        str(tmp_path / "x.jsonl"),
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"kascade: {kafka_settings.input_topic} has no record to sample (1 read, 1 of them"
        " would be dead letters)"
    ]
    assert not (tmp_path / "x.jsonl").exists()


def _peak_rss_mb(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """``kascade ARGS`` in a fresh process, with the peak resident memory it reached."""
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)\n"
        "sys.stderr.write(r.stderr); sys.stdout.write(r.stdout)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
        "sys.exit(r.returncode)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "kascade", *args],
        capture_output=True,
        text=True,
        timeout=400,
    )
    *out, peak = r.stdout.strip().splitlines()
    r.stdout = "\n".join(out)
    return r, float(peak)


def test_sample_holds_bounded_memory_whatever_the_record_sizes(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    # 240 records of ~900 KB (216 MB): the whole read window of --count 60. Holding the
    # candidates' text, as sample once did, costs their size; streaming costs a few.
    producer = Producer({"bootstrap.servers": kafka_settings.brokers})
    filler = " ".join(CORPUS) + " "
    text = (filler * (900_000 // len(filler) + 1))[:900_000]
    for i in range(240):
        doc = {"id": f"big-{i}", "text": f"{i} {text}", "lang": ("de", "fr", "ja")[i % 3]}
        producer.produce(kafka_settings.input_topic, json.dumps(doc).encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    common = ["sample", "--brokers", kafka_settings.brokers]
    common += ["--input-topic", kafka_settings.input_topic, "--count"]
    small, small_peak = _peak_rss_mb([*common, "1", "--out", str(tmp_path / "one.jsonl")])
    assert small.returncode == 0, small.stderr
    out = tmp_path / "big.jsonl"
    big, big_peak = _peak_rss_mb([*common, "60", "--out", str(out)])
    assert big.returncode == 0, big.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 60 and Counter(r["lang"] for r in rows) == {"de": 20, "fr": 20, "ja": 20}
    # 60 texts of 900 KB are 54 MB on disk; in hand at once: the prefetch and a batch
    assert big_peak - small_peak < 60, (small_peak, big_peak)


def test_a_sample_of_a_stream_with_untagged_and_blank_records_calibrates(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    """The documented recovery loop's first two steps on a stream as it comes: some
    records name a language, some do not, some texts are blank."""
    producer = Producer({"bootstrap.servers": kafka_settings.brokers})
    for i, text in enumerate(texts(240)):
        doc: dict = {"id": f"d{i}", "text": text if i % 20 else "   "}
        if i % 3:
            doc["lang"] = ("de", "fr")[i % 2]
        producer.produce(kafka_settings.input_topic, json.dumps(doc).encode())
    assert producer.flush(30) == 0
    out = tmp_path / "stream.jsonl"
    r = kascade_cli(
        "sample", "--brokers", kafka_settings.brokers, "--input-topic",
        kafka_settings.input_topic, "--count", "200", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "12 as blank" in r.stdout, r.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 200 and all(row["text"].strip() for row in rows)
    assert {row.get("lang") for row in rows} == {None, "de", "fr"}
    model = tmp_path / "model"
    shutil.copytree(exported["modernbert"], model)
    r = kascade_cli(
        "calibrate", "--model", str(model), "--texts", str(out), "--lang-column", "lang",
        "--epsilon", "0.1", "--delta", "0.1", "--chunk-tokens", "64", "--overlap", "8",
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert {line.split(":")[0].strip() for line in r.stdout.splitlines()[4:7]} == {
        "und",
        "de",
        "fr",
    }, r.stdout
