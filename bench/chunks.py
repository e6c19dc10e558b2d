"""Chunk size: cost per 1k tokens and peak memory by sequence length, and the accuracy of
chunked classification against one pass over the document.

Speed and memory (``speed``): one forward pass of N random tokens, one thread, for N in
``--lengths``; peak RSS from a fresh process per length.

Accuracy (``accuracy``): long single-topic documents built from held-out sentences (all
languages of the held-out split, shuffled, seeded) of about ``--doc-tokens`` tokens;
each classified by 256-token chunks reduced with the token-weighted mean, and by one
pass over the first ``max_length`` tokens (what a model limited to 512 positions sees
of a whole document), against the gold topic.

    python -m bench.chunks speed --model runs/mmbert-small-int8-int4emb \
        --lengths 128 256 512 1024 2048 8192
    python -m bench.chunks accuracy --model runs/minilm-auto99 --data runs/sib200 \
        --doc-tokens 2000 4000 8000
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from pathlib import Path

import numpy as np

from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, load_model_dir, softmax
from kascade.operators.reduce import ChunkVerdict, aggregate
from kascade.schemas import Aggregation
from kascade.schemas.files import write_text_atomically
from kascade.toolchain.evaluate import macro_f1
from kascade.toolchain.measure import peak_rss_mb


def speed(model: Path, lengths: list[int], repeats: int) -> list[dict]:
    encoder = Encoder(load_model_dir(model))
    rng = np.random.default_rng(0)
    rows = []
    for n in lengths:
        ids = rng.integers(3, 20_000, size=n).astype(np.int64)
        times = []
        for _ in range(repeats if n <= 2048 else 1):
            t0 = time.perf_counter()
            encoder.logits(ids)
            times.append(time.perf_counter() - t0)
        ms = float(np.median(times) * 1000)
        rows.append(
            {
                "tokens": n,
                "ms_per_pass": round(ms, 1),
                "ms_per_1k_tokens": round(ms * 1000 / n, 1),
                "peak_rss_mb": round(peak_rss_mb(model, tokens=n), 0),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def long_documents(data: Path, doc_tokens: list[int], per_size: int, tokenizer, seed: int = 0):
    rows = []
    for f in sorted(data.glob("holdout*.tsv")):
        with open(f, encoding="utf-8", newline="") as fh:
            rows += list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    by_topic: dict[str, list[str]] = {}
    for r in rows:
        by_topic.setdefault(r["category"], []).append(r["text"])
    rng = random.Random(seed)
    docs = []
    for size in doc_tokens:
        for k in range(per_size):
            topic = sorted(by_topic)[k % len(by_topic)]
            pool = by_topic[topic][:]
            rng.shuffle(pool)
            text, n = [], 0
            for s in pool:
                if n >= size:
                    break
                text.append(s)
                n += len(tokenizer.encode(s, add_special_tokens=False).ids)
            docs.append((size, " ".join(text), topic))
    return docs


def accuracy(model: Path, data: Path, doc_tokens: list[int], per_size: int) -> list[dict]:
    loaded = load_model_dir(model)
    labels = loaded.manifest.labels
    encoder = Encoder(loaded)
    out = []
    for size in doc_tokens:
        docs = [d for d in long_documents(data, [size], per_size, loaded.tokenizer)]
        gold, chunked, truncated, ms_c, ms_t = [], [], [], [], []
        for _, text, topic in docs:
            t0 = time.perf_counter()
            chunks = chunk_text(
                text, loaded.tokenizer, max_tokens=256, overlap=32, max_chunks=10_000
            )
            verdicts = [
                ChunkVerdict(c.index, c.n_tokens, softmax(encoder.logits(c.ids).astype(np.float64)))
                for c in chunks
            ]
            chunked.append(aggregate(verdicts, Aggregation.TOKEN_MEAN, labels).label)
            ms_c.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            truncated.append(labels[int(encoder.logits(loaded.encode(text)).argmax())])
            ms_t.append(time.perf_counter() - t0)
            gold.append(topic)
        row = {
            "doc_tokens": size,
            "documents": len(docs),
            "accuracy_chunked_256": float(
                np.mean([a == b for a, b in zip(chunked, gold, strict=False)])
            ),
            "accuracy_first_512": float(
                np.mean([a == b for a, b in zip(truncated, gold, strict=False)])
            ),
            "macro_f1_chunked_256": macro_f1(gold, chunked, labels),
            "macro_f1_first_512": macro_f1(gold, truncated, labels),
            "ms_per_doc_chunked": float(np.median(ms_c) * 1000),
            "ms_per_doc_first_512": float(np.median(ms_t) * 1000),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["speed", "accuracy"])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    p.add_argument("--doc-tokens", type=int, nargs="+", default=[2000, 4000, 8000])
    p.add_argument("--per-size", type=int, default=42)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.what == "speed":
        result = speed(args.model, args.lengths, args.repeats)
    else:
        if args.data is None:
            p.error("accuracy needs --data")
        result = accuracy(args.model, args.data, args.doc_tokens, args.per_size)
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
