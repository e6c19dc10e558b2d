"""``kascade demo``: the whole job on its embedded defaults (see :mod:`kascade.demo.job`).

The demo is the one command over both halves: it builds its model with the toolchain
(once, cached) and serves it with the runtime.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from kascade.demo.job import demo, save_model

    if args.save_model is not None:
        return save_model(args.save_model)
    return demo(
        brokers=args.brokers, port=args.port, keep_broker=args.keep_broker, model_dir=args.model_dir
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kascade demo`` to the ``kascade`` parser."""
    p = sub.add_parser(
        "demo", help="local broker + sample documents through the job, printed as a table"
    )
    p.add_argument("--brokers", help="use this cluster instead of starting a local broker")
    p.add_argument("--port", type=int, default=9092, help="local broker port")
    p.add_argument("--keep-broker", action="store_true", help="leave the local broker running")
    p.add_argument("--model-dir", type=Path, help="model directory (default: build the demo model)")
    p.add_argument(
        "--save-model",
        type=Path,
        metavar="DIR",
        help="only build the demo model and put it at DIR (a container's model volume)",
    )
    p.set_defaults(func=_cmd_demo)
