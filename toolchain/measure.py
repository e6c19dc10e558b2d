"""Measuring a model directory: logits and per-chunk latency in-process, peak memory in a
fresh process (so the toolchain's own torch does not count)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kascade.operators.backends import load_graph
from kascade.operators.encoder import Encoder, Graphs, load_model_dir
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import FULL_GRAPH, STAGE_GRAPHS, WEIGHTS


@dataclass(frozen=True)
class Run:
    """Logits of every sequence and the time each single-sequence call took."""

    logits: np.ndarray
    seconds: np.ndarray

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(axis=1)

    @property
    def ms_median(self) -> float:
        return float(np.median(self.seconds) * 1000)


def tokenize(directory: Path, texts: list[str]) -> list[np.ndarray]:
    loaded = load_model_dir(directory, verify=False)
    return [loaded.encode(t) for t in texts]


def run(
    directory: Path,
    seqs: list[np.ndarray],
    *,
    threads: int = 1,
    warmup: int = 3,
    engine: Engine | None = None,
) -> Run:
    """Classify each sequence alone (no padding) with a verified model directory."""
    load_model_dir(directory)  # verifies the manifest's hashes
    path = Path(directory) / FULL_GRAPH
    return run_graph(path, seqs, threads=threads, warmup=warmup, engine=engine)


def run_graph(
    path: Path,
    seqs: list[np.ndarray],
    *,
    threads: int = 1,
    warmup: int = 3,
    engine: Engine | None = None,
) -> Run:
    """Classify each sequence alone with one full graph file, timing every call."""
    graph = load_graph(path, threads, engine or Engine())

    def call(ids: np.ndarray) -> np.ndarray:
        ids2 = ids.reshape(1, -1)
        return graph.run({"input_ids": ids2, "attention_mask": np.ones_like(ids2)}, "logits")[0]

    for s in seqs[:warmup]:
        call(s)
    logits, seconds = [], []
    for s in seqs:
        t0 = time.perf_counter()
        logits.append(call(s))
        seconds.append(time.perf_counter() - t0)
    return Run(np.stack(logits), np.asarray(seconds))


def size_mb(directory: Path) -> float:
    """What the model occupies on disk: its graphs and their one weights file."""
    d = Path(directory)
    files = [d / FULL_GRAPH, *(d / g for g in STAGE_GRAPHS), d / WEIGHTS]
    return sum(f.stat().st_size for f in files if f.is_file()) / 1e6


def peak_rss_mb(
    directory: Path,
    tokens: int = 256,
    threads: int = 1,
    graphs: Graphs = "full",
    engine: Engine | None = None,
) -> float:
    """Peak RSS of a fresh process that loads the graphs a worker loads (the full graph,
    or the cascade's stages) and classifies one chunk."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kascade.toolchain.measure",
            str(directory),
            str(tokens),
            str(threads),
            graphs,
            (engine or Engine()).name,
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"memory probe of {directory} failed: {out.stderr.strip()[-500:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"])


def _probe(directory: str, tokens: int, threads: int, graphs: Graphs, engine: str) -> None:
    loaded = load_model_dir(directory)
    encoder = Encoder(loaded, threads=threads, graphs=graphs, engine=Engine.parse(engine))
    vocab = loaded.tokenizer.get_vocab_size()
    n = min(tokens, loaded.manifest.max_length)
    ids = np.random.default_rng(0).integers(3, vocab, size=n).astype(np.int64)
    encoder.logits(ids)
    print(json.dumps({"peak_rss_mb": _peak_rss_mb()}))


def _peak_rss_mb() -> float:
    # VmHWM belongs to this process's own address space. ru_maxrss would not do: Linux
    # carries it across fork+exec, so a child of a large parent reports the parent's peak.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    _probe(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])  # type: ignore[arg-type]  # run() passes a Graphs
