"""``kascade run`` as a user runs it: several worker processes, crash recovery, metrics."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import (
    cluster_addresses,
    documents,
    kascade_cli,
    kascade_run,
    output_count,
    output_ids,
    produce,
)

from kascade.dataflow.ports import free_port
from kascade.schemas import InputDocument
from kascade.schemas.kafka import KafkaSettings

pytestmark = pytest.mark.kafka


def test_two_worker_processes_classify_every_document(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(60)
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    proc = kascade_run(kafka_settings, exported["bert"], "--workers", "2", "--bounded")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert sorted(output_ids(kafka_settings)) == sorted(d.id for d in docs)


def test_a_run_says_what_it_runs_when_it_starts_and_what_it_did_when_it_stops(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(20)
    records = [(d.id.encode(), d.model_dump_json().encode()) for d in docs]
    produce(kafka_settings, [*records, (b"bad", b"not json")])
    proc = kascade_run(kafka_settings, exported["bert"], "--workers", "2", "--bounded")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    lines = err.strip().splitlines()
    k = kafka_settings
    assert f"running: kafka {k.brokers}: {k.input_topic} -> {k.output_topic}" in lines[0]
    assert "2 worker processes x 1 thread; delivery exactly_once" in lines[0]
    assert lines[-1].endswith(": 20 documents labeled (0 degraded), 1 dead letter")


def test_verbose_json_logs_reach_every_worker_process(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(4)
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    # The flags before the command, as a shell alias would put them.
    program = ("-m", "kascade", "-v", "--log-format", "json")
    proc = kascade_run(
        kafka_settings, exported["bert"], "--workers", "2", "--bounded", program=program
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    entries = [json.loads(line) for line in err.strip().splitlines()]
    reading = {e["worker"] for e in entries if e["message"].startswith("reading partition")}
    assert reading == {0, 1}
    assert entries[-1]["logger"] == "kascade.run" and entries[-1]["level"] == "INFO"


def test_no_document_is_lost_after_a_kill_9_and_a_restart(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = [InputDocument(id=f"r-{i}", text=d.text) for i, d in enumerate(documents(9) * 1000)]
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    recovery = ["--recovery-dir", str(tmp_path / "recovery"), "--snapshot-interval", "0.5"]

    first = kascade_run(kafka_settings, exported["bert"], *recovery)  # tails: never ends alone
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None:
        if output_count(kafka_settings) >= 100:
            break
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    done_before_kill = output_count(kafka_settings)
    assert 100 <= done_before_kill < len(docs), "the kill did not land mid-stream"

    second = kascade_run(kafka_settings, exported["bert"], *recovery, "--bounded")
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    ids = output_ids(kafka_settings)
    assert set(ids) == {d.id for d in docs}  # duplicates allowed, losses not
    # Resumed from a snapshot, not from the beginning of the topic.
    assert len(ids) < 2 * len(docs)


def test_metrics_are_served_while_the_job_runs(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(20)
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    port = free_port()
    proc = kascade_run(kafka_settings, exported["bert"], "--metrics-port", str(port))
    try:
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline:
            try:
                text = (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
                    .read()
                    .decode()
                )
            except OSError:
                text = ""
            if 'kascade_documents_out_total{degraded="false"} 20.0' in text:
                break
            time.sleep(0.3)
        assert "kascade_documents_in_total 20.0" in text
        assert 'kascade_documents_out_total{degraded="false"} 20.0' in text
        assert "kascade_chunks_full_model_total" in text
        assert 'kascade_stage_seconds_count{stage="full_model"}' in text
        assert "kascade_document_latency_seconds_count 20.0" in text
    finally:
        proc.terminate()
        proc.wait(30)


def test_two_hosts_run_one_job_when_each_gets_the_address_list_and_its_id(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = documents(40)
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    addresses = cluster_addresses(2)
    procs = [
        kascade_run(
            kafka_settings,
            exported["bert"],
            "--bounded",
            "--addresses",
            addresses,
            "--process-id",
            str(i),
            env={**os.environ, "KASCADE_CLUSTER__CONTROL_TOKEN": "test-cluster-token"},
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert sorted(output_ids(kafka_settings)) == sorted(d.id for d in docs)


def test_an_address_list_without_a_process_id_is_a_one_line_error(
    exported: dict[str, Path],
) -> None:
    r = kascade_cli(
        "run", "--model-dir", str(exported["bert"]), "--addresses", "127.0.0.1:1;127.0.0.1:2"
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kascade: invalid settings: addresses and process_id go together"
    ]
