"""One calibration in force across a job's hosts: a new one is taken up by all or none.

A job on one host takes up a new ``cascade.json`` as soon as it has checked it
(:mod:`~kascade.dataflow.recalibration`): its supervisor drains every worker and starts
them all again from the snapshot with it. A job spread over several hosts reads one
model directory per host, which the new file reaches one host at a time (a copy, a
volume that syncs, a rollout). No process takes it up before every process holds it,
so no two processes ever settle chunks under different calibrations at once:

- each process says on ``GET /calibration`` (:class:`PlanView`) the calibration its
  workers run, the newest its own model directory holds that it checked (``ready``),
  and the one it is draining to take up (``taking``);
- process 0 takes up calibration X once every peer's ``ready`` is X, and asks them to
  look at once (``POST /calibration``);
- every other process takes X up once process 0 takes it up or runs it (one that runs X
  already, having started with the newer file, drains with the cluster), and a process
  that starts again (a worker died, or it was away) starts with X when process 0 runs it.

Until then each process says once what it waits for. A process whose model directory
never receives the file keeps the whole job on the calibration in force.

>>> v = PlanView.parse("a" * 64 + " " + "b" * 64 + " -")
>>> (v.in_force[:3], v.ready[:3], v.taking)
('aaa', 'bbb', None)
>>> PlanView.parse(v.text()) == v, PlanView.parse("no such thing")
(True, None)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kascade.dataflow.peers import Peer, fetch

log = logging.getLogger(__name__)

_SHA = re.compile(r"[0-9a-f]{64}")
LEADER = 0  # the process that decides when the cluster takes up a new calibration


@dataclass(frozen=True)
class NewPlan:
    """A run's plan with a new calibration, checked and ready to start."""

    build: Callable[..., Any]  # the flow builder the next start runs
    cascade_sha256: str


@dataclass(frozen=True)
class PlanView:
    """What a process says of its calibration (sha256 of ``cascade.json``; ``None``:
    no cascade, or nothing new)."""

    in_force: str | None  # what its workers run
    ready: str | None  # the newest it checked and could run (in force, or pending)
    taking: str | None = None  # what it drains to take up

    def text(self) -> str:
        return " ".join(sha or "-" for sha in (self.in_force, self.ready, self.taking))

    @classmethod
    def parse(cls, text: str) -> PlanView | None:
        words = text.split()
        if len(words) != 3 or not all(w == "-" or _SHA.fullmatch(w) for w in words):
            return None
        in_force, ready, taking = (None if w == "-" else w for w in words)
        return cls(in_force, ready, taking)


def view_of(peer: Peer) -> PlanView | None:
    """``peer``'s calibration, or None when it does not answer."""
    text = fetch(peer, "/calibration")
    return None if text is None else PlanView.parse(text)


def agreed(sha: str, own: int, views: dict[Peer, PlanView | None]) -> bool:
    """Whether process ``own``, whose model directory holds calibration ``sha``
    (checked), takes it up now, given what its peers say.

    >>> from kascade.dataflow.peers import peers_of
    >>> zero, one = peers_of(["a:1", "b:1", "c:1"], own=2, offset=1)
    >>> x, w = "x" * 64, "w" * 64
    >>> agreed(x, 0, {one: PlanView(w, x), zero: PlanView(w, x)})
    True
    >>> agreed(x, 0, {one: PlanView(w, w), zero: PlanView(w, x)})  # one lacks it
    False
    >>> agreed(x, 2, {zero: PlanView(w, x), one: PlanView(w, x)})  # 0 has not decided
    False
    >>> agreed(x, 2, {zero: PlanView(w, x, taking=x), one: None})
    True
    """
    if own == LEADER:
        return all(v is not None and v.ready == sha for v in views.values())
    lead = next((v for p, v in views.items() if p.index == LEADER), None)
    return lead is not None and sha in (lead.taking, lead.in_force)


def waiting_for(sha: str, own: int, views: dict[Peer, PlanView | None]) -> str:
    """Whom process ``own`` waits for before taking up ``sha``, in words.

    >>> from kascade.dataflow.peers import peers_of
    >>> (zero,) = peers_of(["a:1", "b:1"], own=1, offset=1)
    >>> waiting_for("x" * 64, 1, {zero: None})
    'process 0 (a:1) to take it up (not answering)'
    """

    def holds(v: PlanView | None) -> str:
        if v is None:
            return "not answering"
        return f"it holds {(v.ready or 'no cascade')[:12]}"

    if own == LEADER:
        lacking = [f"{p} ({holds(v)})" for p, v in views.items() if v is None or v.ready != sha]
        return ", ".join(lacking) + " to hold it too"
    lead = [(p, v) for p, v in views.items() if p.index == LEADER]
    return ", ".join(f"{p} to take it up ({holds(v)})" for p, v in lead)
