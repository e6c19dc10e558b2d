"""PNG plots of the benchmark results (``runs/*.json``) for docs/BENCHMARKS.md.

python -m bench.plots --runs runs --out docs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def quantization(latency: dict, out: Path) -> Path:
    rows = latency["rows"]
    lengths = sorted(int(k.split("_")[1]) for k in rows[0] if k.startswith("ms_"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.plot(
            lengths,
            [r[f"ms_{n}"] for n in lengths],
            marker="o",
            label=f"{r['variant']} ({r['file_mb']:.0f} MB)",
        )
    ax.set_xlabel("tokens per chunk")
    ax.set_ylabel("ms per chunk, 1 thread")
    ax.set_xscale("log", base=2)
    ax.set_title("mmBERT-small architecture: quantization")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, out / "quantization.png")


def chunk_size(rows: list[dict], out: Path) -> Path:
    fig, ax1 = plt.subplots(figsize=(6, 4))
    n = [r["tokens"] for r in rows]
    ax1.plot(n, [r["ms_per_1k_tokens"] for r in rows], marker="o", color="tab:blue")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("tokens per pass")
    ax1.set_ylabel("ms per 1k tokens", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(n, [r["peak_rss_mb"] for r in rows], marker="s", color="tab:red")
    ax2.set_ylabel("peak RSS MB", color="tab:red")
    ax1.set_title("mmBERT-small int8-int4emb: cost by sequence length")
    ax1.grid(alpha=0.3)
    return save(fig, out / "chunk_size.png")


def scaling(runs: dict[str, list[dict]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, rows in runs.items():
        ax.plot(
            [r["workers"] for r in rows], [r["chunks_per_s"] for r in rows], marker="o", label=name
        )
    ax.set_xlabel("worker processes (1 thread each)")
    ax.set_ylabel("chunks / s through Kafka")
    ax.set_xticks([1, 2])
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("Parallel workers")
    return save(fig, out / "workers.png")


def cascade(result: dict, out: Path) -> Path:
    share = result["test"]["share"]
    stages = ["s0", "s1", "skipped", "full"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(
        stages,
        [share.get(s, 0) for s in stages],
        color=["tab:green", "tab:olive", "tab:gray", "tab:red"],
    )
    ax.set_ylabel("share of chunks")
    ax.set_title("Cascade: where chunks were settled")
    return save(fig, out / "cascade.png")


def soak(result: dict, out: Path) -> Path:
    samples = result["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, (mem, rate) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    for name in samples[0]["rss_mb"]:
        mem.plot(t, [s["rss_mb"].get(name) for s in samples], label=name)
    mem.set_ylabel("RSS (MB)")
    mem.set_ylim(bottom=0)
    mem.legend(fontsize=8)
    mem.set_title("Soak: kascade run --workers 2 at saturation")
    minute = {}
    for s in samples:
        minute.setdefault(int(s["t_s"] // 60), s)
    ks = sorted(minute)[:-1]
    rates = [
        (minute[k + 1]["labels"] - minute[k]["labels"]) / (minute[k + 1]["t_s"] - minute[k]["t_s"])
        for k in ks
    ]
    rate.bar([k + 0.5 for k in ks], rates, width=0.8)
    rate.set_ylabel("documents/s (per minute)")
    rate.set_xlabel("minutes")
    return save(fig, out / "soak.png")


def save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically) and close it."""
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--out", type=Path, default=Path("docs"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    if (lat := _load(args.runs / "latency-mmbert-small.json")) is not None:
        made.append(quantization(lat, args.out))
    if (cs := _load(args.runs / "chunks-speed.json")) is not None:
        made.append(chunk_size(cs, args.out))
    sc = {
        k: v
        for k, v in (
            ("MiniLM int8pc", _load(args.runs / "scaling-minilm.json")),
            ("mmBERT-small int8-int4emb", _load(args.runs / "scaling-mmbert.json")),
        )
        if v
    }
    if sc:
        made.append(scaling(sc, args.out))
    if (cc := _load(args.runs / "cascade-e0.05.json")) is not None:
        made.append(cascade(cc, args.out))
    if (sk := _load(args.runs / "soak.json")) is not None:
        made.append(soak(sk, args.out))
    for m in made:
        print(m)


if __name__ == "__main__":
    main()
