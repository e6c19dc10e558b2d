"""Per-chunk latency, file size and peak memory of model directories at several lengths.

Each directory is timed on one thread with random token ids (speed does not depend on
the ids), several rounds, interleaved across variants so machine noise hits them alike;
the figure is the median. Peak RSS comes from a fresh process that loads the full graph
and classifies one chunk.

    python -m bench.latency runs/mmbert-small-fp32 runs/mmbert-small-int8-int4emb \\
        --lengths 128 256 512 --json runs/latency-mmbert-small.json

``--stages``: what each cascade stage costs instead (the embedding graph = S0's input,
the prefix up to the cascade layer = S1's, the suffix an escalated chunk still needs),
against the full graph, for model directories exported at different cascade layers.
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


def stages(dirs: list[Path], tokens: int, *, rounds: int, calls: int) -> list[dict]:
    """Median ms of each stage graph and of the full graph on ``tokens``-long chunks,
    one thread, interleaved across ``dirs``."""
    full = {d: Encoder(load_model_dir(d), threads=1) for d in dirs}
    staged = {d: Encoder(load_model_dir(d), graphs="stages", threads=1) for d in dirs}
    rng = np.random.default_rng(0)
    vocab = min(enc.model.tokenizer.get_vocab_size() for enc in full.values())
    seqs = [rng.integers(3, min(vocab, 20_000), size=(1, tokens)) for _ in range(calls)]
    mask = np.ones_like(seqs[0])
    times: dict[tuple[Path, str], list[float]] = {}

    def timed(d: Path, part: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        times.setdefault((d, part), []).append(time.perf_counter() - t0)
        return out

    for r in range(rounds + 1):  # round 0 warms up
        for d in dirs:
            enc = staged[d]
            for ids in seqs:
                emb = timed(d, "embed", enc.embeddings, ids, mask)
                hidden = timed(d, "prefix", enc.prefix, emb, mask)
                timed(d, "suffix", enc.suffix, hidden, mask)
                timed(d, "full", full[d].logits, ids[0])
        if r == 0:
            times.clear()
    rows = []
    for d in dirs:
        ms = {
            part: float(np.median(times[(d, part)]) * 1000)
            for part in ("embed", "prefix", "suffix", "full")
        }
        rows.append(
            {
                "directory": str(d),
                "cascade_layer": full[d].model.manifest.cascade_layer,
                "tokens": tokens,
                "ms": {k: round(v, 2) for k, v in ms.items()},
                "s1_share_of_full": round((ms["embed"] + ms["prefix"]) / ms["full"], 3),
                "escalated_share_of_full": round(
                    (ms["embed"] + ms["prefix"] + ms["suffix"]) / ms["full"], 3
                ),
            }
        )
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
    p.add_argument("--stages", action="store_true", help="cascade stage costs (one thread)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.stages:
        if len(args.lengths) != 1 or args.threads != 1:
            p.error("--stages takes one --lengths value and runs on one thread")
        rows = stages(args.dirs, args.lengths[0], rounds=args.rounds, calls=args.calls)
    else:
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
