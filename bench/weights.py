"""Weights stored once vs once per graph: directory size and worker memory.

A model directory keeps every tensor once in ``weights.bin``, shared by the full graph
and the cascade's three stage graphs. This benchmark compares it with the layout it
replaced, where each graph carried its own copy (made here from the same directory by
inlining the tensors into each graph), on disk and in a worker's resident memory with
the full graph (no cascade) and with the stage graphs (cascade).

    python -m bench.weights runs/mmbert-small-int8-int4emb --json runs/weights.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import onnx

from kascade.operators.encoder import load_model_dir
from kascade.schemas.files import write_text_atomically
from kascade.schemas.manifest import FULL_GRAPH, STAGE_GRAPHS, WEIGHTS
from kascade.toolchain.graphs import finish
from kascade.toolchain.measure import peak_rss_mb


def inline_copy(src: Path, dst: Path) -> Path:
    """``src`` with each graph carrying its own copy of its tensors (the old layout)."""
    shutil.copytree(src, dst)
    for graph in (FULL_GRAPH, *STAGE_GRAPHS):
        onnx.save(onnx.load(str(src / graph)), str(dst / graph))
    (dst / WEIGHTS).unlink()
    manifest = load_model_dir(src).manifest
    finish(dst, manifest)
    return dst


def dir_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file()) / 1e6


def measure(d: Path, repeats: int) -> dict:
    row: dict = {"directory_mb": round(dir_mb(d), 1)}
    for graphs in ("full", "stages"):
        runs = [peak_rss_mb(d, graphs=graphs) for _ in range(repeats)]
        row[f"rss_mb_{graphs}"] = round(statistics.median(runs), 1)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="model directory (shared weights)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kascade-inline-") as work:
        old = inline_copy(args.model, Path(work) / "inline")
        result = {
            "model": str(args.model),
            "per_graph_copies": measure(old, args.repeats),
            "stored_once": measure(args.model, args.repeats),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
