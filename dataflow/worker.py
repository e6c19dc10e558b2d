"""One worker process of a multi-process run: ``python -m kascade.dataflow.worker ID ADDRESSES``.

Reads the pickled ``(settings, flow builder)`` from stdin (so credentials never appear
in argv or the environment) and runs process ``ID`` of the cluster ``ADDRESSES``
(``host:port;host:port;...``, the same list and order on every process).
"""

from __future__ import annotations

import logging
import pickle
import sys
import traceback

from kascade.dataflow.runner import FAILURE_MARK, run_process

from kascade.errors import kascade_error_in


def main() -> int:
    if len(sys.argv) != 3:
        print(
            "usage: python -m kascade.dataflow.worker PROCESS_ID ADDRESSES < settings",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kascade.rdkafka").setLevel(logging.ERROR)
    settings, build = pickle.loads(bytes.fromhex(sys.stdin.read()))
    index = int(sys.argv[1])
    try:
        run_process(settings, build, process_id=index, addresses=sys.argv[2].split(";"))
    except Exception as e:
        cause = kascade_error_in(e)
        # The supervisor reports this line, from whichever worker failed first.
        print(f"{FAILURE_MARK}{index}: {cause or f'{type(e).__name__}: {e}'}", file=sys.stderr)
        if cause is None:
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
