"""How the processes of a job spread over several hosts watch each other: who the
peers are, and what this process asks them over their control port
(:mod:`~kascade.dataflow.control`, which says what each request does).

>>> [str(p) for p in peers_of(["a:9000", "b:9000", "c:9000"], own=1, offset=1)]
['process 0 (a:9000)', 'process 2 (c:9000)']
>>> peers_of(["a:9000", "b:9000"], own=0, offset=1)[0].control
('b', 9001)
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from kascade.schemas import suspensions

log = logging.getLogger(__name__)

NOT_ANSWERING = "not answering"


class State(StrEnum):
    """What a process answers on ``GET /state`` (one word: a peer reads it back)."""

    WAITING = "waiting"  # its dataflow is not connected to every peer yet
    RUNNING = "running"
    RESTARTING = "restarting"  # its workers died; they start again from the snapshot
    DRAINING = "draining"  # finishing what it holds, then exiting


# The longest reply read from a peer (a state; three sha256 digests on GET /calibration).
MAX_REPLY_BYTES = 256


@dataclass(frozen=True)
class Peer:
    index: int
    address: str  # host:port of its dataflow
    control: tuple[str, int]

    def __str__(self) -> str:
        return f"process {self.index} ({self.address})"


def control_address(address: str, offset: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port) + offset


def peers_of(hosts: list[str], own: int, offset: int) -> list[Peer]:
    """Every process of the cluster but ``own``."""
    return [Peer(i, a, control_address(a, offset)) for i, a in enumerate(hosts) if i != own]


def fetch(peer: Peer, path: str, timeout_s: float = 1.0) -> str | None:
    """The peer's answer to ``GET path``, or None when it does not answer."""
    host, port = peer.control
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout_s) as r:
            return r.read(MAX_REPLY_BYTES).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError, ValueError):
        return None


def probe(peer: Peer, timeout_s: float = 1.0) -> str:
    """The peer's state, or :data:`NOT_ANSWERING`."""
    text = fetch(peer, "/state", timeout_s)
    return text if text is not None and text.isalpha() else NOT_ANSWERING  # one word


def ask_to_drain(peer: Peer, token: str, timeout_s: float = 2.0) -> bool:
    return _post(peer, "/drain", token, timeout_s)


def nudge(peer: Peer, token: str) -> bool:
    """Ask a peer to look at process 0's calibration now rather than at its next look."""
    return _post(peer, "/calibration", token, timeout_s=2.0)


def tell_suspended(peer: Peer, token: str, cascade_sha256: str, scope: str) -> bool:
    """Tell a peer that this process suspended ``scope`` for a calibration."""
    query = urllib.parse.urlencode({"cascade": cascade_sha256, "scope": scope})
    return _post(peer, f"/suspend?{query}", token, timeout_s=2.0)


def _post(peer: Peer, path: str, token: str, timeout_s: float) -> bool:
    host, port = peer.control
    request = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def states(peers: list[Peer]) -> dict[Peer, str]:
    """Every peer's state, probed in parallel (a host that is gone costs one timeout)."""
    found: dict[Peer, str] = {}
    threads = [
        threading.Thread(target=lambda p=p: found.__setitem__(p, probe(p)), daemon=True)
        for p in peers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {p: found.get(p, NOT_ANSWERING) for p in peers}


def describe(found: dict[Peer, str], *, want: Callable[[str], bool]) -> str:
    """The peers whose state ``want`` picks, with their states, as one phrase.

    >>> p, q = peers_of(["a:1", "b:1", "c:1"], own=0, offset=1)
    >>> describe({p: "not answering", q: "running"}, want=lambda s: s != "running")
    'process 1 (b:1): not answering'
    """
    picked = [f"{p}: {s}" for p, s in found.items() if want(s)]
    return ", ".join(picked)


# How often a cluster's process passes its new suspensions on to its peers.
SPREAD_POLL_S = 1.0


def suspended_by_peer(recovery_dir: Path) -> Callable[[str, str], None]:
    """What a peer's report of a suspension does here: the same scope in this host's
    suspensions file, which this host's workers adopt within a second."""

    def record(cascade_sha256: str, scope: str) -> None:
        try:
            suspensions.add(recovery_dir, cascade_sha256, scope, "reported by a peer process")
        except (OSError, ValueError) as e:
            log.warning("cannot record a peer's suspension in %s: %s", recovery_dir, e)

    return record


def spread_suspensions(
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
