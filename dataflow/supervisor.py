"""The worker processes of a run on this host: started, relayed, drained, restarted.

One process per worker (Bytewax cluster mode on 127.0.0.1 ports), or, in a job spread
over several hosts (``addresses``, ``process_id``), this host's one process of the
cluster (:mod:`~kascade.dataflow.processes`). Each start of them is a state machine
(:mod:`~kascade.dataflow.lifecycle`): forming, running, draining, reloading, and how it
ended. A cluster that has not formed within ``cluster.connect_timeout_s`` is one line
and exit 1. SIGTERM/SIGINT drains them (the whole cluster, when spread over hosts). With
a recovery directory a run whose worker died starts again from the last snapshot, as
:mod:`~kascade.dataflow.restarts` rules; a new plan (a new calibration) drains every
worker and the next start resumes from the snapshot with it. A record a worker died
inside (:mod:`kascade.operators.inflight`) is counted in the recovery directory's
quarantine; after ``restarts.quarantine_after`` deaths the restarted flow dead-letters
it instead of dying on it again.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bytewax.dataflow import Dataflow

from kascade import logs
from kascade.dataflow.control import ControlServer
from kascade.dataflow.lifecycle import OneStart, Order, Phase
from kascade.dataflow.peers import (
    Peer,
    State,
    ask_to_drain,
    spread_suspensions,
    suspended_by_peer,
)
from kascade.dataflow.plans import NewPlan, Plans
from kascade.dataflow.processes import Ending, Layout, Orders, Started, notes_dir
from kascade.dataflow.restarts import RestartPolicy
from kascade.schemas.quarantine import Quarantine, Suspect
from kascade.schemas.settings import Settings

log = logging.getLogger(__name__)

# How long workers get to finish what they hold after SIGTERM/SIGINT.
DRAIN_S = 30.0
# How long a cluster may take to form before the supervisor says whom it waits for.
WAIT_NOTICE_S = 3.0
# How often the supervisor looks at its processes.
LOOK_S = 0.2

Builder = Callable[[Settings], Dataflow]


def supervise(
    settings: Settings,
    build: Builder,
    replan: Callable[[], NewPlan | None] | None = None,
    calibration: str | None = None,
) -> Counter[str]:
    """Run this host's worker processes until the flow ends, or raise
    :class:`~kascade.dataflow.restarts.WorkerFailed` with the first failure's cause.
    Returns what the workers labeled and dead-lettered (as
    :func:`kascade.operators.metrics.totals` counts), over every start, less what
    workers that were killed had done.

    ``replan`` (asked every few seconds where a recovery directory allows it) returns a
    new plan when the model directory holds a new calibration
    (:mod:`kascade.dataflow.recalibration`; ``calibration`` is the one in force): every
    worker drains, and all resume from the snapshot with it; over several hosts, once
    every process holds it (:mod:`kascade.dataflow.plans`)."""
    return Supervisor(settings, build, replan, calibration).run()


class Supervisor:
    """Starts, watches and restarts this host's processes; drains them on a signal or at
    a peer's request; takes up a new plan. Its threads (signals, the control port, the
    plan watcher) only set ``stopping`` or what :attr:`plans` takes up next; the loop in
    :meth:`run` acts."""

    def __init__(
        self,
        settings: Settings,
        build: Builder,
        replan: Callable[[], NewPlan | None] | None,
        calibration: str | None = None,
    ) -> None:
        self.settings = settings
        self.replan = replan
        self.layout = Layout.of(settings)
        self.token = settings.cluster.token() if self.layout.hosts is not None else None
        self.stopping = threading.Event()
        self.plans = Plans(build, calibration, self.layout.ids[0], self.layout.peers, self.token)
        self._look = threading.Event()  # look at the plan now (stopping, or a peer asked)
        self._interrupted = False  # this start's workers were told to drain for a plan
        self.started: Started | None = None
        # What the processes share (suspensions): the recovery directory, or the run's own.
        self.shared = settings.recovery_dir or Path(tempfile.mkdtemp(prefix="kascade-run-"))
        try:
            self.control = self._control_port()
        except BaseException:  # a port that cannot be bound leaves no directory behind
            self._forget_shared()
            raise

    def run(self) -> Counter[str]:
        policy = RestartPolicy(self.settings.restarts, self.settings.recovery_dir is not None)
        previous = {s: signal.signal(s, self._signalled) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.replan is not None and self.settings.recovery_dir is not None:
            threading.Thread(target=self._watch_the_plan, name="replan", daemon=True).start()
        try:
            totals: Counter[str] = Counter()
            while True:
                self.plans.take_up()
                began = time.monotonic()
                ending = self._start_once(policy.restarts)
                totals += ending.totals
                if ending.cause is None and self.plans.decided and not self.stopping.is_set():
                    continue
                if ending.cause is None:
                    return totals
                if self._wait_to_restart(policy, ending, time.monotonic() - began):
                    return totals  # stopped during the backoff: nothing was in flight
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            if self.control is not None:
                self.control.close()
            self._forget_shared()

    def _forget_shared(self) -> None:
        if self.settings.recovery_dir is None:  # the run's own, not the user's
            shutil.rmtree(self.shared, ignore_errors=True)

    def _wait_to_restart(self, policy: RestartPolicy, ending: Ending, ran_s: float) -> bool:
        """Wait before the next start (True: stopped meanwhile); raises when there is none."""
        assert ending.cause is not None
        r = self.settings.restarts
        wait = policy.after_failure(
            ending.cause, fatal=ending.fatal, ran_s=ran_s, stopping=self.stopping.is_set()
        )
        if ending.suspect is not None and self.settings.recovery_dir is not None:
            _count_death(self.settings.recovery_dir, ending.suspect, r.quarantine_after)
        if self.control is not None:
            self.control.state = State.RESTARTING
        log.warning(
            "%s; restarting the workers from the last snapshot in %g s (restart %d of %d)",
            ending.cause,
            wait,
            policy.restarts,
            r.limit,
        )
        return self.stopping.wait(wait)

    def _start_once(self, restarts: int) -> Ending:
        settings, layout = self.settings, self.layout
        notes = None if settings.recovery_dir is None else notes_dir(settings.recovery_dir)
        if notes is not None:
            for old in notes.glob("*"):
                old.unlink()
        orders = Orders(settings, self.plans.build, restarts, os.getpid(), logs.current())
        self._interrupted = False
        self.started = started = Started(orders, layout, layout.addresses(), self.shared)
        if self.stopping.is_set():  # a signal while the processes were being started
            started.signal_all(signal.SIGINT)
        start = OneStart(
            frozenset(layout.ids),
            settings.cluster.connect_timeout_s,
            DRAIN_S,
            notice_s=WAIT_NOTICE_S if layout.peers else None,
        )
        began = time.monotonic()
        while not start.phase.ended:
            seen = started.seen(
                time.monotonic() - began,
                stopping=self.stopping.is_set(),
                new_plan=self.plans.decided,
            )
            for order in start.step(seen):
                self._carry_out(order, start)
            if self.control is not None and not self.stopping.is_set():
                self.control.state = _CONTROL_STATE.get(start.phase, self.control.state)
            if not start.phase.ended:
                time.sleep(LOOK_S)
        return self._ending(start, started, notes)

    def _carry_out(self, order: Order, start: OneStart) -> None:
        started = self.started
        assert started is not None
        if order == Order.INTERRUPT:
            log.warning("a new calibration: draining the workers to take it up")
            self._interrupted = True
            started.signal_all(signal.SIGINT)
        elif order == Order.KILL_UNJOINED:
            started.kill_unjoined()
        elif order == Order.TERMINATE:
            started.terminate()
        elif order == Order.KILL:
            started.terminate(grace_s=0)
        elif order == Order.SAY_WAITING:
            log.warning(
                "waiting up to %g s for the cluster to form: %s",
                start.connect_timeout_s,
                started.missing(self.layout.peers),
            )

    def _ending(self, start: OneStart, started: Started, notes: Path | None) -> Ending:
        if start.phase == Phase.NOT_DRAINED:
            return Ending(f"workers did not drain within {DRAIN_S:g} s; killed", fatal=True)
        started.relay.join()
        if start.phase == Phase.NOT_FORMED:
            return Ending(
                f"the cluster did not form within {start.connect_timeout_s:g} s"
                f" (cluster.connect_timeout_s): {started.missing(self.layout.peers)}",
                fatal=True,
            )
        if start.phase == Phase.FAILED:
            return started.failure(start.failed, notes, self.layout.peers)
        return Ending(totals=started.relay.totals())

    def stop(self) -> None:
        self.stopping.set()
        self._look.set()
        if self.control is not None:
            self.control.state = State.DRAINING
        if self.started is None:
            return
        if self._interrupted:
            # draining for a new plan already: a SIGINT now would be their second and stop
            # them mid-drain; the next signal does, as a second signal should
            self._interrupted = False
        else:
            self.started.signal_all(signal.SIGINT)  # workers drain on Bytewax's interrupt

    def _signalled(self, _signum: int, _frame: object) -> None:
        # SIGTERM reaches us from systemd, Kubernetes or docker stop. A cluster drains as
        # one: a process that stopped reading alone would leave its peers waiting on it.
        first = not self.stopping.is_set()
        self.stop()
        if first:
            # Said here once, not by each worker: they drain on the signal passed on.
            log.warning("draining: no new records are read; a second signal stops at once")
        if first and self.layout.peers:
            log.warning("draining: asking the cluster's other processes to drain too")
            assert self.token is not None  # peers mean several hosts, which need a token
            threading.Thread(
                target=_drain_peers, args=(self.layout.peers, self.token), daemon=True
            ).start()

    def _drained_by_peer(self) -> None:
        if not self.stopping.is_set():
            log.warning("a peer is stopping: draining this process too")
            self.stop()

    def _watch_the_plan(self) -> None:
        assert self.replan is not None
        while True:
            self._look.wait(REPLAN_POLL_S)
            self._look.clear()
            if self.stopping.is_set():
                return
            if self.plans.decided:
                continue  # the last one is being taken up
            try:
                self.plans.offer(self.replan())
            except Exception:  # a failed look costs nothing: the plan in force stays
                log.exception("could not check the model directory for a new calibration")

    def _control_port(self) -> ControlServer | None:
        """A job over several hosts answers its peers: states, drains, suspensions."""
        if self.layout.hosts is None:
            return None
        token, shared = self.token, self.shared
        assert token is not None  # a job over several hosts has one (Settings checks)
        control = ControlServer(
            self.layout.hosts[self.layout.ids[0]],
            self.settings.cluster.control_port_offset,
            self._drained_by_peer,
            token=token,
            bind=self.settings.cluster.control_host,
            on_suspend=suspended_by_peer(shared),
            plan=self.plans.view,
            on_plan=self._look.set,
        )
        if self.layout.peers:
            threading.Thread(
                target=spread_suspensions,
                args=(shared, self.layout.peers, token, self.stopping),
                name="spread-suspensions",
                daemon=True,
            ).start()
        return control


# What a start's phase tells peers that ask (a draining job says so from the moment it
# is asked to stop; a restarting one between starts).
_CONTROL_STATE = {
    Phase.FORMING: State.WAITING,
    Phase.RUNNING: State.RUNNING,
    Phase.RELOADING: State.RUNNING,
}


# How often a supervised job looks for a new plan (cascade.json) in the model directory.
REPLAN_POLL_S = 2.0


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
