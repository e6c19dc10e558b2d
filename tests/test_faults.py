"""Faults injected into a running ``kascade run`` through the real broker: a worker
killed with ``kill -9``, a record that kills its worker every time, the broker stopped
and started, SIGTERM, a corpus of good and malformed records. Each test asserts that
no document is lost and the job's exit status."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from crashing_flow import MARK
from helpers import documents, kascade_run, output_count, output_ids, produce, send

from kascade.dataflow.broker import create_topics
from kascade.dataflow.consume import read_all
from kascade.dataflow.ports import free_port
from kascade.demo.local_broker import ensure_local_broker
from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, OutputRecord
from kascade.schemas.kafka import KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

TESTS = Path(__file__).resolve().parent
FAST_RESTARTS = ("--restarts.backoff-s", "0.2", "--snapshot-interval-s", "0.5")


def many(n: int, prefix: str = "d") -> list[InputDocument]:
    return [InputDocument(id=f"{prefix}-{i}", text=d.text) for i, d in enumerate(documents(9) * n)]


def wait_for_outputs(settings: KafkaSettings, n: int, proc: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if output_count(settings) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} outputs within {timeout_s} s (exit {proc.poll()})")


def dead_letters(settings: KafkaSettings) -> list[DeadLetter]:
    return [
        DeadLetter.model_validate_json(v) for _, v in read_all(settings, settings.dead_letter_topic)
    ]


def workers_of(proc: subprocess.Popen) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if children:
            return children
        time.sleep(0.1)
    raise AssertionError("the job started no worker process")


def test_a_worker_killed_with_kill_9_is_restarted_from_the_snapshot_and_nothing_is_lost(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = many(300)
    send(kafka_settings, docs)
    port = free_port()
    recovery = ("--recovery-dir", str(tmp_path / "recovery"), *FAST_RESTARTS)
    job = kascade_run(
        kafka_settings, exported["bert"], "--workers", "2", "--metrics-port", str(port), *recovery
    )  # tails
    try:
        wait_for_outputs(kafka_settings, 100, job, timeout_s=120)
        workers_of(job)[1].kill()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and set(output_ids(kafka_settings)) != {
            d.id for d in docs
        }:
            assert job.poll() is None, "the job exited after losing a worker"
            time.sleep(0.5)
        assert set(output_ids(kafka_settings)) == {d.id for d in docs}
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"kascade_worker_restarts 1.0" in metrics
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert "worker 1 was killed by SIGKILL; restarting the workers" in err


def test_a_record_that_kills_its_worker_every_time_is_dead_lettered_and_the_job_goes_on(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    good = many(20)
    poison = InputDocument(id="poison", text=f"an ordinary start, then {MARK}")
    raw = poison.model_dump_json().encode()
    send(kafka_settings, good[:90])
    produce(kafka_settings, [(b"poison", raw)])
    send(kafka_settings, good[90:])
    job = kascade_run(
        kafka_settings,
        exported["bert"],
        "--workers",
        "2",
        "--bounded",
        "--recovery-dir",
        str(tmp_path / "recovery"),
        *FAST_RESTARTS,
        program=(str(TESTS / "crashing_flow.py"),),
        env=os.environ | {"PYTHONPATH": str(TESTS)},
    )
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err
    assert "killed 2 worker processes: it goes to the dead letters" in err
    assert set(output_ids(kafka_settings)) == {d.id for d in good}
    (dead,) = dead_letters(kafka_settings)
    assert dead.reason is DeadLetterReason.WORKER_DIED
    assert dead.detail == "2 worker processes died at stage kascade.chunk on this record"
    assert base64.b64decode(dead.original_b64) == raw


def test_a_job_that_keeps_failing_gives_up_after_its_restart_limit(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    # Every record kills: deaths are spread over many records, none condemned in time.
    produce(
        kafka_settings,
        [(None, InputDocument(id=f"p{i}", text=MARK).model_dump_json().encode()) for i in range(9)],
    )
    job = kascade_run(
        kafka_settings,
        exported["bert"],
        "--bounded",
        "--recovery-dir",
        str(tmp_path / "recovery"),
        *FAST_RESTARTS,
        "--restarts.limit",
        "2",
        "--restarts.quarantine-after",
        "5",
        program=(str(TESTS / "crashing_flow.py"),),
        env=os.environ | {"PYTHONPATH": str(TESTS)},
    )
    _, err = job.communicate(timeout=300)
    assert job.returncode == 1
    assert err.count("restarting the workers from the last snapshot") == 2
    assert err.strip().splitlines()[-1] == (
        "kascade: worker 0 was killed by SIGKILL (gave up after 2 restarts)"
    )


def test_sigterm_mid_stream_drains_and_a_restart_from_the_snapshot_loses_nothing(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = many(300)
    send(kafka_settings, docs)
    recovery = ("--recovery-dir", str(tmp_path / "recovery"), "--snapshot-interval-s", "0.5")
    first = kascade_run(kafka_settings, exported["bert"], "--workers", "2", *recovery)
    wait_for_outputs(kafka_settings, 100, first, timeout_s=120)
    began = time.monotonic()
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert time.monotonic() - began < 35  # the drain bound is 30 s
    assert err.count("draining: no new records are read") == 1, err  # once, not per worker
    done = output_count(kafka_settings)
    assert done < len(docs), "the job finished before the signal"

    second = kascade_run(kafka_settings, exported["bert"], "--workers", "2", "--bounded", *recovery)
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    ids = output_ids(kafka_settings)
    assert set(ids) == {d.id for d in docs}
    assert len(ids) < len(docs) + done // 2, "the restart did not resume from the snapshot"


def test_without_a_recovery_dir_a_restart_reads_the_input_again_from_the_beginning(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    docs = many(150)
    send(kafka_settings, docs)
    first = kascade_run(kafka_settings, exported["bert"])
    wait_for_outputs(kafka_settings, 50, first, timeout_s=120)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    done = output_count(kafka_settings)

    second = kascade_run(kafka_settings, exported["bert"], "--bounded")
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    ids = output_ids(kafka_settings)
    assert len(ids) == done + len(docs)  # everything again: nothing skipped
    assert set(ids) == {d.id for d in docs}


@pytest.fixture
def own_broker():
    """A broker of this test's own, so stopping it disturbs no other test."""
    broker = ensure_local_broker(free_port())
    try:
        yield broker
    finally:
        broker.stop()


def test_the_job_rides_through_a_broker_stop_and_start_and_loses_nothing(
    own_broker, exported: dict[str, Path]
) -> None:
    from kascade.demo.local_broker import _script

    brokers = own_broker.bootstrap
    topics = {"in": "outage-in", "out": "outage-out", "dlq": "outage-dlq"}
    create_topics(KafkaSettings(brokers=brokers), {t: 2 for t in topics.values()})
    settings = KafkaSettings(
        brokers=brokers,
        input_topic=topics["in"],
        output_topic=topics["out"],
        dead_letter_topic=topics["dlq"],
    )
    docs = many(300)
    send(settings, docs)
    job = kascade_run(settings, exported["bert"], "--workers", "2")  # tails
    try:
        wait_for_outputs(settings, 100, job, timeout_s=120)
        _script("stop", own_broker.port)
        time.sleep(10)
        assert job.poll() is None, "the job exited during the outage"
        _script("start", own_broker.port)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(set(output_ids(settings))) < len(docs):
            assert job.poll() is None, "the job exited after the outage"
            time.sleep(1)
        assert set(output_ids(settings)) == {d.id for d in docs}
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("unreachable" in line for line in lines), err
    assert len(lines) < 40, err  # librdkafka's reconnect errors are folded, not repeated


def mixed_corpus(n: int) -> tuple[list[tuple[bytes | None, bytes]], set[str]]:
    """``n`` records, about one in four malformed in one of many ways; and the ids of
    the good documents among them."""
    huge_text = "word " * 172_000  # ~860 KB: valid, under the broker's limit, too long
    bad: list[bytes] = [
        b'{"id": "s", "text": "\\ud800 lone surrogate"}',
        b'{"id": "n", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        json.dumps({"id": "long", "text": huge_text}).encode(),
        b"\xff\xfe not utf-8",
        b"",
        b"not json at all",
        b'{"id": 5, "text": "id is a number"}',
        b'{"text": "no id"}',
        b'{"id": "x", "text": "t", "lang": ' + b"9" * 5000 + b"}",
        b'{"id": "e", "text": ""}',
        b'{"id": "w", "text": "' + b"a" * 200_000 + b'"}',
        b"[1, 2, 3]",
        b"null",
    ]
    records: list[tuple[bytes | None, bytes]] = []
    good: set[str] = set()
    for i in range(n):
        if i % 4 == 3:
            value = bad[(i // 4) % len(bad)]
            records.append((f"bad-{i}".encode(), value))
        else:
            doc = InputDocument(id=f"g-{i}", text=documents(9)[i % 9].text[:400])
            good.add(doc.id)
            records.append((doc.id.encode(), doc.model_dump_json().encode()))
    return records, good


def test_ten_thousand_mixed_records_are_each_a_label_or_a_dead_letter_with_two_workers(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    records, good = mixed_corpus(10_000)
    produce(kafka_settings, records)
    job = kascade_run(kafka_settings, exported["bert"], "--workers", "2", "--bounded")
    _, err = job.communicate(timeout=900)
    assert job.returncode == 0, err
    outputs = [
        OutputRecord.model_validate_json(v)
        for _, v in read_all(kafka_settings, kafka_settings.output_topic)
    ]
    dead = dead_letters(kafka_settings)
    # Every record read is accounted for exactly once, by its position in the input.
    positions = [(o.source.partition, o.source.offset) for o in outputs if o.source] + [
        (d.source.partition, d.source.offset) for d in dead if d.source
    ]
    assert len(positions) == len(set(positions)) == len(records)
    assert good <= {o.id for o in outputs}
    reasons = {d.reason for d in dead}
    R = DeadLetterReason
    assert {R.NOT_UTF8, R.NOT_JSON, R.SCHEMA, R.EMPTY, R.TOO_LONG} <= reasons
    (long,) = {d.original_sha256: d for d in dead if d.original_truncated}.values()
    assert long.original_size and long.original_size > 800_000
