"""Batching vs single calls vs parallel processes, same total work, one model.

``batches``: 32 chunks of 40-512 tokens, classified as single unpadded calls, as padded
batches of 4, 8 and 32 in arrival order, and as length-sorted batches of 4 and 8; one
thread. ``parallel``: 100 chunks of 256 tokens on 1 process x 1 thread, 2 processes x 1
thread, 1 process x 2 threads.

    python -m bench.batching --model runs/mmbert-small-int8-int4emb --json runs/batching.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.files import write_text_atomically


def _chunks(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(3, vocab, size=int(rng.integers(lo, hi + 1))).astype(np.int64)
        for _ in range(n)
    ]


def batches(model: Path) -> dict[str, float]:
    loaded = load_model_dir(model)
    enc = Encoder(loaded, threads=1)
    vocab = min(loaded.tokenizer.get_vocab_size(), 20_000)
    seqs = _chunks(32, 40, 512, vocab)
    enc.logits(seqs[0])
    out: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - t0

    timed("single calls", lambda: [enc.logits(s) for s in seqs])
    for b in (4, 8, 32):
        timed(
            f"padded batches of {b}",
            lambda b=b: [enc.logits_batch(seqs[i : i + b]) for i in range(0, 32, b)],
        )
    ordered = sorted(seqs, key=len)
    for b in (4, 8):
        timed(
            f"length-sorted batches of {b}",
            lambda b=b: [enc.logits_batch(ordered[i : i + b]) for i in range(0, 32, b)],
        )
    return out


def _worker(model: str, threads: int, seqs: list[np.ndarray], q) -> None:
    enc = Encoder(load_model_dir(model, verify=False), threads=threads)
    enc.logits(seqs[0])
    t0 = time.perf_counter()
    for s in seqs:
        enc.logits(s)
    q.put((len(seqs), time.perf_counter() - t0))


def parallel(model: Path, n: int = 100) -> dict[str, float]:
    loaded = load_model_dir(model)
    vocab = min(loaded.tokenizer.get_vocab_size(), 20_000)
    seqs = _chunks(n, 256, 256, vocab)
    ctx = mp.get_context("spawn")
    out = {}
    for name, procs, threads in (
        ("1 process x 1 thread", 1, 1),
        ("2 processes x 1 thread", 2, 1),
        ("1 process x 2 threads", 1, 2),
    ):
        q = ctx.Queue()
        parts = [seqs[i::procs] for i in range(procs)]
        ps = [ctx.Process(target=_worker, args=(str(model), threads, part, q)) for part in parts]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        results = [q.get() for _ in ps]
        out[name] = sum(k for k, _ in results) / max(s for _, s in results)  # chunks/s
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = {"batches_seconds": batches(args.model), "parallel_chunks_per_s": parallel(args.model)}
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
