"""``kascade`` whose flow kills its own worker process on a marked record, the way a
segfault in a native library or the OOM killer would: no ``except`` runs, the process
is gone. Run as ``python tests/crashing_flow.py run ...`` with ``tests`` on PYTHONPATH
(the worker processes unpickle :func:`build` from this module by name).
"""

from __future__ import annotations

import os
import signal
import sys

from kascade.dataflow import flow
from kascade.operators import pieces

MARK = "KILL-THIS-WORKER"
_REAL_BUILD = flow.build_flow  # before __main__ replaces it


def build(settings, prepared=None):
    real = pieces.tokens_of

    def tokens_of(tokenizer, text: str):
        if MARK in text:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(tokenizer, text)

    pieces.tokens_of = tokens_of
    return _REAL_BUILD(settings, prepared)


if __name__ == "__main__":
    from crashing_flow import build as importable_build  # by module name, not __main__

    from kascade.cli import main

    flow.build_flow = importable_build
    sys.exit(main())
