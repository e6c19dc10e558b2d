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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kascade.dataflow.peers import Peer, fetch, nudge

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


class Plans:
    """The plan this process's workers run, and the one they take up next: at once on
    one host; over several, when the cluster agrees (:func:`agreed`). The supervisor's
    plan watcher :meth:`offer` s what the model directory holds; its loop calls
    :meth:`take_up` before every start."""

    def __init__(
        self,
        build: Callable[..., Any],
        in_force: str | None,
        own: int,
        peers: list[Peer],
        token: str | None,
    ) -> None:
        self.build = build  # the flow builder the workers run
        self.in_force = in_force  # the sha256 of its cascade.json
        self.own, self.peers, self.token = own, peers, token
        self.ready: NewPlan | None = None  # a new calibration checked, not yet agreed on
        self.taking: str | None = None  # the calibration of ``next``
        self.next: Callable[..., Any] | None = None  # the next start's builder, decided
        self._said: set[str] = set()  # what waiting or apart was said once
        self._followed: set[str] = set()  # take-ups of process 0 this process joined

    @property
    def decided(self) -> bool:
        """Whether the workers drain to start with another plan."""
        return self.next is not None

    def view(self) -> str:
        """What this process answers on ``GET /calibration``."""
        ready = self.in_force if self.ready is None else self.ready.cascade_sha256
        return PlanView(self.in_force, ready, self.taking).text()

    def offer(self, found: NewPlan | None) -> None:
        """A new calibration the model directory holds (None: nothing new since the
        last look): decided on at once on one host, agreed on with the peers on several."""
        self.ready = found or self.ready
        pending = self.ready is not None and self.ready.cascade_sha256 != self.in_force
        if not self.peers:
            if pending and self.ready is not None:
                self._decide(self.ready)
            return
        views = {p: view_of(p) for p in self.peers}
        if pending and self.ready is not None:
            self._agree(self.ready, views)
        self._follow(views)
        self._say_apart(views)

    def take_up(self) -> None:
        """Before a start (the first, after a drain, after a failure: each resumes from
        the snapshot, a consistent point): the plan decided on, if any; one that was
        away starts with the cluster's."""
        if self.next is None and self.ready is not None and self.peers:
            self._agree(self.ready, {p: view_of(p) for p in self.peers})
        if self.next is None:
            return
        new = self.taking != self.in_force
        self.build, self.next = self.next, None
        self.in_force, self.taking = self.taking, None
        if self.ready is not None and self.ready.cascade_sha256 == self.in_force:
            self.ready = None
        if new:
            log.warning("the workers resume from the snapshot with the new calibration")
        else:
            log.warning("the workers resume from the snapshot with the rest of the cluster")

    def _agree(self, plan: NewPlan, views: dict[Peer, PlanView | None]) -> None:
        sha = plan.cascade_sha256
        if agreed(sha, self.own, views):
            log.warning(
                "the cluster takes up the new calibration (sha256 %s), this process with it",
                sha[:12],
            )
            self._decide(plan)
        elif sha not in self._said:
            self._said.add(sha)
            log.warning(
                "a new calibration (sha256 %s) is ready here; the cluster takes it up all at"
                " once, so this process waits for %s",
                sha[:12],
                waiting_for(sha, self.own, views),
            )

    def _follow(self, views: dict[Peer, PlanView | None]) -> None:
        """Drain along with process 0 when it takes up the calibration this process
        already runs (it started with the newer file): a cluster drains and starts as
        one, so every process restarts from the snapshot with it."""
        lead = [v for p, v in views.items() if p.index == LEADER]
        if not lead or lead[0] is None or self.next is not None:
            return
        sha = lead[0].taking
        if sha is None or sha != self.in_force or sha in self._followed:
            return
        self._followed.add(sha)
        log.warning(
            "process 0 takes up calibration %s, which this process runs: draining with it",
            sha[:12],
        )
        self.taking = sha
        self.next = self.build

    def _say_apart(self, views: dict[Peer, PlanView | None]) -> None:
        """Say once for each peer that runs another calibration than this process (one
        whose whole process started again with a newer file on its disk)."""
        for peer, view in views.items():
            if view is None or self.taking or view.taking or view.in_force == self.in_force:
                continue
            key = f"{peer.index} {view.in_force} {self.in_force}"
            if key not in self._said:
                self._said.add(key)
                log.warning(
                    "%s runs calibration %s, this process %s: records name the one that"
                    " settled them, until every host's model directory holds the same"
                    " cascade.json and the cluster takes it up",
                    peer,
                    (view.in_force or "none")[:12],
                    (self.in_force or "none")[:12],
                )

    def _decide(self, plan: NewPlan) -> None:
        if plan.cascade_sha256 == self.in_force:
            return  # the plan watcher and a start both agreed: taken up once
        self._followed.add(plan.cascade_sha256)
        self.taking = plan.cascade_sha256
        self.next = plan.build  # last: the supervisor's loop reads it first
        if self.peers and self.own == LEADER and self.token is not None:
            # the others follow at their next look; asked, they look now, so the
            # cluster drains as one
            threading.Thread(target=_nudge, args=(self.peers, self.token), daemon=True).start()


def _nudge(peers: list[Peer], token: str) -> None:
    for p in peers:
        nudge(p, token)
