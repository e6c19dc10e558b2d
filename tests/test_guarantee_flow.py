"""The live guarantee through the real broker: a stream that shifts mid-run from text
the cheap stages get right to text they get wrong (the job says so in one line, sets the
gauge, sends every later chunk to the full model and marks those records, and loses no
record), and a new calibration taking effect on a restart from the snapshot."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    SMALL_CHUNKS,
    TINY_PATH,
    calibration,
    kascade_cli,
    kascade_run,
    labeled,
    long_documents,
    output_ids,
    produce,
    send,
    texts,
)
from tiny_models import CORPUS

from bench.guarantee import audits
from kascade.dataflow.consume import read_all
from kascade.dataflow.ports import free_port
from kascade.schemas import CascadeUse, DeadLetter, InputDocument, OutputRecord
from kascade.schemas.cascade import CASCADE_FILE
from kascade.schemas.kafka import KafkaSettings
from kascade.toolchain.calibrate import calibrate

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def by_agreement(model_dir: Path, candidates: list[str]) -> tuple[list[str], list[str]]:
    """Texts with one settled chunk, split by whether the full model agrees with it."""
    outcomes = audits(model_dir, candidates)
    agree = [t for t, o in zip(candidates, outcomes, strict=True) if o == [False]]
    disagree = [t for t, o in zip(candidates, outcomes, strict=True) if o == [True]]
    return agree, disagree


def metric(port: int, sample: str) -> float | None:
    """The value of one sample (name and labels as Prometheus prints them)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


def word_salad(n: int) -> list[str]:
    """Text unlike the calibration's: the corpus's words in random order."""
    words = sorted({w for t in CORPUS for w in t.split()})
    rng = random.Random(0)
    return [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(n)]


def docs(prefix: str, pool: list[str], n: int) -> list[InputDocument]:
    return [InputDocument(id=f"{prefix}-{i}", text=pool[i % len(pool)]) for i in range(n)]


def wait_for(k: KafkaSettings, ids: set[str], job, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not ids <= set(output_ids(k)):
        assert job.poll() is None, job.communicate()[1]
        assert time.monotonic() < deadline, "not every document was labeled"
        time.sleep(0.5)


def test_a_stream_that_drifts_mid_run_trips_the_guarantee_and_falls_back_losing_nothing(
    kafka_settings: KafkaSettings, calibrated: Path
) -> None:
    agree, disagree = by_agreement(calibrated, texts(100) + word_salad(1500))
    assert len(agree) >= 10 and len(disagree) >= 3, (len(agree), len(disagree))
    port = free_port()
    job = kascade_run(
        kafka_settings,
        calibrated,
        "--cascade",
        "on",
        "--cascade.audit-fraction",
        "1",
        "--metrics-port",
        str(port),
    )  # tails
    before, drift, after = docs("a", agree, 60), docs("d", disagree, 30), docs("b", agree, 40)
    try:
        send(kafka_settings, before)
        wait_for(kafka_settings, {d.id for d in before}, job)
        holding = 'kascade_cascade_guarantee{lang="all",state="holding"}'
        assert metric(port, holding) == 1.0

        send(kafka_settings, drift)
        wait_for(kafka_settings, {d.id for d in drift}, job)
        violated = 'kascade_cascade_guarantee{lang="all",state="violated"}'
        assert metric(port, violated) == 1.0
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    alarms = [line for line in err.splitlines() if "cascade guarantee violated" in line]
    assert len(alarms) == 1, err
    assert "above the certified epsilon" in alarms[0]
    assert "every chunk goes to the full model from now on" in alarms[0]

    records = {i: rs[-1] for i, rs in labeled(kafka_settings).items()}
    assert set(records) == {d.id for d in before + drift + after}  # nothing lost
    assert all(records[d.id].cascade is CascadeUse.ON for d in before)
    for d in after:  # after the alarm: the full model on every chunk, and said so
        r = records[d.id]
        assert r.cascade is CascadeUse.SUSPENDED, r
        assert r.chunks.full_model == r.chunks.total


STEADY = ["de", "en", "fr", "es", "it", "nl", "pl", "pt", "tr"]


def interleaved(steady: list[InputDocument], drifted: list[InputDocument]) -> list[InputDocument]:
    """``drifted`` spread evenly among ``steady``, never first: audits of the drifted kind
    alone, before any other's, are all the overall test has seen, and it fires for
    everything instead of for that kind."""
    out = list(steady)
    for j, doc in enumerate(drifted):
        out.insert(((j + 1) * len(out)) // (len(drifted) + 1), doc)
    return out


def nine_and_sw(
    prefix: str, n: int, drifted: int, agree: list[str], disagree: list[str]
) -> list[InputDocument]:
    """``n`` documents in nine steady languages, ``drifted`` in sw spread among them."""
    steady = [
        InputDocument(id=f"{prefix}-{i}", text=agree[i % len(agree)], lang=STEADY[i % 9])
        for i in range(n)
    ]
    sw = [  # the calibration's words in any order
        InputDocument(id=f"{prefix}-sw-{j}", text=disagree[j % len(disagree)], lang="sw")
        for j in range(drifted)
    ]
    return interleaved(steady, sw)


def contained(
    k: KafkaSettings,
    err: str,
    sent: list[InputDocument],
    drifted: Callable[[InputDocument], bool],
    after: list[InputDocument],
    alarm: tuple[str, ...],
) -> dict[str, OutputRecord]:
    """One alarm, every phrase of ``alarm`` in it; every id labeled; the steady documents
    all on their cascade; the drifted ones sent ``after`` it all on the full model, and
    marked so. Returns the last record of each id."""
    alarms = [line for line in err.splitlines() if "cascade guarantee violated" in line]
    assert len(alarms) == 1 and all(phrase in alarms[0] for phrase in alarm), err
    records = {i: rs[-1] for i, rs in labeled(k).items()}
    assert set(records) == {d.id for d in sent}  # nothing lost
    for d in sent:
        r = records[d.id]
        if not drifted(d):  # the steady kinds keep the whole of their cascade
            assert r.cascade is CascadeUse.ON, r
        elif d in after:  # the drifted kind: the full model on every chunk, and said so
            assert r.cascade is CascadeUse.SUSPENDED and r.chunks.full_model == r.chunks.total
    return records


def test_one_drifted_language_goes_to_the_full_model_while_nine_keep_their_cascade(
    kafka_settings: KafkaSettings, calibrated: Path
) -> None:
    agree, disagree = by_agreement(calibrated, texts(100) + word_salad(1500))
    assert len(agree) >= 10 and len(disagree) >= 3, (len(agree), len(disagree))

    port = free_port()
    job = kascade_run(
        kafka_settings, calibrated, "--cascade", "on", "--cascade.audit-fraction", "1",
        "--metrics-port", str(port),
    )  # fmt: skip
    before = nine_and_sw("a", 120, 12, agree, disagree)
    after = nine_and_sw("b", 90, 8, agree, disagree)
    try:
        send(kafka_settings, before)
        wait_for(kafka_settings, {d.id for d in before}, job)
        sw_violated = 'kascade_cascade_guarantee{lang="sw",state="violated"}'
        assert metric(port, sw_violated) == 1.0
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
        assert metric(port, 'kascade_cascade_guarantee{lang="all",state="holding"}') == 1.0
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    contained(
        kafka_settings, err, before + after, lambda d: d.lang == "sw", after,
        ("violated on language sw:", "the other languages keep their cascade"),
    )  # fmt: skip


def test_a_drift_in_short_documents_suspends_them_alone_and_long_ones_keep_their_cascade(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    # Calibrated on short texts and long documents alike: each length certified apart.
    model = tmp_path / "model"
    shutil.copytree(exported["modernbert"], model)
    long_texts = [d.text for d in long_documents(40, seed=1)]
    spec = calibrate(
        model, texts(600) + long_texts,
        calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS), path=TINY_PATH,
    )  # fmt: skip
    strata = spec.operating_points[spec.default_operating_point].strata
    assert [s.name for s in strata] == ["short", "long", "other"]
    _, disagree = by_agreement(model, texts(100) + word_salad(1500))  # one chunk each
    candidates = [d.text for d in long_documents(80, seed=3)]
    outcomes = audits(model, candidates)  # settled chunks, and none disagreeing
    steady = [t for t, o in zip(candidates, outcomes, strict=True) if o and not any(o)]
    assert len(disagree) >= 3 and len(steady) >= 10, (len(disagree), len(steady))

    def stream(prefix: str, n: int, drifted: int) -> list[InputDocument]:
        long_docs = [
            InputDocument(id=f"{prefix}-{i}", text=steady[i % len(steady)]) for i in range(n)
        ]
        short = [
            InputDocument(id=f"{prefix}-short-{j}", text=disagree[j % len(disagree)])
            for j in range(drifted)
        ]
        return interleaved(long_docs, short)

    port = free_port()
    job = kascade_run(
        kafka_settings, model, "--cascade", "on", "--cascade.audit-fraction", "1",
        "--metrics-port", str(port),
    )  # fmt: skip
    # Long documents first: the overall test has their agreeing audits when the short
    # ones drift, so only the short documents' test fires.
    steady_first, before, after = stream("s", 60, 0), stream("a", 30, 12), stream("b", 40, 8)
    try:
        send(kafka_settings, steady_first)
        wait_for(kafka_settings, {d.id for d in steady_first}, job)
        send(kafka_settings, before)
        wait_for(kafka_settings, {d.id for d in before}, job)
        assert metric(port, 'kascade_cascade_guarantee{lang="short",state="violated"}') == 1.0
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
        assert metric(port, 'kascade_cascade_guarantee{lang="long",state="holding"}') == 1.0
        assert metric(port, 'kascade_cascade_guarantee{lang="all",state="holding"}') == 1.0
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    sent = steady_first + before + after
    records = contained(
        kafka_settings, err, sent, lambda d: "-short-" in d.id, after,
        ("violated on short documents:", "the other kinds of text keep their cascade"),
    )  # fmt: skip
    long_records = [records[d.id] for d in sent if "-short-" not in d.id]
    assert sum(r.chunks.total - r.chunks.full_model for r in long_records) > 0


def test_a_suspension_survives_a_kill_9_of_a_worker_and_holds_in_every_process(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    from test_faults import workers_of

    agree, disagree = by_agreement(calibrated, texts(100) + word_salad(1500))
    recovery = tmp_path / "recovery"
    job = kascade_run(
        kafka_settings, calibrated, "--cascade", "on", "--cascade.audit-fraction", "1",
        "--workers", "2", "--recovery-dir", str(recovery), "--snapshot-interval-s", "0.5",
        "--restarts.backoff-s", "0.2",
    )  # fmt: skip
    drift, after = docs("d", disagree, 40), docs("b", agree, 60)
    try:
        send(kafka_settings, drift)
        wait_for(kafka_settings, {d.id for d in drift}, job)
        assert (recovery / "suspensions.json").is_file()
        workers_of(job)[0].kill()  # kill -9: its replacement starts with a fresh test
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    assert "was killed by SIGKILL; restarting the workers" in err, err
    assert "cascade guarantee violated before this process started" in err, err
    records = {i: rs[-1] for i, rs in labeled(kafka_settings).items()}
    assert {d.id for d in drift + after} <= set(records)  # nothing lost
    for d in after:  # text the cascade would settle: after the restart, not one chunk
        r = records[d.id]
        assert r.cascade is CascadeUse.SUSPENDED and r.chunks.full_model == r.chunks.total, r


def test_a_new_calibration_takes_effect_on_restart_from_the_snapshot_and_records_name_it(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    recovery = ("--recovery-dir", str(tmp_path / "recovery"), "--snapshot-interval-s", "0.5")
    first = docs("first", texts(50), 40)
    send(kafka_settings, first)
    job = kascade_run(kafka_settings, model, "--cascade", "on", *recovery)
    wait_for(kafka_settings, {d.id for d in first}, job)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    old = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()

    # Recalibrate (other text, another epsilon), as `kascade calibrate` would.
    calibrate(
        model,
        texts(400),
        calibration(epsilon=0.2, delta=0.1, chunking=SMALL_CHUNKS),
        path=TINY_PATH,
    )
    new = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()
    assert new != old
    later = docs("later", texts(50), 30)
    send(kafka_settings, later)
    job = kascade_run(kafka_settings, model, "--cascade", "on", "--bounded", *recovery)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err

    records = labeled(kafka_settings)
    assert set(records) == {d.id for d in first + later}  # nothing lost
    assert {r.model.cascade_sha256 for d in first for r in records[d.id][:1]} == {old}
    assert {r.model.cascade_sha256 for d in later for r in records[d.id]} == {new}


def sha_of(k: KafkaSettings, doc_id: str) -> str | None:
    found = labeled(k).get(doc_id)
    return found[0].model.cascade_sha256 if found else None


def test_a_running_job_takes_up_a_new_calibration_whole_and_refuses_a_broken_one(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """No restart: a new cascade.json is taken up by every worker at once, records name
    the calibration that settled them, each id is labeled once; a broken file is refused
    in one line and the calibration in force stays."""
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    old = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()
    job = kascade_run(
        kafka_settings, model, "--cascade", "on", "--workers", "2",
        "--recovery-dir", str(tmp_path / "recovery"), "--snapshot-interval-s", "0.5",
    )  # fmt: skip
    first, middle, later = (docs(p, texts(60), 40) for p in ("first", "middle", "later"))
    try:
        send(kafka_settings, first)
        wait_for(kafka_settings, {d.id for d in first}, job)
        good = (model / CASCADE_FILE).read_text()
        (model / CASCADE_FILE).write_text(good.replace('"labels"', '"labelz"', 1))  # broken
        time.sleep(5)  # more than two looks
        send(kafka_settings, middle)
        wait_for(kafka_settings, {d.id for d in middle}, job)
        calibrate(
            model,
            texts(400),
            calibration(epsilon=0.2, delta=0.1, chunking=SMALL_CHUNKS),
            path=TINY_PATH,
        )
        new = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()
        probes = []  # one document at a time until one comes back labeled by the new one
        deadline = time.monotonic() + 90
        while not probes or sha_of(kafka_settings, probes[-1].id) != new:
            assert time.monotonic() < deadline, "the new calibration was not taken up"
            probes += docs(f"probe{len(probes)}", texts(60), 1)
            send(kafka_settings, probes[-1:])
            wait_for(kafka_settings, {probes[-1].id}, job)
        send(kafka_settings, later)
        wait_for(kafka_settings, {d.id for d in later}, job)
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    refusals = [line for line in err.splitlines() if "refusing the new" in line]
    assert len(refusals) == 1 and "stays" in refusals[0], err
    assert "the workers resume from the snapshot with the new calibration" in err, err
    records = labeled(kafka_settings)
    assert set(records) == {d.id for d in first + middle + probes + later}  # nothing lost
    assert all(len(rs) == 1 for rs in records.values())  # nothing twice
    assert {records[d.id][0].model.cascade_sha256 for d in first + middle} == {old}
    assert {records[d.id][0].model.cascade_sha256 for d in later} == {new}


def test_the_recovery_loop_end_to_end_drift_sample_recalibrate_and_take_it_up(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """README's loop, through the broker: a language drifts and is suspended alone;
    kascade sample reads the live topic; kascade calibrate certifies on it into the
    running job's model directory; the job takes it up without a restart, the test
    holds again, and every id is labeled once."""
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    agree, disagree = by_agreement(model, texts(200) + word_salad(1500))
    port = free_port()
    job = kascade_run(
        kafka_settings, model, "--cascade", "on", "--cascade.audit-fraction", "1",
        "--recovery-dir", str(tmp_path / "recovery"), "--snapshot-interval-s", "0.5",
        "--metrics-port", str(port),
    )  # fmt: skip
    drifting = nine_and_sw("a", 240, 30, agree, disagree)
    sent = list(drifting)
    try:
        send(kafka_settings, drifting)
        wait_for(kafka_settings, {d.id for d in drifting}, job)
        assert metric(port, 'kascade_cascade_guarantee{lang="sw",state="violated"}') == 1.0
        stream = tmp_path / "stream.jsonl"
        common = ("--brokers", kafka_settings.brokers, "--input-topic", kafka_settings.input_topic)
        r = kascade_cli("sample", *common, "--count", "1000", "--out", str(stream))
        assert r.returncode == 0, r.stderr
        r = kascade_cli(
            "calibrate", "--model", str(model), "--texts", str(stream), "--lang-column", "lang",
            "--epsilon", "0.2", "--delta", "0.1", "--chunk-tokens", "64", "--overlap", "8",
            timeout=600,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        new = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()
        deadline = time.monotonic() + 90
        while sha_of(kafka_settings, sent[-1].id) != new:
            assert time.monotonic() < deadline, "the new calibration was not taken up"
            sent += docs(f"probe{len(sent)}", agree, 1)
            send(kafka_settings, sent[-1:])
            wait_for(kafka_settings, {sent[-1].id}, job)
        after = nine_and_sw("b", 120, 12, agree, disagree)
        sent += after
        send(kafka_settings, after)
        wait_for(kafka_settings, {d.id for d in after}, job)
        assert metric(port, 'kascade_cascade_guarantee{lang="all",state="holding"}') == 1.0
        assert metric(port, 'kascade_cascade_guarantee{lang="sw",state="holding"}') == 1.0
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
    records = labeled(kafka_settings)
    assert set(records) == {d.id for d in sent} and all(len(v) == 1 for v in records.values())
    assert all(records[d.id][0].model.cascade_sha256 == new for d in after)
    assert not any(records[d.id][0].cascade is CascadeUse.SUSPENDED for d in after)


def test_thousands_of_invented_languages_neither_kill_a_worker_nor_grow_the_metrics(
    kafka_settings: KafkaSettings, calibrated: Path
) -> None:
    # Each record its own made-up tag; a few tags that are not tags at all (a newline and
    # a terminal escape would reach log lines) are dead letters naming the field.
    rng = random.Random(3)
    pool = texts(50)
    good = [
        InputDocument(id=f"l-{i}", text=pool[i % len(pool)], lang=f"zz-{i:06d}")
        for i in range(3000)
    ]
    bad = {
        f"bad-{i}": lang
        for i, lang in enumerate(["en\nFAKE LOG LINE", "de\x1b[31m", "english please", "e"])
    }
    rows = [(d.id.encode(), d.model_dump_json().encode()) for d in good]
    rows += [
        (k.encode(), json.dumps({"id": k, "text": pool[0], "lang": v}).encode())
        for k, v in bad.items()
    ]
    rng.shuffle(rows)
    produce(kafka_settings, rows)
    port = free_port()
    job = kascade_run(
        kafka_settings,
        calibrated,
        "--cascade",
        "on",
        "--cascade.audit-fraction",
        "1",
        "--cascade.max-languages",
        "8",
        "--workers",
        "2",
        "--metrics-port",
        str(port),
    )  # tails, so the metrics can be read before it stops
    try:
        wait_for(kafka_settings, {d.id for d in good}, job, timeout_s=400)
        followed = []  # per worker process: the languages its gauge follows
        for worker_port in (port, port + 1):
            body = urllib.request.urlopen(
                f"http://127.0.0.1:{worker_port}/metrics", timeout=5
            ).read()
            series = [
                line
                for line in body.decode().splitlines()
                if line.startswith("kascade_cascade_guarantee{")
            ]
            followed.append({line.split('lang="')[1].split('"')[0] for line in series})
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert "Traceback" not in err and "FAKE LOG LINE" not in err
    # The job's one test runs on one worker: 8 named, the pool, overall; the other
    # worker's gauge has the overall series it starts with, and the pool only where it
    # took up the pool's suspension from its peer (whether the pool's test fires on
    # these invented languages depends on which records reach it first).
    tested, other = sorted(followed, key=len, reverse=True)
    assert len(tested) == 8 + 2 and {"all", "other"} <= tested, tested
    assert {"all"} <= other <= {"all", "other"}, other
    dead = {
        d.original_key().decode(): d
        for d in (
            DeadLetter.model_validate_json(v)
            for _, v in read_all(kafka_settings, kafka_settings.dead_letter_topic)
        )
    }
    assert set(dead) == set(bad)
    assert all(d.reason.value == "schema" and "lang" in d.detail for d in dead.values())


def test_the_live_test_resumes_from_the_snapshot_after_a_restart_instead_of_starting_over(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    from kascade.operators.bound import BoundTest

    _, disagree = by_agreement(calibrated, texts(100) + word_salad(1500))
    # The calibrated fixture's bound (epsilon 0.1, delta 0.1): one disagreeing audit is
    # evidence but no alarm; a second one after it is an alarm.
    test = BoundTest(0.1, 0.1)
    assert not test.observe(True) and test.observe(True)
    recovery = tmp_path / "recovery"
    errs = []
    for n in (1, 2):  # two runs of the job, one disagreeing document each
        send(kafka_settings, docs(f"r{n}", disagree, 1))
        job = kascade_run(
            kafka_settings, calibrated, "--bounded", "--cascade", "on",
            "--cascade.audit-fraction", "1", "--recovery-dir", str(recovery),
        )  # fmt: skip
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err
        errs.append(err)
    assert "cascade guarantee violated" not in errs[0], errs[0]
    # A test started over would have seen one audit, and said nothing.
    assert "cascade guarantee violated" in errs[1], errs[1]
    assert "100% of 2 audited chunks" in errs[1], errs[1]
    assert set(output_ids(kafka_settings)) == {"r1-0", "r2-0"}
