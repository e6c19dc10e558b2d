"""One worker process of a multi-process run: ``python -m kascade.dataflow.worker ID ADDRESSES``.

Reads the pickled ``(settings, flow builder, restarts so far)`` from stdin (so
credentials never appear in argv or the environment) and runs process ``ID`` of the
cluster ``ADDRESSES`` (``host:port;host:port;...``, the same list and order on every
process).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import traceback

from kascade import logs
from kascade.dataflow import channel
from kascade.dataflow.channel import Event, Note
from kascade.dataflow.processes import FATAL_EXIT, PEER_LOST_EXIT, Orders, notes_dir
from kascade.dataflow.runner import run_process
from kascade.errors import kascade_error_in
from kascade.operators import inflight, metrics


def _die_with(supervisor_pid: int) -> None:
    """Die when the supervisor does (``kill -9`` of the job must not leave workers that
    go on reading): Linux delivers SIGKILL to this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != supervisor_pid:  # it died before the line above
        os._exit(1)


def _lost_a_peer(e: BaseException) -> bool:
    """Bytewax's answer to a peer's connection breaking: a Rust panic of the thread that
    sends to or receives from it (a ``BaseException``, so no ``except Exception`` sees it)."""
    return type(e).__name__ == "PanicException" and "thread panic" in str(e)


def main() -> int:
    if len(sys.argv) != 3:
        print(
            "usage: python -m kascade.dataflow.worker PROCESS_ID ADDRESSES < settings",
            file=sys.stderr,
        )
        return 2
    orders: Orders = pickle.loads(bytes.fromhex(sys.stdin.read()))
    _die_with(orders.supervisor_pid)
    index = int(sys.argv[1])
    logs.configure(orders.logs, worker=index)
    settings = orders.settings
    metrics.RESTARTS.set(orders.restarts)
    channel.open_from_environment()
    if settings.recovery_dir is not None:
        inflight.track(notes_dir(settings.recovery_dir) / str(index))
    try:
        run_process(settings, orders.build, process_id=index, addresses=sys.argv[2].split(";"))
    except BaseException as e:
        _report_totals()
        if _lost_a_peer(e):
            _failed(f"worker {index}: lost its connection to a peer")
            return PEER_LOST_EXIT
        if not isinstance(e, Exception):
            raise
        cause = kascade_error_in(e)
        # The supervisor reports this, from whichever worker failed first.
        _failed(f"worker {index}: {cause or f'{type(e).__name__}: {e}'}")
        if cause is None:
            traceback.print_exc()
            return 1
        return FATAL_EXIT
    _report_totals()
    return 0


def _report_totals() -> None:
    channel.tell(Note(event=Event.TOTALS, counts=metrics.totals()))


def _failed(cause: str) -> None:
    channel.tell(Note(event=Event.FAILED, cause=cause))


if __name__ == "__main__":
    sys.exit(main())
