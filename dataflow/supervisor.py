"""The worker processes of a run on this host: started, relayed, drained, restarted.

One process per worker (Bytewax cluster mode on 127.0.0.1 ports). Their stderr is
relayed; once one fails, its siblings' panics at losing it are held back so the first
cause is what is read. SIGTERM/SIGINT drains them. With a recovery directory a run
whose worker died starts again from the last snapshot, after a backoff that doubles,
at most ``restarts.limit`` times in a row; a run that lasted ``restarts.healthy_after_s``
resets the count. A record a worker died inside (:mod:`kascade.operators.inflight`)
is counted in the recovery directory's quarantine; after ``restarts.quarantine_after``
deaths the restarted flow dead-letters it instead of dying on it again.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bytewax.dataflow import Dataflow
from kascade.dataflow.local_broker import free_port
from kascade.operators import inflight
from kascade.schemas.quarantine import Quarantine, Suspect
from kascade.schemas.settings import Settings

from kascade.errors import KascadeError

log = logging.getLogger(__name__)

# The line a worker process prints last when it fails: what the supervisor reports.
FAILURE_MARK = "kascade: worker "
# A worker's exit status for a KascadeError (settings, broker, model): a restart would
# fail the same way, so the job exits.
FATAL_EXIT = 3
# How long workers get to finish what they hold after SIGTERM/SIGINT.
DRAIN_S = 30.0


class WorkerFailed(KascadeError):
    """A worker process stopped with an error; the message is the first failure's."""


def notes_dir(recovery_dir: Path) -> Path:
    return recovery_dir / "inflight"


@dataclass(frozen=True)
class Orders:
    """What a worker process is sent on stdin."""

    settings: Settings
    build: Callable[[Settings], Dataflow]
    restarts: int  # so far in this job, for the metric
    supervisor_pid: int  # a worker outlives its supervisor by no more than a moment


@dataclass(frozen=True)
class Ending:
    """How one start of the worker processes ended."""

    cause: str | None = None  # None: every worker finished
    fatal: bool = False
    suspect: Suspect | None = None


def supervise(settings: Settings, build: Callable[[Settings], Dataflow]) -> int:
    """Run ``settings.workers`` processes until the flow ends; exit status 0, or raises
    :class:`WorkerFailed` with the first failure's cause."""
    r = settings.restarts
    stopping = threading.Event()
    running: list[subprocess.Popen] = []

    def stop(_signum: int, _frame: object) -> None:
        # Workers drain on SIGINT (Bytewax's interrupt); SIGTERM reaches us from systemd,
        # Kubernetes or docker stop.
        stopping.set()
        for p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        restarts, wait = 0, r.backoff_s
        while True:
            began = time.monotonic()
            ending = _start_once(settings, build, restarts, running, stopping)
            if ending.cause is None:
                return 0
            if time.monotonic() - began >= r.healthy_after_s:
                restarts, wait = 0, r.backoff_s
            if settings.recovery_dir is None or ending.fatal or stopping.is_set():
                raise WorkerFailed(ending.cause)
            if restarts >= r.limit:
                raise WorkerFailed(f"{ending.cause} (gave up after {restarts} restarts)")
            if ending.suspect is not None:
                _count_death(settings.recovery_dir, ending.suspect, r.quarantine_after)
            restarts += 1
            log.warning(
                "%s; restarting the workers from the last snapshot in %g s (restart %d of %d)",
                ending.cause,
                wait,
                restarts,
                r.limit,
            )
            if stopping.wait(wait):
                return 0  # stopped during the backoff: nothing was in flight
            wait = min(wait * 2, r.backoff_max_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _count_death(recovery_dir: Path, suspect: Suspect, after: int) -> None:
    q = Quarantine.load(recovery_dir).with_death(suspect.source, suspect.stage)
    q.save(recovery_dir)
    n = q.deaths(suspect.source)
    s = suspect.source
    where = f"{s.topic}/{s.partition}@{s.offset} at stage {suspect.stage}"
    if n >= after:
        log.error("record %s killed %d worker processes: it goes to the dead letters", where, n)
    else:
        log.warning("a worker died inside record %s (%d of %d deaths tolerated)", where, n, after)


def _start_once(
    settings: Settings,
    build: Callable[[Settings], Dataflow],
    restarts: int,
    running: list[subprocess.Popen],
    stopping: threading.Event,
) -> Ending:
    notes = None if settings.recovery_dir is None else notes_dir(settings.recovery_dir)
    if notes is not None:
        for old in notes.glob("*"):
            old.unlink()
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(settings.workers)]
    # Secrets travel by pipe, never in argv or the environment.
    payload = pickle.dumps(Orders(settings, build, restarts, os.getpid())).hex()
    running.clear()
    for i in range(settings.workers):
        p = subprocess.Popen(
            [sys.executable, "-m", "kascade.dataflow.worker", str(i), ";".join(addresses)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        assert p.stdin is not None
        p.stdin.write(payload)
        p.stdin.close()
        running.append(p)
    procs = list(running)
    relay = _Relay(procs)
    deadline = None
    while any(p.poll() is None for p in procs):
        failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed and not stopping.is_set():
            _terminate(procs)
            relay.join()
            return _failure(procs, failed, relay, notes)
        if stopping.is_set():
            deadline = deadline or time.monotonic() + DRAIN_S
            if time.monotonic() > deadline:
                _terminate(procs, grace_s=0)
                return Ending(f"workers did not drain within {DRAIN_S:g} s; killed", fatal=True)
        time.sleep(0.2)
    relay.join()
    failed = [i for i, p in enumerate(procs) if p.returncode]
    return _failure(procs, failed, relay, notes) if failed else Ending()


def _failure(
    procs: list[subprocess.Popen], failed: list[int], relay: _Relay, notes: Path | None
) -> Ending:
    """The ending told by the worker that failed first, with the record it died inside."""
    index = _first_failure(procs, failed, relay)
    code = procs[index].returncode
    suspect = None if notes is None else inflight.read(notes / str(index))
    return Ending(_cause(relay, index, code), code == FATAL_EXIT, suspect)


def _first_failure(procs: list[subprocess.Popen], failed: list[int], relay: _Relay) -> int:
    # A process killed by a signal printed nothing, and its siblings' panics at losing it
    # may arrive first: the killed one is the cause.
    killed = [i for i in failed if procs[i].returncode < 0]
    if killed:
        return killed[0]
    first = relay.first_failure()
    return first if first is not None else failed[0]


def _cause(relay: _Relay, index: int, code: int) -> str:
    if code < 0:
        return f"worker {index} was killed by {signal.Signals(-code).name}"
    return relay.cause(index) or f"worker {index} exited with status {code}"


class _Relay:
    """Forwards each worker's stderr; once one worker has failed, its siblings' lines
    are held back."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self._lock = threading.Lock()
        self._first: int | None = None
        self._causes: dict[int, str] = {}
        self._threads = [
            threading.Thread(target=self._pump, args=(i, p), daemon=True)
            for i, p in enumerate(procs)
        ]
        for t in self._threads:
            t.start()

    def _pump(self, index: int, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._lock:
                if line.startswith(FAILURE_MARK):
                    self._causes[index] = line.strip()
                    if self._first is None:
                        self._first = index
                    continue  # the supervisor reports it, once
                if self._first is None or self._first == index:
                    sys.stderr.write(line)

    def first_failure(self) -> int | None:
        with self._lock:
            return self._first

    def cause(self, index: int) -> str | None:
        with self._lock:
            line = self._causes.get(index)
        return None if line is None else line.removeprefix("kascade: ")

    def join(self, timeout_s: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout_s)


def _terminate(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
