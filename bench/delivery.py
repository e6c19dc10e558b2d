"""What exactly-once delivery costs: capacity and steady-load latency of ``kascade run``
with ``delivery=exactly_once`` against ``at_least_once``, measured side by side with
:mod:`bench.load` (same model, documents and host; variants interleaved), and the effect
of the commit interval and the snapshot (epoch) interval on latency.

    python -m bench.delivery --model ~/.cache/kascade/models/demo-... --data runs/sib200 \\
        --json runs/delivery.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil

from bench import load
from bench.env import environment
from kascade.schemas.files import write_text_atomically

# name, kascade run flags, loads measured
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    "at_least_once": (("--delivery", "at_least_once"), (0.3, 0.5, 0.7)),
    "exactly_once": (("--delivery", "exactly_once"), (0.3, 0.5, 0.7)),
    "exactly_once, commit 100 ms": (("--kafka.commit-interval-ms", "100"), (0.7,)),
    "exactly_once, commit 250 ms": (("--kafka.commit-interval-ms", "250"), (0.7,)),
    "exactly_once, commit 1000 ms": (("--kafka.commit-interval-ms", "1000"), (0.7,)),
    "exactly_once, snapshots every 1 s": (("--snapshot-interval-s", "1"), (0.7,)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("runs/sib200"))
    ap.add_argument("--brokers")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--backlog", type=int, default=300)
    ap.add_argument("--longest", type=int, default=4000, help="tokens of the longest documents")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument(
        "--variants", nargs="*", default=list(VARIANTS), help="in this order (repeats allowed)"
    )
    ap.add_argument("--loads", type=float, nargs="*", help="instead of each variant's own")
    ap.add_argument(
        "--broker-pid", type=int, help="a local broker's process: its CPU seconds per variant"
    )
    args = ap.parse_args()
    rows = []
    broker = psutil.Process(args.broker_pid) if args.broker_pid else None
    for name in args.variants:
        flags, loads = VARIANTS[name]
        loads = tuple(args.loads) if args.loads else loads
        cpu0 = sum(broker.cpu_times()[:2]) if broker else 0.0
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as recovery:
            run_args = argparse.Namespace(
                model=args.model,
                data=args.data,
                brokers=args.brokers,
                broker_port=9092,
                workers=2,
                threads=1,
                rates=list(loads),
                seconds=args.seconds,
                backlog=args.backlog,
                documents=400,
                seed=0,
                longest=args.longest,
                extra=["--recovery-dir", recovery, *flags],
            )
            print(f"== {name}", flush=True)
            result = load.run(run_args)
        for r in result["rows"]:
            r.pop("samples")
        if broker is not None:
            share = (sum(broker.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
            result["broker_cpu_cores"] = round(share, 3)
            print(f"broker: {share:.2f} cores on average", flush=True)
        rows.append({"variant": name, "flags": list(flags)} | result)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            args.json, json.dumps({"runs": rows, "environment": environment()}, indent=1)
        )


if __name__ == "__main__":
    main()
