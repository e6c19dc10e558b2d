"""Per-chunk latency, file size and peak memory of model directories at several lengths.

Each directory is timed on one thread with random token ids (speed does not depend on
the ids), several rounds, interleaved across variants so machine noise hits them alike;
the figure is the median. Peak RSS comes from a fresh process that loads the full graph
and classifies one chunk.

    python -m bench.latency runs/mmbert-small-fp32 runs/mmbert-small-int8-int4emb \\
        --lengths 128 256 512 --json runs/latency-mmbert-small.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.files import write_text_atomically
from kascade.toolchain.measure import peak_rss_mb, size_mb


def measure(
    dirs: list[Path], lengths: list[int], *, rounds: int, calls: int, threads: int
) -> list[dict]:
    encoders = {d: Encoder(load_model_dir(d), threads=threads) for d in dirs}
    rng = np.random.default_rng(0)
    vocab = min(enc.model.tokenizer.get_vocab_size() for enc in encoders.values())
    times: dict[tuple[Path, int], list[float]] = {(d, n): [] for d in dirs for n in lengths}
    for n in lengths:
        seqs = [rng.integers(3, min(vocab, 20_000), size=n).astype(np.int64) for _ in range(calls)]
        for d in dirs:
            encoders[d].logits(seqs[0])  # warm-up
        for _ in range(rounds):
            for d in dirs:  # interleaved: noise hits every variant alike
                for s in seqs:
                    t0 = time.perf_counter()
                    encoders[d].logits(s)
                    times[(d, n)].append(time.perf_counter() - t0)
    rows = []
    for d in dirs:
        manifest = encoders[d].model.manifest
        row = {
            "directory": str(d),
            "variant": manifest.variant,
            "file_mb": round(size_mb(d), 1),
            "peak_rss_mb_256": round(peak_rss_mb(d, tokens=256, threads=threads), 1),
        }
        for n in lengths:
            row[f"ms_{n}"] = round(float(np.median(times[(d, n)]) * 1000), 2)
        rows.append(row)
    base = rows[0]
    for row in rows:
        for n in lengths:
            row[f"speedup_{n}"] = round(base[f"ms_{n}"] / row[f"ms_{n}"], 2)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "dirs", nargs="+", type=Path, help="model directories; the first is the baseline"
    )
    p.add_argument("--lengths", nargs="+", type=int, default=[128, 256, 512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = measure(
        args.dirs, args.lengths, rounds=args.rounds, calls=args.calls, threads=args.threads
    )
    for row in rows:
        print(json.dumps(row))
    if args.json:
        write_text_atomically(
            args.json, json.dumps({"threads": args.threads, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
