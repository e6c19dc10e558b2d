"""``kascade`` whose worker processes kill themselves (SIGKILL: no ``except``, no
``finally`` runs) at a named point of exactly-once delivery. Run as ``python
tests/dying_flow.py run ...`` with ``tests`` on PYTHONPATH (the worker processes unpickle
:func:`build` from this module by name), and in the environment:

- ``KASCADE_TEST_DIE_AT``: ``point:hit,hit;point:hit``, e.g. ``before_commit:5,40``: the
  5th and 40th time any worker of the job reaches ``before_commit``, it dies there.
- ``KASCADE_TEST_DIE_COUNTS``: a directory where hits are counted, across the worker
  processes and their restarts, so each planned death happens once.

The points (:data:`POINTS`) are where a process can die between what Kafka holds and
what Bytewax's snapshot says.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from pathlib import Path

from kascade.dataflow import exactly_once, flow, transactions

_REAL_BUILD = flow.build_flow  # before __main__ replaces it


def hit(point: str) -> None:
    """Count one hit of ``point``; die if it is a planned one."""
    entries = os.environ.get("KASCADE_TEST_DIE_AT", "").split(";")
    plan = dict(entry.split(":", 1) for entry in entries if entry)
    if point not in plan:
        return
    counts = Path(os.environ["KASCADE_TEST_DIE_COUNTS"])
    with open(counts / point, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(b".")
        f.flush()
        n = os.fstat(f.fileno()).st_size
        if n in {int(h) for h in plan[point].split(",")}:
            (counts / f"{point}.died").open("a").write(f"{n}\n")
            os.kill(os.getpid(), signal.SIGKILL)


def _wrap(owner: object, name: str, point: str, *, after: bool = False) -> None:
    real = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if not after:
            hit(point)
        result = real(*args, **kwargs)
        if after:
            hit(point)
        return result

    setattr(owner, name, wrapped)


POINTS = {
    # Results produced into a transaction that is not committed yet.
    "before_commit": lambda: _wrap(transactions.Committer, "_commit", "before_commit"),
    # The epoch's results committed; the snapshot that says so not taken yet.
    "after_commit": lambda: _wrap(exactly_once._Part, "snapshot", "after_commit", after=True),
    # A resumed partition read what it committed since its snapshot, and wrote nothing yet.
    "during_resume": lambda: _wrap(exactly_once, "committed_since", "during_resume", after=True),
    # Draining (SIGTERM): the last results handed over, their commit not made yet.
    "during_drain": lambda: _wrap(exactly_once._Part, "close", "during_drain"),
}


def build(settings, prepared=None):
    for install in POINTS.values():
        install()
    return _REAL_BUILD(settings, prepared)


if __name__ == "__main__":
    from dying_flow import build as importable_build  # by module name, not __main__

    from kascade.cli import main

    flow.build_flow = importable_build
    sys.exit(main())
