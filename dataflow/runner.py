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
import time
from collections.abc import Callable
from datetime import timedelta

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from kascade.dataflow.kafka_io import accepted_record_bytes, check_cluster
from kascade.dataflow.local_broker import free_port
from kascade.schemas.settings import Settings

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
    cli_main(
        build(settings),
        workers_per_process=1,
        process_id=process_id,
        addresses=addresses,
        epoch_interval=timedelta(seconds=settings.snapshot_interval_s),
        recovery_config=recovery_config(settings),
    )


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


def _supervise(settings: Settings, build: FlowBuilder) -> int:
    recovery_config(settings)  # create the store once, before the workers race for it
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(settings.workers)]
    payload = pickle.dumps((settings, build))  # secrets travel by pipe, never argv or env
    procs = []
    for i in range(settings.workers):
        p = subprocess.Popen(
            [sys.executable, "-m", "kascade.dataflow.worker", str(i), ";".join(addresses)],
            stdin=subprocess.PIPE,
        )
        assert p.stdin is not None
        p.stdin.write(payload)
        p.stdin.close()
        procs.append(p)

    def stop(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = 0
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                status = failed[0].returncode
                log.error(
                    "worker process %d exited with %d; stopping the others",
                    procs.index(failed[0]),
                    status,
                )
                _terminate(procs)
                break
            time.sleep(0.2)
        return status or max((p.returncode or 0) for p in procs)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


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
