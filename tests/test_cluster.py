"""Faults injected into a job spread over two processes (``--addresses``, ``--process-id``,
each with its own recovery directory), through the real broker: one process killed with
``kill -9`` and started again, SIGTERM to one process, a peer that never starts. Each test
is bounded, accounts for every input id and reads every line the processes print."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import cluster_addresses, kascade_run, labeled, output_count, output_ids, texts
from test_faults import many, send, wait_for_outputs

from kascade.dataflow.consume import read_all
from kascade.schemas import InputDocument
from kascade.schemas.cascade import CASCADE_FILE
from kascade.schemas.kafka import KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

FAST = ("--restarts.backoff-s", "0.2", "--snapshot-interval-s", "0.5")
# The processes of a cluster drain each other only with its token.
CLUSTER_ENV = {**os.environ, "KASCADE_CLUSTER__CONTROL_TOKEN": "test-cluster-token"}


class Cluster:
    """Two ``kascade run`` processes of one cluster on this host, as two hosts would be."""

    def __init__(self, settings: KafkaSettings, model: Path, tmp_path: Path, *extra: str):
        self.settings, self.tmp, self.extra = settings, tmp_path, extra
        self.models = [model, model]  # each process's model directory
        self.addresses = cluster_addresses(2).split(";")
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, index: int, *more: str) -> subprocess.Popen:
        self.procs[index] = kascade_run(
            self.settings,
            self.models[index],
            "--addresses",
            ";".join(self.addresses),
            "--process-id",
            str(index),
            "--recovery-dir",
            str(self.tmp / f"recovery-{index}"),
            *FAST,
            *self.extra,
            *more,
            env=CLUSTER_ENV,
        )
        return self.procs[index]

    def state(self, index: int) -> str:
        host, port = self.addresses[index].split(":")
        url = f"http://{host}:{int(port) + 1}/state"
        try:
            return urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return "not answering"

    def stop_all(self) -> dict[int, tuple[int, str]]:
        """SIGTERM to every process still running; each one's exit status and stderr."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        ended = {}
        for i, p in self.procs.items():
            _, err = p.communicate(timeout=90)
            ended[i] = (p.returncode, err)
        return ended


def only_one_liners(err: str) -> None:
    """What a process printed is log lines, never a traceback or a panic."""
    assert "Traceback" not in err and "panic" not in err, err
    # Timely's retry lines are folded into the supervisor's one line on a slow forming
    # (which quotes the last of them as its cause), never printed themselves.
    raw = [
        line
        for line in err.splitlines()
        if "error connecting to worker" in line and "for the cluster to form" not in line
    ]
    assert not raw, err


def test_a_process_killed_with_kill_9_is_rejoined_by_its_peer_when_it_returns_and_nothing_is_lost(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = many(250)
    send(kafka_settings, docs)
    cluster = Cluster(kafka_settings, exported["bert"], tmp_path)
    survivor = cluster.start(0)
    killed = cluster.start(1)
    try:
        wait_for_outputs(kafka_settings, 200, survivor, timeout_s=180)
        killed.kill()
        killed.communicate(timeout=30)
        assert output_count(kafka_settings) < len(docs), "the job finished before the kill"
        time.sleep(3)  # the survivor notices, restarts its worker, waits for its peer
        assert survivor.poll() is None, "the survivor exited when its peer was killed"
        assert cluster.state(0) == "waiting"
        returned = time.monotonic()
        cluster.start(1)
        while cluster.state(0) != "running":
            assert time.monotonic() - returned < 30, "the cluster did not form again in 30 s"
            time.sleep(0.2)
        deadline = time.monotonic() + 300
        while set(output_ids(kafka_settings)) != {d.id for d in docs}:
            assert time.monotonic() < deadline, "not every document was labeled"
            assert all(p.poll() is None for p in cluster.procs.values())
            time.sleep(1)
    finally:
        ended = cluster.stop_all()
    survivor_status, survivor_err = ended[0]
    assert survivor_status == 0, survivor_err
    assert ended[1][0] == 0, ended[1][1]
    only_one_liners(survivor_err)
    only_one_liners(ended[1][1])
    peer = cluster.addresses[1]
    assert (
        f"lost process 1 ({peer}): not answering; restarting the workers from the last"
        " snapshot in 0.2 s (restart 1 of 5)"
    ) in survivor_err


def test_a_hostile_neighbour_on_the_control_port_neither_drains_nor_stalls_the_cluster(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    first, second = many(20, "a"), many(20, "b")
    send(kafka_settings, first)
    cluster = Cluster(kafka_settings, exported["bert"], tmp_path)
    procs = [cluster.start(0), cluster.start(1)]
    host, port = cluster.addresses[0].split(":")
    control = (host, int(port) + 1)
    idle: list[socket.socket] = []
    try:
        wait_for_outputs(kafka_settings, len(first), procs[0], timeout_s=180)
        for headers in ({}, {"Authorization": "Bearer guess"}):
            request = urllib.request.Request(
                f"http://{host}:{control[1]}/drain", data=b"", method="POST", headers=headers
            )
            with pytest.raises(urllib.error.HTTPError, match="403"):
                urllib.request.urlopen(request, timeout=5)
        idle = [socket.create_connection(control, timeout=5) for _ in range(500)]
        began = time.monotonic()
        assert cluster.state(0) == "running" and time.monotonic() - began < 1.0
        send(kafka_settings, second)
        wait_for_outputs(kafka_settings, len(first) + len(second), procs[0], timeout_s=180)
        assert all(p.poll() is None for p in procs), "a process stopped"
    finally:
        for s in idle:
            s.close()
        ended = cluster.stop_all()
    assert all(status == 0 for status, _ in ended.values()), ended
    assert set(output_ids(kafka_settings)) == {d.id for d in first + second}
    assert "refused a drain request from 127.0.0.1: no token" in ended[0][1]


def test_sigterm_to_one_process_drains_the_whole_cluster_and_a_restart_resumes_losing_nothing(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = many(250)
    send(kafka_settings, docs)
    cluster = Cluster(kafka_settings, exported["bert"], tmp_path)
    for i in (0, 1):
        cluster.start(i)
    wait_for_outputs(kafka_settings, 200, cluster.procs[0], timeout_s=180)
    began = time.monotonic()
    cluster.procs[1].send_signal(signal.SIGTERM)
    ended = {i: (p.wait(timeout=60), p) for i, p in cluster.procs.items()}
    assert time.monotonic() - began < 35  # the drain bound is 30 s
    for i, (status, p) in ended.items():
        _, err = p.communicate()
        assert status == 0, err
        only_one_liners(err)
        if i == 0:
            assert "a peer is stopping: draining this process too" in err
    done = output_count(kafka_settings)
    assert done < len(docs), "the job finished before the signal"

    restarted = [cluster.start(i, "--bounded") for i in (0, 1)]
    for p in restarted:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err
        only_one_liners(err)
    ids = output_ids(kafka_settings)
    assert set(ids) == {d.id for d in docs}
    assert len(ids) < len(docs) + done // 2, "the restart did not resume from the snapshots"


def test_a_peer_that_never_starts_is_one_line_and_a_non_zero_exit_after_the_connect_timeout(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    cluster = Cluster(
        kafka_settings, exported["bert"], tmp_path, "--cluster.connect-timeout-s", "4"
    )
    began = time.monotonic()
    alone = cluster.start(1)
    _, err = alone.communicate(timeout=60)
    assert alone.returncode == 1
    assert time.monotonic() - began < 30
    only_one_liners(err)
    peer = cluster.addresses[0]
    assert err.strip().splitlines()[-1] == (
        "kascade: the cluster did not form within 4 s (cluster.connect_timeout_s):"
        f" process 0 ({peer}): not answering"
    )
    assert output_count(kafka_settings) == 0


def test_a_job_resumes_on_fewer_processes_once_their_recovery_partitions_are_moved_together(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    first = many(60, prefix="a")
    send(kafka_settings, first)
    cluster = Cluster(kafka_settings, exported["bert"], tmp_path)
    for p in [cluster.start(i, "--bounded") for i in (0, 1)]:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert sorted(output_ids(kafka_settings)) == sorted(d.id for d in first)

    # As README says: every partition exactly once among the remaining processes' dirs.
    for part in (tmp_path / "recovery-1").glob("part-1.sqlite3*"):
        part.rename(tmp_path / "recovery-0" / part.name)
    later = many(20, prefix="b")
    send(kafka_settings, later)
    alone = kascade_run(
        kafka_settings,
        exported["bert"],
        "--bounded",
        "--recovery-dir",
        str(tmp_path / "recovery-0"),
    )
    _, err = alone.communicate(timeout=300)
    assert alone.returncode == 0, err
    ids = output_ids(kafka_settings)
    assert sorted(ids) == sorted(d.id for d in first + later)  # each once: resumed, not reread


def test_a_suspension_in_one_process_reaches_its_peer_through_the_control_channel(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """Each process has its own recovery directory, as on two hosts: what one process's
    live test suspends, the other learns over the authenticated control port."""
    import hashlib

    from kascade.schemas import CascadeUse, InputDocument, OutputRecord, suspensions
    from kascade.schemas.cascade import CASCADE_FILE

    def mixed(prefix: str, n: int) -> list[InputDocument]:
        return [
            InputDocument(id=f"{prefix}-{i}", text=t, lang=("sw", "de")[i % 2])
            for i, t in enumerate(texts(n))
        ]

    first, second = mixed("a", 20), mixed("b", 60)
    cluster = Cluster(kafka_settings, calibrated, tmp_path, "--cascade", "on")
    procs = [cluster.start(0), cluster.start(1)]
    sha = hashlib.sha256((calibrated / CASCADE_FILE).read_bytes()).hexdigest()
    told = tmp_path / "recovery-1" / suspensions.SUSPENSIONS_FILE
    try:
        send(kafka_settings, first)
        wait_for_outputs(kafka_settings, len(first), procs[0], timeout_s=180)
        # as if process 0's test had fired for sw
        suspensions.add(tmp_path / "recovery-0", sha, "sw", "planted by the test")
        deadline = time.monotonic() + 15
        while not (told.is_file() and suspensions.load(told.parent).scopes(sha) == {"sw"}):
            assert time.monotonic() < deadline, "the peer was not told"
            time.sleep(0.2)
        time.sleep(2)  # each process's workers look at their file once a second
        send(kafka_settings, second)
        wait_for_outputs(kafka_settings, len(first) + len(second), procs[0], timeout_s=180)
    finally:
        ended = cluster.stop_all()
    assert all(status == 0 for status, _ in ended.values()), ended
    records = {
        r.id: r
        for r in (
            OutputRecord.model_validate_json(v)
            for _, v in read_all(kafka_settings, kafka_settings.output_topic)
        )
    }
    later = [records[d.id] for d in second]
    sw = [r for r in later if r.lang == "sw"]
    assert {r.source.partition for r in sw} == {0, 1}  # read by both processes
    assert all(r.cascade is CascadeUse.SUSPENDED for r in sw)
    assert all(r.cascade is CascadeUse.ON for r in later if r.lang == "de")
    assert "reports the live test fired for sw" in ended[1][1]


class TwoCalibrations:
    """A model directory per process, as on two hosts, with the calibration in force,
    and a new ``cascade.json`` to place in them one at a time."""

    def __init__(self, calibrated: Path, tmp_path: Path) -> None:
        import shutil

        from helpers import SMALL_CHUNKS, TINY_PATH, calibration

        from kascade.toolchain.calibrate import calibrate

        self.models = [tmp_path / f"model-{i}" for i in (0, 1)]
        for m in [*self.models, tmp_path / "new"]:
            shutil.copytree(calibrated, m)
        calibrate(
            tmp_path / "new",
            texts(400),
            calibration(epsilon=0.2, delta=0.1, chunking=SMALL_CHUNKS),
            path=TINY_PATH,
        )
        self.fresh = tmp_path / "new" / CASCADE_FILE
        self.old, self.new = _sha(calibrated / CASCADE_FILE), _sha(self.fresh)
        assert self.old != self.new

    def place(self, index: int) -> None:
        """The new file into process ``index``'s directory, atomically (as kascade
        calibrate writes it)."""
        import shutil

        model = self.models[index]
        shutil.copy(self.fresh, model / "cascade.json.tmp")
        (model / "cascade.json.tmp").replace(model / CASCADE_FILE)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _batch(prefix: str, n: int) -> list[InputDocument]:
    return [InputDocument(id=f"{prefix}-{i}", text=t) for i, t in enumerate(texts(n))]


def _until_taken_up(cluster: Cluster, new: str) -> None:
    """Until both processes say they run ``new``, and run."""
    from kascade.dataflow.peers import Peer
    from kascade.dataflow.plans import PlanView, view_of

    def taken(index: int) -> bool:
        host, port = cluster.addresses[index].split(":")
        view = view_of(Peer(index, cluster.addresses[index], (host, int(port) + 1)))
        return view == PlanView(new, new) and cluster.state(index) == "running"

    deadline = time.monotonic() + 90
    while not (taken(0) and taken(1)):
        assert time.monotonic() < deadline, "the cluster did not take up the calibration"
        time.sleep(0.2)


def test_a_new_calibration_is_taken_up_by_the_whole_cluster_once_every_host_holds_it(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """The new cascade.json reaches the hosts one at a time: while only one holds it,
    both keep the calibration in force (no record is settled under the new one); once
    both hold it, both drain and resume from the snapshot with it, every record after
    that names it, and every id is labeled once."""
    two = TwoCalibrations(calibrated, tmp_path)
    cluster = Cluster(kafka_settings, calibrated, tmp_path, "--cascade", "on")
    cluster.models = two.models
    procs = [cluster.start(0), cluster.start(1)]
    sent: list[InputDocument] = []

    def through(docs: list[InputDocument]) -> None:
        sent.extend(docs)
        send(kafka_settings, docs)
        wait_for_outputs(kafka_settings, len(sent), procs[0], timeout_s=180)

    try:
        through(_batch("first", 20))
        two.place(1)  # the host that is not process 0 first
        time.sleep(6)  # three looks at the model directory
        through(_batch("one-host", 40))
        two.place(0)
        _until_taken_up(cluster, two.new)
        through(_batch("after", 40))
    finally:
        ended = cluster.stop_all()
    assert all(status == 0 for status, _ in ended.values()), ended
    for _, err in ended.values():
        only_one_liners(err)
        assert "the workers resume from the snapshot with the new calibration" in err, err
    assert "this process waits for process 0" in ended[1][1], ended[1][1]
    records = labeled(kafka_settings)
    assert set(records) == {d.id for d in sent} and all(len(v) == 1 for v in records.values())
    shas = [records[d.id][0].model.cascade_sha256 for d in sent]
    # nothing under the new one while a host lacked it; everything after under it
    assert shas == [two.old] * 60 + [two.new] * 40
    after = {records[d.id][0].source.partition for d in sent[-40:]}
    assert after == {0, 1}  # both processes labeled with it


def test_a_process_started_with_another_calibration_is_named_and_the_cluster_converges(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """As after a host restarted its whole process with a newer cascade.json on its
    disk: each process says once that its peer runs another calibration; once process
    0's directory holds the same file, the cluster runs it alone."""
    two = TwoCalibrations(calibrated, tmp_path)
    two.place(1)  # before process 1 starts: it runs the new one from the start
    cluster = Cluster(kafka_settings, calibrated, tmp_path, "--cascade", "on")
    cluster.models = two.models
    procs = [cluster.start(0), cluster.start(1)]
    sent: list[InputDocument] = []

    def through(docs: list[InputDocument]) -> None:
        sent.extend(docs)
        send(kafka_settings, docs)
        wait_for_outputs(kafka_settings, len(sent), procs[0], timeout_s=180)

    try:
        through(_batch("apart", 40))
        time.sleep(5)  # two looks at the peers
        two.place(0)
        _until_taken_up(cluster, two.new)
        through(_batch("after", 40))
    finally:
        ended = cluster.stop_all()
    assert all(status == 0 for status, _ in ended.values()), ended
    for index, (_, err) in ended.items():
        only_one_liners(err)
        peer = 1 - index
        said = [line for line in err.splitlines() if f"process {peer} (" in line]
        assert len([line for line in said if " runs calibration " in line]) == 1, err
    records = labeled(kafka_settings)
    assert set(records) == {d.id for d in sent} and all(len(v) == 1 for v in records.values())
    # before: each process labeled under its own (records go to the process their id
    # hashes to, whichever partition they came from)
    assert {records[d.id][0].model.cascade_sha256 for d in sent[:40]} == {two.old, two.new}
    assert {records[d.id][0].model.cascade_sha256 for d in sent[-40:]} == {two.new}
