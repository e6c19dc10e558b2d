"""Exactly once through the real broker: ``kill -9`` of a worker, of the whole job and of
one process of a cluster, at random moments and at each point where a process can die
between what Kafka holds and what the last snapshot says (before a commit, between a
commit and the snapshot, during a resume, during a drain), a broker restart in the middle
of transactions, and a drain and resume. Every test accounts for every input record with
a ``read_committed`` consumer on both topics: 0 missing, 0 duplicates."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import kascade_run, produce
from test_cluster import Cluster
from test_faults import mixed_corpus, workers_of

from kascade.dataflow.broker import create_topics
from kascade.dataflow.consume import read_records
from kascade.dataflow.ports import free_port
from kascade.demo.local_broker import _script, ensure_local_broker
from kascade.operators.formats import ORIGIN_HEADER
from kascade.schemas import DeadLetter, OutputRecord
from kascade.schemas.kafka import KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

TESTS = Path(__file__).resolve().parent
FAST = (
    "--restarts.backoff-s",
    "0.2",
    "--restarts.limit",
    "10",
    "--snapshot-interval-s",
    "0.5",
)


def input_positions(k: KafkaSettings) -> set[str]:
    """Every record on the input topic, as ``topic:partition:offset`` (written by a plain
    producer: offsets 0 .. end - 1 of each partition)."""
    c = Consumer({"bootstrap.servers": k.brokers, "group.id": "kascade-test-positions"})
    try:
        parts = c.list_topics(k.input_topic, timeout=10).topics[k.input_topic].partitions
        return {
            f"{k.input_topic}:{p}:{o}"
            for p in parts
            for o in range(c.get_watermark_offsets(TopicPartition(k.input_topic, p), 10)[1])
        }
    finally:
        c.close()


def results(k: KafkaSettings) -> Counter[str]:
    """The origin of every committed result on the output and dead-letter topics; each
    header checked against the record's own ``source``."""
    found: Counter[str] = Counter()
    for topic, model in ((k.output_topic, OutputRecord), (k.dead_letter_topic, DeadLetter)):
        for r in read_records(k, topic):
            origin = dict(r.headers)[ORIGIN_HEADER].decode()
            source = model.model_validate_json(r.value).source
            assert source is not None and source.key == origin
            found[origin] += 1
    return found


def assert_exactly_once(k: KafkaSettings) -> None:
    expected = input_positions(k)
    found = results(k)
    missing = expected - set(found)
    repeated = {o: n for o, n in found.items() if n > 1}
    assert not missing and not repeated, (
        f"{len(missing)} missing, e.g. {sorted(missing)[:5]}; {len(repeated)} repeated,"
        f" e.g. {sorted(repeated.items())[:5]}"
    )
    assert set(found) == expected


def send_corpus(k: KafkaSettings, n: int) -> int:
    records, _ = mixed_corpus(n)
    produce(k, records)
    return len(records)


def wait_for_results(k: KafkaSettings, n: int, jobs: list[subprocess.Popen], timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while sum(results(k).values()) < n:
        assert time.monotonic() < deadline, f"fewer than {n} results in {timeout_s} s"
        assert all(j.poll() is None for j in jobs), [j.returncode for j in jobs]
        time.sleep(0.5)


def recovery(tmp_path: Path) -> tuple[str, ...]:
    return ("--recovery-dir", str(tmp_path / "recovery"), *FAST)


def test_kill_9_of_the_whole_job_at_random_moments_writes_each_result_once(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    k = kafka_settings
    total = send_corpus(k, 1600)
    rng = random.Random(26)
    kills = 0
    for _ in range(4):
        before = sum(results(k).values())
        job = kascade_run(k, exported["bert"], "--workers", "2", *recovery(tmp_path))
        wait_for_results(k, before + 1, [job])  # writing: now die at a random moment
        time.sleep(rng.uniform(0.0, 1.5))
        job.kill()  # the workers die with their supervisor
        job.communicate(timeout=30)
        kills += 1
    assert sum(results(k).values()) < total, "the job finished before the last kill"
    final = kascade_run(k, exported["bert"], "--workers", "2", "--bounded", *recovery(tmp_path))
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err
    assert kills == 4
    assert_exactly_once(k)


def test_kill_9_of_a_worker_at_random_moments_writes_each_result_once(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    k = kafka_settings
    total = send_corpus(k, 2400)
    rng = random.Random(27)
    job = kascade_run(k, exported["bert"], "--workers", "2", *recovery(tmp_path))
    try:
        for kill in range(4):
            wait_for_results(k, (kill + 1) * total // 6, [job])
            time.sleep(rng.uniform(0.0, 1.0))
            rng.choice(workers_of(job)).kill()
        wait_for_results(k, total, [job])
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    assert err.count("was killed by SIGKILL; restarting the workers") == 4, err
    assert_exactly_once(k)


@pytest.mark.parametrize(
    "plan",
    [
        "before_commit:4,25,60",
        "after_commit:2,7,13",
        "after_commit:3;during_resume:1,2",
    ],
)
def test_a_worker_dying_at_each_failure_point_writes_each_result_once(
    plan: str, kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    k = kafka_settings
    total = send_corpus(k, 1600)
    counts = tmp_path / "counts"
    counts.mkdir()
    env = os.environ | {
        "PYTHONPATH": str(TESTS),
        "KASCADE_TEST_DIE_AT": plan,
        "KASCADE_TEST_DIE_COUNTS": str(counts),
    }
    program = (str(TESTS / "dying_flow.py"),)
    job = kascade_run(
        k, exported["bert"], "--workers", "2", *recovery(tmp_path), program=program, env=env
    )
    try:
        wait_for_results(k, total, [job], timeout_s=600)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    planned = sum(len(entry.split(":")[1].split(",")) for entry in plan.split(";"))
    died = sum(len(f.read_text().split()) for f in counts.glob("*.died"))
    assert died == planned, f"{died} of {planned} planned deaths happened"
    # Two workers dying in one run (both resuming, say) make one restart.
    assert 1 <= err.count("was killed by SIGKILL; restarting the workers") <= planned, err
    assert_exactly_once(k)


def test_a_worker_dying_during_a_drain_and_the_resume_write_each_result_once(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    k = kafka_settings
    total = send_corpus(k, 2400)
    counts = tmp_path / "counts"
    counts.mkdir()
    env = os.environ | {
        "PYTHONPATH": str(TESTS),
        "KASCADE_TEST_DIE_AT": "during_drain:1",
        "KASCADE_TEST_DIE_COUNTS": str(counts),
    }
    program = (str(TESTS / "dying_flow.py"),)
    args = ("--workers", "2", *recovery(tmp_path))
    job = kascade_run(k, exported["bert"], *args, program=program, env=env)
    wait_for_results(k, total // 4, [job])
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=90)
    assert job.returncode == 1, err  # a worker died while draining: the job says so
    assert (counts / "during_drain.died").exists()
    assert sum(results(k).values()) < total

    drained = kascade_run(k, exported["bert"], *args)
    wait_for_results(k, total // 2, [drained])
    drained.send_signal(signal.SIGTERM)  # a drain that completes
    _, err = drained.communicate(timeout=90)
    assert drained.returncode == 0, err
    assert sum(results(k).values()) < total

    final = kascade_run(k, exported["bert"], *args, "--bounded")
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err
    assert_exactly_once(k)


def test_kill_9_of_one_process_of_a_cluster_writes_each_result_once(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    k = kafka_settings
    total = send_corpus(k, 2400)
    rng = random.Random(28)
    cluster = Cluster(k, exported["bert"], tmp_path, "--restarts.limit", "10")
    cluster.start(0)
    cluster.start(1)
    try:
        for kill in range(3):
            wait_for_results(k, (kill + 1) * total // 5, list(cluster.procs.values()))
            time.sleep(rng.uniform(0.0, 1.0))
            victim = rng.choice([0, 1])
            cluster.procs[victim].kill()
            cluster.procs[victim].communicate(timeout=30)
            cluster.start(victim)  # as its orchestrator would
        wait_for_results(k, total, list(cluster.procs.values()), timeout_s=600)
    finally:
        ended = cluster.stop_all()
    assert all(status == 0 for status, _ in ended.values()), ended
    assert_exactly_once(k)


def test_a_broker_restart_in_the_middle_of_transactions_writes_each_result_once(
    exported: dict[str, Path],
) -> None:
    broker = ensure_local_broker(free_port())  # its own, so stopping it disturbs no other test
    try:
        k = KafkaSettings(
            brokers=broker.bootstrap,
            input_topic="eos-in",
            output_topic="eos-out",
            dead_letter_topic="eos-dlq",
        )
        create_topics(k, {"eos-in": 2, "eos-out": 2, "eos-dlq": 1})
        total = send_corpus(k, 2400)
        job = kascade_run(k, exported["bert"], "--workers", "2")
        try:
            wait_for_results(k, total // 4, [job])
            _script("stop", broker.port)  # transactions are open: commits every 100 ms
            time.sleep(8)
            assert job.poll() is None, "the job exited during the outage"
            _script("start", broker.port)
            wait_for_results(k, total, [job], timeout_s=600)
        finally:
            job.send_signal(signal.SIGTERM)
            _, err = job.communicate(timeout=90)
        assert job.returncode == 0, err
        assert_exactly_once(k)
    finally:
        broker.stop()


def test_a_recovery_store_without_exactly_once_delivery_is_refused_in_one_line(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    """Its snapshots cannot say which committed results came after them: resuming from
    it could write a result twice, so the job refuses it and says what to do."""
    k = kafka_settings
    send_corpus(k, 40)
    earlier = kascade_run(
        k, exported["bert"], "--delivery", "at_least_once", "--bounded", *recovery(tmp_path)
    )
    _, err = earlier.communicate(timeout=300)
    assert earlier.returncode == 0, err
    refused = kascade_run(k, exported["bert"], "--bounded", *recovery(tmp_path))
    _, err = refused.communicate(timeout=120)
    assert refused.returncode != 0
    assert "snapshots of a run without exactly-once delivery" in err
    assert "Traceback" not in err
