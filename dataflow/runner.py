"""Runs the flow: a bounded cluster check first, then one process or N worker processes.

``workers > 1``, a recovery directory, or a job spread over several hosts (``kascade run
--addresses "h1:p;h2:p" --process-id I`` on each host, same list, its own id; see README)
runs worker processes under :mod:`~kascade.dataflow.supervisor` (each with one Bytewax
worker and its own ONNX Runtime session; restarted after a crash or a peer's loss when
there is a snapshot to resume).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType

from bytewax.dataflow import Dataflow
from bytewax.errors import BytewaxRuntimeError
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main

from kascade.dataflow import channel
from kascade.dataflow.broker import accepted_record_bytes, check_cluster
from kascade.dataflow.exactly_once import record_start
from kascade.dataflow.kafka_io import DRAIN
from kascade.dataflow.plans import NewPlan
from kascade.dataflow.supervisor import supervise
from kascade.logs import LIFECYCLE_LOGGER
from kascade.operators import metrics
from kascade.operators.registry import check_registry
from kascade.schemas.settings import Delivery, Settings

log = logging.getLogger(__name__)
# What a job runs and what it did: said even at the default level (kascade.logs).
lifecycle = logging.getLogger(LIFECYCLE_LOGGER)

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
    """Bytewax recovery in ``settings.recovery_dir``, created on first use.

    On one host the directory holds one partition per worker. In a job over several
    hosts each process's directory holds its own partition of the cluster's (process i:
    ``part-i`` of N): Bytewax resumes from the union of what the processes hold, so each
    partition must exist exactly once in the cluster (README, "Running on Kubernetes").
    """
    d = settings.recovery_dir
    if d is None:
        return None
    if not d.exists() or not any(d.glob("part-*")):
        d.mkdir(parents=True, exist_ok=True)
        hosts = settings.hosts
        if hosts is None:
            init_db_dir(d, max(settings.workers, 1))
        else:
            _init_own_partition(d, settings.process_id or 0, len(hosts))
    return RecoveryConfig(str(d))


def _init_own_partition(d: Path, index: int, count: int) -> None:
    with tempfile.TemporaryDirectory(dir=d) as scratch:
        init_db_dir(Path(scratch), count)
        os.replace(Path(scratch) / f"part-{index}.sqlite3", d / f"part-{index}.sqlite3")


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

        # Worker i of this host serves port + i; a host of a multi-host job, the port.
        offset = 0 if settings.hosts is not None else process_id or 0
        start_http_server(settings.metrics_port + offset, addr=settings.metrics_host)
    flow = build(settings)
    # SIGTERM or SIGINT drains: the source stops reading as if the input had ended, what
    # is in flight is classified and delivered, the flow ends with a last snapshot. A
    # second signal stops at once (what followed the last snapshot is read again).
    stopped = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if DRAIN.is_set():
            stopped.set()
            signal.default_int_handler(signum, frame)
        if not channel.is_worker():  # a supervisor says it once, for all its workers
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


def run(
    settings: Settings,
    build: FlowBuilder,
    *,
    describe: str | None = None,
    replan: Callable[[], NewPlan | None] | None = None,
    calibration: str | None = None,
) -> int:
    """Check the cluster and the Schema Registry (raises
    :class:`~kascade.dataflow.broker.KafkaUnavailable`,
    :class:`~kascade.operators.registry.RegistryUnavailable`), then run.

    With ``settings.addresses`` this host runs process ``settings.process_id`` of a
    cluster spread over several hosts (every host runs the same command with its own
    id); otherwise ``settings.workers`` processes run here; both under the supervisor
    unless a single process without recovery runs here. Blocks until the flow ends:
    at the end of the input when ``kafka.tail`` is false, otherwise until interrupted.
    Says what it runs (``describe``) once the checks passed, and what it did when it stops.
    ``replan`` gives a supervised run a new plan when its model directory holds a new
    calibration (``calibration``: the sha256 of the one in force). Returns a process
    exit status.
    """
    check_cluster(settings.kafka, required_topics(settings))
    check_registry(settings.registry)
    settings = with_record_limit(settings)
    if settings.delivery is Delivery.EXACTLY_ONCE and settings.recovery_dir is not None:
        record_start(settings.kafka, settings.recovery_dir)  # before the store exists
    if describe is not None:
        lifecycle.info("%s", describe)
    began = time.monotonic()
    if settings.hosts is None and settings.workers == 1 and settings.recovery_dir is None:
        run_process(settings, build)
        totals = Counter(metrics.totals())
    else:
        recovery_config(settings)  # create the store once, before the workers race for it
        totals = supervise(settings, build, replan, calibration)
    labeled, dead = totals["labeled"], totals["dead_letters"]
    lifecycle.info(
        "stopped after %.1f s: %d document%s labeled (%d degraded), %d dead letter%s",
        time.monotonic() - began,
        labeled,
        "" if labeled == 1 else "s",
        totals["degraded"],
        dead,
        "" if dead == 1 else "s",
    )
    return 0
