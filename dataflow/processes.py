"""The worker processes of one start: spawned with their orders, heard, and ended.

Each process gets its :class:`Orders` on stdin (secrets travel by pipe, never in argv or
the environment) and a channel of its own (:mod:`~kascade.dataflow.channel`) on which it
says it joined, what it did and why it failed. Their output is relayed to stderr, and
once one fails, its siblings' lines at losing it are held back so the first cause is
what is read; a process that lost a peer on another host says which
(:mod:`~kascade.dataflow.peers`).
"""

from __future__ import annotations

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

from kascade.dataflow import channel
from kascade.dataflow.channel import Event
from kascade.dataflow.lifecycle import Seen
from kascade.dataflow.peers import NOT_ANSWERING, Peer, State, describe, peers_of, states
from kascade.dataflow.ports import free_port
from kascade.logs import LogConfig
from kascade.operators import inflight
from kascade.schemas.quarantine import Suspect
from kascade.schemas.settings import Settings

# A worker's exit status for a KascadeError (settings, broker, model): a restart would
# fail the same way, so the job exits.
FATAL_EXIT = 3
# A worker that lost its connection to a peer (Bytewax panics): the peer is the cause.
PEER_LOST_EXIT = 4
# How long after losing a peer its supervisor has surely noticed too.
LOST_PROBE_DELAY_S = 0.5
# Bytewax (timely) prints this every second while a peer's port refuses connections.
_TIMELY_RETRY = re.compile(r"error connecting to worker \d+")


# Names the directory a job's processes on this host share what must reach them all
# (the suspensions of the live test): the recovery directory, or one made for the run.
SHARED_DIR_ENV = "KASCADE_SHARED_DIR"


def notes_dir(recovery_dir: Path) -> Path:
    return recovery_dir / "inflight"


def shared_dir() -> Path | None:
    """The directory this worker process shares with its siblings (None: not a worker)."""
    value = os.environ.get(SHARED_DIR_ENV)
    return None if value is None else Path(value)


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


class Started:
    """The processes of one start, and what they say."""

    def __init__(self, orders: Orders, layout: Layout, addresses: list[str], shared: Path) -> None:
        payload = pickle.dumps(orders).hex()
        self.procs: dict[int, subprocess.Popen] = {}
        channels = {}
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
                env=os.environ | {channel.ENV: str(theirs), SHARED_DIR_ENV: str(shared)},
            )
            os.close(theirs)  # the worker holds the only writer: its exit ends our reading
            assert p.stdin is not None
            p.stdin.write(payload)
            p.stdin.close()
            self.procs[i] = p
            channels[i] = ours
        self.relay = _Relay(self.procs, channels)

    def seen(self, at_s: float, *, stopping: bool, new_plan: bool) -> Seen:
        codes = {i: p.poll() for i, p in self.procs.items()}
        return Seen(
            at_s,
            alive=frozenset(i for i, c in codes.items() if c is None),
            joined=frozenset(self.relay.joined()),
            failed=tuple(i for i, c in codes.items() if c not in (None, 0)),
            stopping=stopping,
            new_plan=new_plan,
        )

    def signal_all(self, signum: int) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signum)

    def kill_unjoined(self) -> None:
        joined = self.relay.joined()
        for i, p in self.procs.items():
            if i not in joined and p.poll() is None:
                p.kill()

    def terminate(self, grace_s: float = 10.0) -> None:
        procs = list(self.procs.values())
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

    def missing(self, peers: list[Peer]) -> str:
        """Who the cluster is waiting for, as a peer would see it."""
        if not peers:
            return "this host's worker processes did not connect to each other"
        found = states(peers)
        absent = describe(found, want=lambda s: s == NOT_ANSWERING)
        if absent:
            return absent
        retry = self.relay.last_retry()
        return f"every peer answers ({describe(found, want=bool)})" + (
            f" but the dataflow cannot connect: {retry}" if retry else ""
        )

    def failure(self, failed: tuple[int, ...], notes: Path | None, peers: list[Peer]) -> Ending:
        """The ending told by the process that failed first, with the record it died
        inside (``failed``: those seen failing, before any was terminated)."""
        self.relay.join()
        procs, relay = self.procs, self.relay
        index = _first_failure(procs, list(failed), relay)
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
