"""The live test of the certified document stop through the real broker: a stop certified
on documents whose opening carries their topic, then a stream whose documents open on
another topic (as web pages open on their site's chrome). The stop ends their reading
inside the opening; the full reads the live test draws show it; the job says so in one
line, sets the gauge, reads every later document to its end while the chunk cascade
goes on, loses no record, and a restarted job keeps the suspension."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import time
from pathlib import Path

import pytest
from helpers import (
    SMALL_CHUNKS,
    TINY_PATH,
    TOPICS,
    calibration,
    kascade_run,
    labeled,
    long_documents,
    send,
)
from test_guarantee_flow import metric, wait_for

from kascade.dataflow.ports import free_port
from kascade.schemas import CascadeUse, InputDocument, OutputRecord, StopReason
from kascade.schemas.kafka import KafkaSettings
from kascade.toolchain.calibrate import calibrate

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

NO_OPENINGS = 10**9  # long_documents: no document opens with the boilerplate


@pytest.fixture(scope="module")
def stops_at_once(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a document stop certified on documents that are one topic from
    their first word: a short window serves them."""
    d = tmp_path_factory.mktemp("stops_at_once") / "model"
    shutil.copytree(exported["modernbert"], d)
    spec = calibrate(
        d,
        [doc.text for doc in long_documents(80, seed=1, boilerplate_every=NO_OPENINGS)],
        calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS, epsilon_doc=0.05),
        path=TINY_PATH,
        documents=[doc.text for doc in long_documents(120, seed=2, boilerplate_every=NO_OPENINGS)],
    )
    assert spec.document_stop is not None and spec.document_stop.disagreements == 0
    return d


def opening_on_another_topic(n: int) -> list[InputDocument]:
    """Documents of one topic that open with about three chunks of another."""
    pairs = itertools.cycle(itertools.permutations(TOPICS, 2))
    return [
        InputDocument(id=f"opens-{i}", text=" ".join([a] * 18 + [b] * 60))
        for i, (a, b) in zip(range(n), pairs, strict=False)
    ]


def _job(k: KafkaSettings, model: Path, recovery: Path, *extra: str):
    """The job with every stopped document read to its end too, and no chunk audits."""
    return kascade_run(
        k, model, "--cascade", "on", "--cascade.audit-fraction", "0",
        "--cascade.stop-audit-fraction", "1", "--recovery-dir", str(recovery), *extra,
    )  # fmt: skip


def _stopped(r: OutputRecord) -> bool:
    return r.reading is not None and r.reading.stopped is StopReason.CERTAIN


def test_a_stop_wrong_on_text_unlike_its_calibration_is_convicted_and_suspended(
    kafka_settings: KafkaSettings, stops_at_once: Path, tmp_path: Path
) -> None:
    clear = long_documents(16, seed=5, boilerplate_every=NO_OPENINGS)
    misleading = opening_on_another_topic(24)
    after = long_documents(12, seed=6, boilerplate_every=NO_OPENINGS)
    recovery, port = tmp_path / "recovery", free_port()
    holding = 'kascade_document_stop_guarantee{state="holding"}'
    violated = 'kascade_document_stop_guarantee{state="violated"}'
    job = _job(kafka_settings, stops_at_once, recovery, "--metrics-port", str(port))
    try:
        send(kafka_settings, clear)
        wait_for(kafka_settings, {d.id for d in clear}, job)
        time.sleep(2)  # the full reads of the last stopped documents reach the test
        assert metric(port, holding) == 1.0
        send(kafka_settings, misleading)
        wait_for(kafka_settings, {d.id for d in misleading}, job)
        deadline = time.monotonic() + 60
        while metric(port, violated) != 1.0:
            assert time.monotonic() < deadline, "the stop's test never fired"
            time.sleep(0.5)
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    alarms = [line for line in err.splitlines() if "document stop guarantee violated" in line]
    assert len(alarms) == 1, err
    assert "above the certified epsilon_doc 5%" in alarms[0], alarms
    assert "every document is read to its end from now on" in alarms[0], alarms
    assert "cascade guarantee violated" not in err  # the chunk bound was not in question

    written = labeled(kafka_settings)
    assert all(len(rs) == 1 for rs in written.values())  # the full reads wrote nothing
    records = {i: rs[0] for i, rs in written.items()}
    assert set(records) == {d.id for d in clear + misleading + after}  # nothing lost
    assert sum(_stopped(records[d.id]) for d in clear) >= len(clear) // 2
    assert sum(_stopped(records[d.id]) for d in misleading) >= 2  # what convicted it
    for d in after:  # read to the end, the chunk cascade still on
        r = records[d.id]
        assert r.reading is not None and r.reading.stopped is StopReason.END, r
        assert r.reading.chunks_read == r.chunks.total and r.cascade is CascadeUse.ON, r
    scopes = json.loads((recovery / "suspensions.json").read_text())["suspended"]
    assert [s["scope"] for s in scopes] == ["doc_stop"]

    later = long_documents(4, seed=7, boilerplate_every=NO_OPENINGS)
    job = _job(kafka_settings, stops_at_once, recovery)
    try:
        send(kafka_settings, later)
        wait_for(kafka_settings, {d.id for d in later}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert "document stop guarantee violated before this process started" in err, err
    assert "every document is read to its end" in err
    records = {i: rs[-1] for i, rs in labeled(kafka_settings).items()}
    assert not any(_stopped(records[d.id]) for d in later)


def _audits(port: int) -> float:
    return sum(
        metric(port, f'kascade_stop_audits_total{{agree="{a}"}}') or 0.0 for a in ("true", "false")
    )


def test_two_records_with_one_id_both_stopped_are_each_written_once_and_audited_once(
    kafka_settings: KafkaSettings, stops_at_once: Path, tmp_path: Path
) -> None:
    # Each id is sent twice at once: a document the stop is right on, then one of another
    # length it is wrong on. Every stopped record's full read must reach the test once:
    # the cascade keys its state by the record's position, and a full read travels whole.
    clear = long_documents(8, seed=8, boilerplate_every=NO_OPENINGS)
    misleading = opening_on_another_topic(8)
    sent = [
        InputDocument(id=f"twice-{i}", text=d.text)
        for i, pair in enumerate(zip(clear, misleading, strict=True))
        for d in pair
    ]
    port = free_port()
    job = _job(kafka_settings, stops_at_once, tmp_path / "recovery", "--metrics-port", str(port))
    try:
        send(kafka_settings, sent)
        written: dict[str, list[OutputRecord]] = {}
        deadline = time.monotonic() + 240
        while sum(map(len, written.values())) < len(sent):
            assert job.poll() is None and time.monotonic() < deadline, "records missing"
            time.sleep(0.5)
            written = labeled(kafka_settings)
        stopped = [r for rs in written.values() for r in rs if _stopped(r)]
        deadline = time.monotonic() + 60
        while _audits(port) < len(stopped):  # each full read reaches the test once done
            assert time.monotonic() < deadline, (_audits(port), len(stopped))
            time.sleep(0.5)
        time.sleep(2)  # and no more than once
        audited = _audits(port)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert audited == len(stopped) >= 4
    assert sorted(written) == sorted({d.id for d in sent})
    for rs in written.values():  # both records of an id, each labeled once, apart
        assert sorted(r.reading.chars_total for r in rs) == sorted(
            len(d.text) for d in sent if d.id == rs[0].id
        )
    assert "document stop guarantee violated" in err  # the misleading halves were seen


def test_a_worker_killed_with_kill_9_amid_full_reads_loses_no_record_and_keeps_the_conviction(
    kafka_settings: KafkaSettings, stops_at_once: Path, tmp_path: Path
) -> None:
    from test_faults import workers_of

    misleading = opening_on_another_topic(30)
    after = long_documents(12, seed=9, boilerplate_every=NO_OPENINGS)
    recovery = tmp_path / "recovery"
    job = _job(
        kafka_settings, stops_at_once, recovery, "--workers", "2",
        "--snapshot-interval-s", "0.5", "--restarts.backoff-s", "0.2",
    )  # fmt: skip
    try:
        send(kafka_settings, misleading)
        deadline = time.monotonic() + 120
        while len(labeled(kafka_settings)) < 3:  # full reads are under way
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers_of(job)[0].kill()
        wait_for(kafka_settings, {d.id for d in misleading}, job)
        deadline = time.monotonic() + 90
        while not (recovery / "suspensions.json").is_file():
            assert time.monotonic() < deadline, "the stop's test never fired"
            time.sleep(0.5)
        time.sleep(2)  # the other process takes the suspension up
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    assert "was killed by SIGKILL; restarting the workers" in err, err
    written = labeled(kafka_settings)
    assert set(written) == {d.id for d in misleading + after}  # nothing lost
    assert all(len(rs) == 1 for rs in written.values()), err  # nothing twice
    for d in after:  # in both processes, read to the end
        r = written[d.id][0]
        assert r.reading is not None and r.reading.stopped is StopReason.END, r
    scopes = json.loads((recovery / "suspensions.json").read_text())["suspended"]
    assert [s["scope"] for s in scopes] == ["doc_stop"]
