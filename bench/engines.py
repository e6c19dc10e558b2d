"""Engines side by side: chunks per second and label agreement with FP32, per host.

For each model directory and each engine this host runs (ONNX Runtime; OpenVINO in FP32
and bf16), and for the PyTorch checkpoint in FP32 and with bf16 autocast (what a user
adds in one line): 256-token chunks per second at 1 thread one chunk per call, 2
threads one per call, and 2 threads in padded batches of 32; and argmax agreement with
the FP32 export under ONNX Runtime on held-out sentences. Every variant runs in this one
process, one after the other, so the comparison shares the machine's state.

    python -m bench.engines --model runs/e5-fp32 runs/e5-int8pc-int4emb \\
        --checkpoint runs/e5-sib200 --data runs/sib200 --json runs/engines.json
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.env import environment
from kascade.operators import backends
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.engine import ENGINES, Engine
from kascade.schemas.files import write_text_atomically

SETTINGS = (
    ("1 thread, batch 1", 1, 1),
    ("2 threads, batch 1", 2, 1),
    ("2 threads, batch 32", 2, 32),
)
Classify = Callable[[list[np.ndarray]], object]


def chunks(model: Path, n: int, tokens: int) -> list[np.ndarray]:
    loaded = load_model_dir(model, verify=False)
    vocab = min(loaded.tokenizer.get_vocab_size(), 50_000)
    rng = np.random.default_rng(0)
    return [rng.integers(5, vocab, size=tokens).astype(np.int64) for _ in range(n)]


def rate(classify: Classify, seqs: list[np.ndarray], batch: int) -> float:
    """Chunks per second, median of 3 passes after a warm-up call."""
    classify(seqs[:batch])
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(0, len(seqs), batch):
            classify(seqs[i : i + batch])
        passes.append(len(seqs) / (time.perf_counter() - t0))
    return float(np.median(passes))


def held_out(data: Path, per_language: int) -> list[str]:
    out = []
    for f in sorted(data.glob("holdout*.tsv")):
        with open(f, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
        out += [r["text"] for r in rows[:per_language]]
    return out


def onnx_rows(model: Path, engine: Engine, seqs: list[np.ndarray], texts: list[str], ref):
    loaded = load_model_dir(model, verify=False)
    row: dict = {"model": model.name, "variant": loaded.manifest.variant, "engine": engine.name}
    for name, threads, batch in SETTINGS:
        enc = Encoder(loaded, threads=threads, engine=engine)
        one: Classify = lambda s, enc=enc: enc.logits(s[0])  # noqa: E731
        row[name] = rate(one if batch == 1 else enc.logits_batch, seqs, batch)
    enc = Encoder(loaded, threads=2, engine=engine)
    preds = np.array([int(enc.logits(loaded.encode(t)).argmax()) for t in texts])
    return row, preds


def torch_rows(checkpoint: Path, seqs: list[np.ndarray], texts: list[str]):
    import torch
    from transformers import AutoTokenizer

    from kascade.toolchain.checkpoint import load_classifier

    model = load_classifier(str(checkpoint))  # the model the exporter traced
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    out = []
    for label, bf16 in (("PyTorch FP32", False), ("PyTorch bf16 autocast", True)):

        def classify(batch: list[np.ndarray], bf16: bool = bf16) -> object:
            ids = torch.from_numpy(np.stack(batch))
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits

        row: dict = {"model": checkpoint.name, "variant": "checkpoint", "engine": label}
        for name, threads, batch in SETTINGS:
            torch.set_num_threads(threads)
            row[name] = rate(classify, seqs, batch)
        torch.set_num_threads(2)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            preds = np.array(
                [int(model(**tokenizer(t, return_tensors="pt")).logits.argmax()) for t in texts]
            )
        out.append((row, preds))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, nargs="+", required=True, help="model directories")
    p.add_argument("--reference", type=Path, help="FP32 export (default: the first --model)")
    p.add_argument("--checkpoint", type=Path, help="the PyTorch checkpoint, for the naive rows")
    p.add_argument("--data", type=Path, required=True, help="bench.sib200 output")
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--per-language", type=int, default=50)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    reference = args.reference or args.model[0]
    seqs = chunks(reference, args.chunks, args.tokens)
    texts = held_out(args.data, args.per_language)
    ref_loaded = load_model_dir(reference, verify=False)
    ref_enc = Encoder(ref_loaded, threads=2)
    ref = np.array([int(ref_enc.logits(ref_loaded.encode(t)).argmax()) for t in texts])
    rows = []
    here = backends.engines_here()
    skipped = [e.name for e in ENGINES if e not in here]
    for model in args.model:
        for engine in here:
            row, preds = onnx_rows(model, engine, seqs, texts, ref)
            rows.append(row | {"agreement": float(np.mean(preds == ref))})
            print(json.dumps(rows[-1]), flush=True)
    if args.checkpoint is not None:
        for row, preds in torch_rows(args.checkpoint, seqs, texts):
            rows.append(row | {"agreement": float(np.mean(preds == ref))})
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "environment": environment(),
        "engines_not_run_here": skipped,
        "tokens": args.tokens,
        "agreement_texts": len(texts),
        "rows": rows,
    }
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
