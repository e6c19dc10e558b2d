"""The worker processes of a run on this host: started, relayed, drained, restarted.

One process per worker (Bytewax cluster mode on 127.0.0.1 ports), or, in a job spread
over several hosts (``addresses``, ``process_id``), this host's one process of the
cluster. Each tells the supervisor it joined, what it did and why it failed on a channel
of its own (:mod:`~kascade.dataflow.channel`); their output is relayed, and once one
fails, its siblings' lines at losing it are held back so the first cause is what is
read; a process that lost a peer on another host says which
(:mod:`~kascade.dataflow.peers`). A cluster that has not formed within
``cluster.connect_timeout_s`` is one line and exit 1. SIGTERM/SIGINT drains them (the
whole cluster, when spread over hosts). With a recovery directory a run whose worker
died starts again from the last snapshot, as :mod:`~kascade.dataflow.restarts` rules. A
record a worker died inside (:mod:`kascade.operators.inflight`) is counted in the
recovery directory's quarantine; after ``restarts.quarantine_after`` deaths the
restarted flow dead-letters it instead of dying on it again.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from bytewax.dataflow import Dataflow

from kascade import logs
from kascade.dataflow import channel
from kascade.dataflow.channel import Event
from kascade.dataflow.peers import (
    NOT_ANSWERING,
    ControlServer,
    Peer,
    State,
    ask_to_drain,
    describe,
    peers_of,
    states,
    tell_suspended,
)
from kascade.dataflow.ports import free_port
from kascade.dataflow.restarts import RestartPolicy
from kascade.logs import LogConfig
from kascade.operators import inflight
from kascade.schemas import suspensions
from kascade.schemas.quarantine import Quarantine, Suspect
from kascade.schemas.settings import Settings

log = logging.getLogger(__name__)

# A worker's exit status for a KascadeError (settings, broker, model): a restart would
# fail the same way, so the job exits.
FATAL_EXIT = 3
# A worker that lost its connection to a peer (Bytewax panics): the peer is the cause.
PEER_LOST_EXIT = 4
# How long workers get to finish what they hold after SIGTERM/SIGINT.
DRAIN_S = 30.0
# How long a cluster may take to form before the supervisor says whom it waits for.
WAIT_NOTICE_S = 3.0
# How long after losing a peer its supervisor has surely noticed too.
LOST_PROBE_DELAY_S = 0.5
# Bytewax (timely) prints this every second while a peer's port refuses connections.
_TIMELY_RETRY = re.compile(r"error connecting to worker \d+")


def notes_dir(recovery_dir: Path) -> Path:
    return recovery_dir / "inflight"


@dataclass(frozen=True)
class Orders:
    """What a worker process is sent on stdin."""

    settings: Settings
    build: Callable[[Settings], Dataflow]
    restarts: int  # so far in this job, for the metric
    supervisor_pid: int  # a worker outlives its supervisor by no more than a moment
    logs: LogConfig  # the level and format the command line chose


@dataclass(frozen=True)
class Layout:
    """Which processes of the cluster run on this host, and where the others are."""

    ids: tuple[int, ...]
    hosts: tuple[str, ...] | None  # None: this host's workers on fresh local ports
    peers: list[Peer]

    @classmethod
    def of(cls, settings: Settings) -> Layout:
        hosts = settings.hosts
        if hosts is None:
            return cls(tuple(range(settings.workers)), None, [])
        own = settings.process_id
        assert own is not None
        return cls((own,), tuple(hosts), peers_of(hosts, own, settings.cluster.control_port_offset))

    def addresses(self) -> list[str]:
        if self.hosts is not None:
            return list(self.hosts)
        return [f"127.0.0.1:{free_port()}" for _ in self.ids]


@dataclass(frozen=True)
class Ending:
    """How one start of the worker processes ended."""

    cause: str | None = None  # None: every worker finished
    fatal: bool = False
    suspect: Suspect | None = None
    # What the workers that exited (not those killed) labeled and dead-lettered.
    totals: Counter[str] = field(default_factory=Counter)


def supervise(
    settings: Settings,
    build: Callable[[Settings], Dataflow],
    replan: Callable[[], Callable[[Settings], Dataflow] | None] | None = None,
) -> Counter[str]:
    """Run this host's worker processes until the flow ends, or raise
    :class:`WorkerFailed` with the first failure's cause. Returns what the workers
    labeled and dead-lettered (as :func:`kascade.operators.metrics.totals` counts), over
    every start, less what workers that were killed had done.

    ``replan`` (asked every few seconds where a recovery directory and a single host
    allow it) returns a new flow builder when the run's plan changed (a new calibration,
    :mod:`kascade.dataflow.recalibration`): every worker drains, and all resume from the
    snapshot with it."""
    r = settings.restarts
    policy = RestartPolicy(r, recoverable=settings.recovery_dir is not None)
    layout = Layout.of(settings)
    token = settings.cluster.token() if layout.hosts is not None else None
    stopping = threading.Event()
    running: list[subprocess.Popen] = []
    replanned: list[Callable[[Settings], Dataflow]] = []  # the next start's builder
    reloading = threading.Event()

    def watch_the_plan() -> None:
        assert replan is not None
        while not stopping.wait(REPLAN_POLL_S):
            if reloading.is_set():
                continue  # the last one is being taken up
            try:
                new = replan()
            except Exception:  # a failed look costs nothing: the plan in force stays
                log.exception("could not check the model directory for a new calibration")
                continue
            if new is not None:
                replanned[:] = [new]
                reloading.set()

    def stop() -> None:
        stopping.set()
        if control is not None:
            control.state = State.DRAINING
        for p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # workers drain on SIGINT (Bytewax's interrupt)

    def signalled(_signum: int, _frame: object) -> None:
        # SIGTERM reaches us from systemd, Kubernetes or docker stop. A cluster drains as
        # one: a process that stopped reading alone would leave its peers waiting on it.
        first = not stopping.is_set()
        stop()
        if first:
            # Said here once, not by each worker: they drain on the signal passed on.
            log.warning("draining: no new records are read; a second signal stops at once")
        if first and layout.peers:
            log.warning("draining: asking the cluster's other processes to drain too")
            assert token is not None  # peers mean several hosts, which need a token
            asking = threading.Thread(target=_drain_peers, args=(layout.peers, token), daemon=True)
            asking.start()

    def drained_by_peer() -> None:
        if not stopping.is_set():
            log.warning("a peer is stopping: draining this process too")
            stop()

    control = None
    if layout.hosts is not None:
        assert token is not None  # a job over several hosts has one (Settings checks)
        own = layout.hosts[layout.ids[0]]
        recovery_dir = settings.recovery_dir
        control = ControlServer(
            own,
            settings.cluster.control_port_offset,
            drained_by_peer,
            token=token,
            bind=settings.cluster.control_host,
            on_suspend=None if recovery_dir is None else _suspended_by_peer(recovery_dir),
        )
        if recovery_dir is not None and layout.peers:
            spread = threading.Thread(
                target=_spread_suspensions,
                args=(recovery_dir, layout.peers, token, stopping),
                name="spread-suspensions",
                daemon=True,
            )
            spread.start()
    previous = {s: signal.signal(s, signalled) for s in (signal.SIGINT, signal.SIGTERM)}
    if replan is not None and settings.recovery_dir is not None and layout.hosts is None:
        threading.Thread(target=watch_the_plan, name="replan", daemon=True).start()
    try:
        totals: Counter[str] = Counter()
        while True:
            began = time.monotonic()
            ending = _start_once(
                settings, build, layout, policy.restarts, running, stopping, control, reloading
            )
            totals += ending.totals
            if ending.cause is None and reloading.is_set() and not stopping.is_set():
                build = replanned.pop()
                reloading.clear()
                log.warning("the workers resume from the snapshot with the new calibration")
                continue
            if ending.cause is None:
                return totals
            ran_s = time.monotonic() - began
            wait = policy.after_failure(
                ending.cause, fatal=ending.fatal, ran_s=ran_s, stopping=stopping.is_set()
            )
            if ending.suspect is not None and settings.recovery_dir is not None:
                _count_death(settings.recovery_dir, ending.suspect, r.quarantine_after)
            if control is not None:
                control.state = State.RESTARTING
            log.warning(
                "%s; restarting the workers from the last snapshot in %g s (restart %d of %d)",
                ending.cause,
                wait,
                policy.restarts,
                r.limit,
            )
            if stopping.wait(wait):
                return totals  # stopped during the backoff: nothing was in flight
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if control is not None:
            control.close()


# How often a supervised job looks for a new plan (cascade.json) in the model directory.
REPLAN_POLL_S = 2.0
# How often a cluster's process passes its new suspensions on to its peers.
SPREAD_POLL_S = 1.0


def _suspended_by_peer(recovery_dir: Path) -> Callable[[str, str], None]:
    """What a peer's report of a suspension does here: the same scope in this host's
    suspensions file, which this host's workers adopt within a second."""

    def record(cascade_sha256: str, scope: str) -> None:
        try:
            suspensions.add(recovery_dir, cascade_sha256, scope, "reported by a peer process")
        except (OSError, ValueError) as e:
            log.warning("cannot record a peer's suspension in %s: %s", recovery_dir, e)

    return record


def _spread_suspensions(
    recovery_dir: Path, peers: list[Peer], token: str, stopping: threading.Event
) -> None:
    """Tell every peer each suspension this host's file holds, until each has answered
    (an unreachable peer is told again later; telling twice changes nothing)."""
    told: set[tuple[Peer, str, str]] = set()
    while not stopping.wait(SPREAD_POLL_S):
        try:
            entries = suspensions.load(recovery_dir).suspended
        except (OSError, ValueError):
            continue
        for entry in entries:
            for peer in peers:
                key = (peer, entry.cascade_sha256, entry.scope)
                if key not in told and tell_suspended(peer, token, *key[1:]):
                    told.add(key)


def _drain_peers(peers: list[Peer], token: str) -> None:
    unreached = [str(p) for p in peers if not ask_to_drain(p, token)]
    if unreached:
        log.warning("could not ask %s to drain", ", ".join(unreached))


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
    layout: Layout,
    restarts: int,
    running: list[subprocess.Popen],
    stopping: threading.Event,
    control: ControlServer | None,
    reloading: threading.Event | None = None,
) -> Ending:
    notes = None if settings.recovery_dir is None else notes_dir(settings.recovery_dir)
    if notes is not None:
        for old in notes.glob("*"):
            old.unlink()
    addresses = layout.addresses()
    # Secrets travel by pipe, never in argv or the environment.
    payload = pickle.dumps(Orders(settings, build, restarts, os.getpid(), logs.current())).hex()
    running.clear()
    channels = []
    for i in layout.ids:
        theirs, ours = _channel()
        p = subprocess.Popen(
            [sys.executable, "-m", "kascade.dataflow.worker", str(i), ";".join(addresses)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # Bytewax prints its connection retries here
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            pass_fds=(theirs,),
            env=os.environ | {channel.ENV: str(theirs)},
        )
        os.close(theirs)  # the worker holds the only writer: its exit ends our reading
        assert p.stdin is not None
        p.stdin.write(payload)
        p.stdin.close()
        running.append(p)
        channels.append(ours)
    procs = dict(zip(layout.ids, running, strict=True))
    relay = _Relay(procs, dict(zip(layout.ids, channels, strict=True)))
    began = time.monotonic()
    timeout_s = settings.cluster.connect_timeout_s
    told_waiting = False
    deadline = None
    reload_asked = False
    while any(p.poll() is None for p in procs.values()):
        joined = relay.joined() >= procs.keys()
        if reloading is not None and reloading.is_set() and joined and not reload_asked:
            # every worker drains and snapshots; none starts the new plan before all stop
            reload_asked = True
            log.warning("a new calibration: draining the workers to take it up")
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
        if control is not None and not stopping.is_set():
            control.state = State.RUNNING if joined else State.WAITING
        failed = [i for i, p in procs.items() if p.poll() not in (None, 0)]
        if failed and not stopping.is_set():
            _terminate(list(procs.values()))
            relay.join()
            return _failure(procs, failed, relay, notes, layout.peers)
        if stopping.is_set():
            # A worker still waiting for its peers holds nothing, and Bytewax does not
            # look at signals until the cluster has formed.
            for i, p in procs.items():
                if i not in relay.joined() and p.poll() is None:
                    p.kill()
            deadline = deadline or time.monotonic() + DRAIN_S
            if time.monotonic() > deadline:
                _terminate(list(procs.values()), grace_s=0)
                return Ending(f"workers did not drain within {DRAIN_S:g} s; killed", fatal=True)
        elif not joined:
            waited = time.monotonic() - began
            if waited > timeout_s:
                _terminate(list(procs.values()), grace_s=0)
                relay.join()
                missing = _missing(layout.peers, relay)
                return Ending(
                    f"the cluster did not form within {timeout_s:g} s"
                    f" (cluster.connect_timeout_s): {missing}",
                    fatal=True,
                )
            if layout.peers and not told_waiting and waited > WAIT_NOTICE_S:
                told_waiting = True
                log.warning(
                    "waiting up to %g s for the cluster to form: %s",
                    timeout_s,
                    _missing(layout.peers, relay),
                )
        time.sleep(0.2)
    relay.join()
    failed = [i for i, p in procs.items() if p.returncode]
    if failed:
        return _failure(procs, failed, relay, notes, layout.peers)
    return Ending(totals=relay.totals())


def _missing(peers: list[Peer], relay: _Relay) -> str:
    """Who the cluster is waiting for, as a peer would see it."""
    if not peers:
        return "this host's worker processes did not connect to each other"
    found = states(peers)
    absent = describe(found, want=lambda s: s == NOT_ANSWERING)
    if absent:
        return absent
    retry = relay.last_retry()
    return f"every peer answers ({describe(found, want=bool)})" + (
        f" but the dataflow cannot connect: {retry}" if retry else ""
    )


def _failure(
    procs: dict[int, subprocess.Popen],
    failed: list[int],
    relay: _Relay,
    notes: Path | None,
    peers: list[Peer],
) -> Ending:
    """The ending told by the worker that failed first, with the record it died inside."""
    index = _first_failure(procs, failed, relay)
    code = procs[index].returncode
    if code == PEER_LOST_EXIT:
        # Not this host's fault: no record is suspected, and the peers say who is gone.
        cause = _lost(peers) if peers else _cause(relay, index, code)
        return Ending(cause, totals=relay.totals())
    suspect = None if notes is None else inflight.read(notes / str(index))
    return Ending(_cause(relay, index, code), code == FATAL_EXIT, suspect, relay.totals())


def _lost(peers: list[Peer]) -> str:
    time.sleep(LOST_PROBE_DELAY_S)  # a peer whose worker died says "restarting" by then
    found = states(peers)
    gone = describe(found, want=lambda s: s != State.RUNNING)
    if gone:
        return f"lost {gone}"
    return f"lost the cluster's connection ({describe(found, want=bool)})"


def _first_failure(procs: dict[int, subprocess.Popen], failed: list[int], relay: _Relay) -> int:
    # A process killed by a signal printed nothing, and its siblings' lines at losing it
    # may arrive first: the killed one is the cause; one that lost its peers is the last.
    killed = [i for i in failed if procs[i].returncode < 0]
    if killed:
        return killed[0]
    own = [i for i in failed if procs[i].returncode != PEER_LOST_EXIT]
    first = relay.first_failure()
    if first is not None and (first in own or not own):
        return first
    return (own or failed)[0]


def _cause(relay: _Relay, index: int, code: int) -> str:
    if code < 0:
        return f"worker {index} was killed by {signal.Signals(-code).name}"
    return relay.cause(index) or f"worker {index} exited with status {code}"


def _channel() -> tuple[int, TextIO]:
    """A pipe for a worker's notes: the end it writes to (its number, for the worker's
    environment) and the end this process reads."""
    read_end, write_end = os.pipe()
    return write_end, os.fdopen(read_end, encoding="utf-8", errors="replace")


class _Relay:
    """What the workers say: their notes on the channel (joined, totals, the cause of a
    failure), and their output, forwarded to stderr minus Bytewax's connection retries
    (one a second per missing peer: the supervisor says once whom it waits for). Once one
    worker has failed, its siblings' lines are held back."""

    def __init__(self, procs: dict[int, subprocess.Popen], channels: dict[int, TextIO]) -> None:
        self._lock = threading.Lock()
        self._first: int | None = None
        self._causes: dict[int, str] = {}
        self._joined: set[int] = set()
        self._retry: str | None = None
        self._totals: Counter[str] = Counter()
        self._threads = [
            threading.Thread(target=self._pump, args=(i, p), daemon=True) for i, p in procs.items()
        ] + [
            threading.Thread(target=self._listen, args=(i, c), daemon=True)
            for i, c in channels.items()
        ]
        for t in self._threads:
            t.start()

    def _listen(self, index: int, stream: TextIO) -> None:
        with stream:
            for note in channel.notes(stream):
                with self._lock:
                    if note.event == Event.JOINED:
                        self._joined.add(index)
                    elif note.event == Event.TOTALS:
                        self._totals.update(note.counts)
                    elif note.event == Event.FAILED:
                        self._causes[index] = note.cause or f"worker {index} failed"
                        if self._first is None:
                            self._first = index

    def _pump(self, index: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                if _TIMELY_RETRY.search(line):
                    self._retry = line.strip()
                    continue
                if self._first is None or self._first == index:
                    sys.stderr.write(line)

    def totals(self) -> Counter[str]:
        with self._lock:
            return Counter(self._totals)

    def joined(self) -> set[int]:
        with self._lock:
            return set(self._joined)

    def last_retry(self) -> str | None:
        with self._lock:
            return self._retry

    def first_failure(self) -> int | None:
        with self._lock:
            return self._first

    def cause(self, index: int) -> str | None:
        with self._lock:
            return self._causes.get(index)

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
