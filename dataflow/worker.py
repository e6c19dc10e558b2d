"""One worker process of a multi-process run: ``python -m kascade.dataflow.worker ID ADDRESSES``.

Reads the pickled ``(settings, flow builder)`` from stdin (so credentials never appear
in argv or the environment) and runs process ``ID`` of the cluster ``ADDRESSES``
(``host:port;host:port;...``, the same list and order on every process).
"""

from __future__ import annotations

import logging
import pickle
import sys

from kascade.dataflow.runner import run_process


def main() -> int:
    if len(sys.argv) != 3:
        print(
            "usage: python -m kascade.dataflow.worker PROCESS_ID ADDRESSES < settings",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kascade.rdkafka").setLevel(logging.ERROR)
    settings, build = pickle.loads(sys.stdin.buffer.read())
    run_process(settings, build, process_id=int(sys.argv[1]), addresses=sys.argv[2].split(";"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
