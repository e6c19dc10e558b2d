"""One start of the worker processes as a state machine: pure, so its rules are tested
without processes.

The supervisor looks at its processes every moment (:class:`Seen`) and hands what it saw
to :meth:`OneStart.step`, which moves the phase and says what to do to the processes
(:class:`Order`). A start forms (every process joins the cluster), runs, and ends:
finished (every process exited 0), failed (one exited otherwise while nobody asked it to
stop), not formed in time, or not drained in time. A stop (a signal, a peer) drains; a
new plan drains too, and the next start takes it up.

>>> start = OneStart(ids=frozenset({0, 1}), connect_timeout_s=30, drain_s=30)
>>> start.step(Seen(1.0, alive=frozenset({0, 1}), joined=frozenset({0})))
[]
>>> start.phase
<Phase.FORMING: 'forming'>
>>> start.step(Seen(2.0, alive=frozenset({0, 1}), joined=frozenset({0, 1}), new_plan=True))
[<Order.INTERRUPT: 'interrupt'>]
>>> start.step(Seen(3.0, alive=frozenset(), joined=frozenset({0, 1})))
[]
>>> start.phase
<Phase.FINISHED: 'finished'>
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    FORMING = "forming"  # started; not every process has joined the cluster
    RUNNING = "running"
    RELOADING = "reloading"  # draining to take up a new plan in the next start
    DRAINING = "draining"  # stopping: a signal, or a peer that stops
    FINISHED = "finished"  # every process exited 0
    FAILED = "failed"  # one exited otherwise, unasked
    NOT_FORMED = "not_formed"  # the cluster did not form within the connect timeout
    NOT_DRAINED = "not_drained"  # the processes did not drain within the drain time

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = {Phase.FINISHED, Phase.FAILED, Phase.NOT_FORMED, Phase.NOT_DRAINED}


class Order(StrEnum):
    INTERRUPT = "interrupt"  # SIGINT to every live process: drain, snapshot, exit
    KILL_UNJOINED = "kill_unjoined"  # one still waiting for its peers holds nothing
    TERMINATE = "terminate"  # SIGTERM to every live process, SIGKILL after a grace
    KILL = "kill"  # every live process, now
    SAY_WAITING = "say_waiting"  # once: whom the cluster waits for


@dataclass(frozen=True)
class Seen:
    """The processes of one start at one moment."""

    at_s: float  # since the start
    alive: frozenset[int]
    joined: frozenset[int]  # have said they joined the cluster (never shrinks)
    failed: tuple[int, ...] = ()  # exited with a status other than 0, in id order
    stopping: bool = False
    new_plan: bool = False  # a new plan waits to be taken up


@dataclass
class OneStart:
    ids: frozenset[int]
    connect_timeout_s: float
    drain_s: float
    notice_s: float | None = None  # when to say whom a cluster waits for (None: never)
    phase: Phase = Phase.FORMING
    failed: tuple[int, ...] = ()  # the processes that failed, as first seen
    _drain_until: float | None = field(default=None, repr=False)
    _told_waiting: bool = field(default=False, repr=False)

    def step(self, seen: Seen) -> list[Order]:
        if self.phase.ended:
            return []
        if not seen.alive:
            self.failed = seen.failed
            self.phase = Phase.FAILED if seen.failed else Phase.FINISHED
            return []
        if seen.failed and not seen.stopping:
            self.failed = seen.failed
            self.phase = Phase.FAILED
            return [Order.TERMINATE]
        if seen.stopping:
            return self._drain(seen)
        if self.phase == Phase.RELOADING:
            return []
        if seen.joined >= self.ids:
            self.phase = Phase.RUNNING
            if seen.new_plan:
                # every process drains and snapshots; none starts the new plan before
                # all have stopped
                self.phase = Phase.RELOADING
                return [Order.INTERRUPT]
            return []
        if seen.at_s > self.connect_timeout_s:
            self.phase = Phase.NOT_FORMED
            return [Order.KILL]
        if self.notice_s is not None and not self._told_waiting and seen.at_s > self.notice_s:
            self._told_waiting = True
            return [Order.SAY_WAITING]
        return []

    def _drain(self, seen: Seen) -> list[Order]:
        self.phase = Phase.DRAINING
        if self._drain_until is None:
            self._drain_until = seen.at_s + self.drain_s
        if seen.at_s > self._drain_until:
            self.phase = Phase.NOT_DRAINED
            return [Order.KILL]
        # Bytewax does not look at signals until the cluster has formed.
        return [Order.KILL_UNJOINED] if seen.alive - seen.joined else []
