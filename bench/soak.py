"""Soak: ``kascade run --workers 2`` at saturation for a long time; memory and throughput
sampled over time.

A backlog larger than the job can finish is produced first, so the job is never idle;
every ``--every`` seconds the resident memory of the supervisor and of each worker
process and the number of labels on the output topic are sampled. After the run the job
gets SIGTERM: it must drain and exit 0. The report compares the first and the last
minute after the warm-up.

    python -m bench.soak --model runs/mmbert-small-int8-int4emb \\
        --data ../shared/data/sib200 --minutes 10 --json runs/soak.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from confluent_kafka import Consumer, TopicPartition

from bench.env import environment
from bench.flow import fresh_topics, send
from kascade.demo.local_broker import ensure_local_broker
from kascade.schemas import InputDocument
from kascade.schemas.files import write_text_atomically
from kascade.schemas.kafka import KafkaSettings


def sentences(data: Path) -> list[str]:
    out = []
    for f in sorted(data.glob("*/dev.tsv")):
        with f.open(encoding="utf-8", newline="") as fh:
            out += [row["text"] for row in csv.DictReader(fh, delimiter="\t")]
    return out


def backlog(texts: list[str], n: int) -> list[InputDocument]:
    """``n`` documents of three to six sentences each, in several languages."""
    docs = []
    for i in range(n):
        k = 3 + i % 4
        start = (i * 7) % (len(texts) - k)
        docs.append(InputDocument(id=f"soak-{i}", text=" ".join(texts[start : start + k])))
    return docs


def labels_so_far(consumer: Consumer, k: KafkaSettings, parts: list[int]) -> int:
    return sum(
        consumer.get_watermark_offsets(TopicPartition(k.output_topic, p), timeout=10)[1]
        for p in parts
    )


def rss_mb(job: psutil.Process) -> dict[str, float]:
    out = {"supervisor": job.memory_info().rss / 1e6}
    for i, child in enumerate(sorted(job.children(), key=lambda c: c.pid)):
        with contextlib.suppress(psutil.NoSuchProcess):
            out[f"worker{i}"] = child.memory_info().rss / 1e6
    return out


def soak(model: Path, data: Path, brokers: str, minutes: float, every_s: float, docs: int):
    k = fresh_topics(brokers)
    send(k, backlog(sentences(data), docs))
    cmd = [
        sys.executable, "-m", "kascade", "run",
        "--brokers", k.brokers,
        "--input-topic", k.input_topic,
        "--output-topic", k.output_topic,
        "--dead-letter-topic", k.dead_letter_topic,
        "--model-dir", str(model),
        "--workers", "2",
    ]  # fmt: skip
    consumer = Consumer({"bootstrap.servers": k.brokers, "group.id": "kascade-soak"})
    parts = list(consumer.list_topics(k.output_topic, timeout=10).topics[k.output_topic].partitions)
    job = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    samples = []
    try:
        began = time.monotonic()
        proc = psutil.Process(job.pid)
        while time.monotonic() - began < minutes * 60:
            time.sleep(every_s)
            if job.poll() is not None:
                raise RuntimeError(f"the job exited with {job.returncode}: {job.stderr.read()}")
            samples.append(
                {
                    "t_s": round(time.monotonic() - began, 1),
                    "labels": labels_so_far(consumer, k, parts),
                    "rss_mb": {n: round(v, 1) for n, v in rss_mb(proc).items()},
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr)
    finally:
        stop = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
        drained_s = time.monotonic() - stop
        consumer.close()
    if samples[-1]["labels"] >= docs:
        raise RuntimeError("the backlog ran out before the end: not at saturation; raise --docs")
    return {
        "minutes": minutes,
        "backlog_docs": docs,
        "exit_status": job.returncode,
        "drain_s": round(drained_s, 2),
        "stderr_lines": len([line for line in err.splitlines() if line.strip()]),
        "samples": samples,
        "summary": summary(samples),
    }


def summary(samples: list[dict], warmup_s: float = 60.0, window_s: float = 60.0) -> dict:
    """RSS drift per process and throughput, first vs last minute after the warm-up.

    >>> s = [{"t_s": t, "labels": 10 * t, "rss_mb": {"w": 100 + t / 100}} for t in range(0, 400, 5)]
    >>> r = summary(s)
    >>> r["throughput_docs_s"]["first"], r["rss_mb"]["w"]["drift_pct"]
    (10.0, 2.7)
    """
    after = [s for s in samples if s["t_s"] >= warmup_s]
    end = after[-1]["t_s"]
    first = [s for s in after if s["t_s"] <= warmup_s + window_s]
    last = [s for s in after if s["t_s"] >= end - window_s]

    def rate(window: list[dict]) -> float:
        return (window[-1]["labels"] - window[0]["labels"]) / (window[-1]["t_s"] - window[0]["t_s"])

    rates = [
        (b["labels"] - a["labels"]) / (b["t_s"] - a["t_s"]) for a, b in itertools.pairwise(after)
    ]
    rss = {}
    for name in after[0]["rss_mb"]:
        a = statistics.median(s["rss_mb"][name] for s in first if name in s["rss_mb"])
        b = statistics.median(s["rss_mb"][name] for s in last if name in s["rss_mb"])
        rss[name] = {"first_mb": a, "last_mb": b, "drift_pct": round(100 * (b - a) / a, 1)}
    return {
        "throughput_docs_s": {
            "first": round(rate(first), 2),
            "last": round(rate(last), 2),
            "median_interval": round(statistics.median(rates), 2),
            "cv_pct_interval": round(100 * statistics.pstdev(rates) / statistics.mean(rates), 1),
        },
        "rss_mb": rss,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="SIB-200 folder (*/dev.tsv)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--docs", type=int, default=30_000, help="backlog size")
    p.add_argument("--brokers", default=None, help="default: the local broker on 9092")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    brokers = args.brokers or ensure_local_broker().bootstrap
    result = {"environment": environment(), "model": str(args.model)}
    result |= soak(args.model, args.data, brokers, args.minutes, args.every, args.docs)
    text = json.dumps(result, indent=2)
    if args.json:
        write_text_atomically(args.json, text + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
