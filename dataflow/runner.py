"""Runs the flow: a bounded cluster check first, then one process or N worker processes.

``workers > 1`` starts N processes on this host (Bytewax cluster mode on 127.0.0.1
ports), each with one Bytewax worker and its own ONNX Runtime session. To spread the
same flow over several hosts, run ``kascade run --addresses "h1:p;h2:p" --process-id I``
on each host, same list, its own id (see README).
"""

from __future__ import annotations

import logging
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from bytewax.dataflow import Dataflow
from bytewax.errors import BytewaxRuntimeError
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from kascade.dataflow.kafka_io import DRAIN, accepted_record_bytes, check_cluster
from kascade.dataflow.local_broker import free_port
from kascade.schemas.settings import Settings

from kascade.errors import KascadeError

log = logging.getLogger(__name__)

FlowBuilder = Callable[[Settings], Dataflow]


def required_topics(settings: Settings) -> list[str]:
    k = settings.kafka
    return [k.input_topic, k.output_topic, k.dead_letter_topic]


def with_record_limit(settings: Settings) -> Settings:
    """``settings`` with ``kafka.max_message_bytes`` read from the cluster when unset."""
    k = settings.kafka
    if k.max_message_bytes is not None:
        return settings
    limit = accepted_record_bytes(k, [k.output_topic, k.dead_letter_topic])
    return settings.model_copy(update={"kafka": k.model_copy(update={"max_message_bytes": limit})})


def recovery_config(settings: Settings) -> RecoveryConfig | None:
    """Bytewax recovery in ``settings.recovery_dir``, created on first use."""
    d = settings.recovery_dir
    if d is None:
        return None
    if not d.exists() or not any(d.iterdir()):
        d.mkdir(parents=True, exist_ok=True)
        init_db_dir(d, max(settings.workers, 1))
    return RecoveryConfig(str(d))


def run_process(
    settings: Settings,
    build: FlowBuilder,
    *,
    process_id: int | None = None,
    addresses: list[str] | None = None,
) -> None:
    """Run this process's part of the flow (all of it when ``addresses`` is None)."""
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port + (process_id or 0), addr=settings.metrics_host)
    flow = build(settings)
    # SIGTERM or SIGINT drains: the source stops reading as if the input had ended, what
    # is in flight is classified and delivered, the flow ends with a last snapshot. A
    # second signal stops at once (what followed the last snapshot is read again).
    stopped = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        if DRAIN.is_set():
            stopped.set()
            signal.default_int_handler(signum, frame)
        log.warning("draining: no new records are read; a second signal stops at once")
        DRAIN.set()

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, interrupt)
    try:
        cli_main(
            flow,
            workers_per_process=1,
            process_id=process_id,
            addresses=addresses,
            epoch_interval=timedelta(seconds=settings.snapshot_interval_s),
            recovery_config=recovery_config(settings),
        )
    except (KeyboardInterrupt, BytewaxRuntimeError):
        if not stopped.is_set():
            raise
        log.warning("stopped by a signal")


def run(settings: Settings, build: FlowBuilder) -> int:
    """Check the cluster (raises :class:`~kascade.dataflow.kafka_io.KafkaUnavailable`),
    then run.

    With ``settings.addresses`` this process is process ``settings.process_id`` of a
    cluster spread over several hosts (every host runs the same command with its own
    id); otherwise ``settings.workers`` processes run here. Blocks until the flow ends:
    at the end of the input when ``kafka.tail`` is false, otherwise until interrupted.
    Returns a process exit status.
    """
    check_cluster(settings.kafka, required_topics(settings))
    settings = with_record_limit(settings)
    hosts = settings.cluster
    if hosts is not None:
        run_process(settings, build, process_id=settings.process_id, addresses=hosts)
        return 0
    if settings.workers == 1:
        run_process(settings, build)
        return 0
    return _supervise(settings, build)


class WorkerFailed(KascadeError):
    """A worker process stopped with an error; the message is the first failure's."""


# The line a worker process prints last when it fails: what the supervisor reports.
FAILURE_MARK = "kascade: worker "
# How long workers get to finish what they hold after SIGTERM/SIGINT.
DRAIN_S = 30.0


def _supervise(settings: Settings, build: FlowBuilder) -> int:
    recovery_config(settings)  # create the store once, before the workers race for it
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(settings.workers)]
    payload = pickle.dumps((settings, build))  # secrets travel by pipe, never argv or env
    procs = []
    for i in range(settings.workers):
        p = subprocess.Popen(
            [sys.executable, "-m", "kascade.dataflow.worker", str(i), ";".join(addresses)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        assert p.stdin is not None
        p.stdin.write(payload.hex())
        p.stdin.close()
        procs.append(p)
    relay = _Relay(procs)
    stopping = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        # Workers drain on SIGINT (Bytewax's interrupt); SIGTERM reaches us from systemd,
        # Kubernetes or docker stop.
        stopping.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed and not stopping.is_set():
                first = relay.first_failure()
                index = first if first is not None else procs.index(failed[0])
                _terminate(procs)
                relay.join()
                log.error(
                    "%s", relay.cause(index) or f"worker {index} exited with {failed[0].returncode}"
                )
                return 1
            if stopping.is_set():
                deadline = deadline or time.monotonic() + DRAIN_S
                if time.monotonic() > deadline:
                    _terminate(procs, grace_s=0)
                    raise WorkerFailed(f"workers did not drain within {DRAIN_S:g} s; killed")
            time.sleep(0.2)
        relay.join()
        codes = [p.returncode for p in procs]
        if any(codes):
            first = relay.first_failure()
            index = first if first is not None else next(i for i, c in enumerate(codes) if c)
            raise WorkerFailed(relay.cause(index) or f"worker {index} exited with {codes[index]}")
        return 0
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class _Relay:
    """Forwards each worker's stderr; once one worker has failed, its siblings' lines
    (their panics at losing it) are held back, so the first cause is what is read."""

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
