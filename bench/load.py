"""Produce-to-result latency under steady load: an open-loop producer at fixed rates.

One ``kascade run`` (tailing, ``--workers 2``, warmed up) serves the whole run. Its
capacity is measured first, by draining a backlog of the same document mix; then, for
each fraction of it (30/50/70/90/120 %), documents arrive as a Poisson process at that
rate for ``--seconds``, whatever the job does (open loop: a slow job does not slow the
producer, as real traffic would not). A consumer reads the results as they come:
latency = when the result was read - when its document was produced (one clock, one
host). Sampled every second: documents in flight (produced, not yet labeled), Bytewax's
consumer lag gauge and the job's memory (RSS of its processes).

Documents: 100-4,000 tokens (log-uniform), one topic and language each, from the
held-out SIB-200 sentences of 8 languages.

    python -m bench.load --model runs/e5-eps01 --data runs/sib200 --json runs/load/load.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import psutil
from confluent_kafka import Consumer, Producer

from bench.env import environment
from bench.flow import fresh_topics, kascade_run_command
from bench.long_docs import _rows
from bench.sib200 import language_tag
from kascade.dataflow.ports import free_port
from kascade.demo.local_broker import ensure_local_broker
from kascade.operators.encoder import load_model_dir
from kascade.schemas import InputDocument
from kascade.schemas.files import write_text_atomically
from kascade.schemas.kafka import KafkaSettings

LANGUAGES = (
    "eng_Latn", "deu_Latn", "fra_Latn", "spa_Latn", "rus_Cyrl", "zho_Hans", "arb_Arab", "hin_Deva",
)  # fmt: skip
RATES = (0.3, 0.5, 0.7, 0.9, 1.2)
SHORT = 1000  # the latency target is for documents up to this many tokens


def document_mix(
    data: Path, count: int, model: Path, seed: int, longest: int = 4000
) -> list[InputDocument]:
    """``count`` documents of 100-``longest`` tokens (log-uniform), one language and topic
    each."""
    tokenizer = load_model_dir(model).tokenizer
    pools = {k: v for k, v in _rows(data, ("holdout",)).items() if k[0] in LANGUAGES}
    if not pools:
        raise SystemExit(f"no held-out sentences of {LANGUAGES} under {data} (bench.sib200)")
    keys = sorted(pools)
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        lang, topic = keys[rng.randrange(len(keys))]
        target = int(math.exp(rng.uniform(math.log(100), math.log(longest))))
        text, n = [], 0
        while n < target:
            s = rng.choice(pools[(lang, topic)])
            text.append(s)
            n += len(tokenizer.encode(s, add_special_tokens=False).ids)
        meta = {"topic": topic, "tokens": n}
        docs.append(
            InputDocument(id=f"d{i}", text=" ".join(text), lang=language_tag(lang), metadata=meta)
        )
    return docs


class Results:
    """Reads the output topic continuously; when each document's result arrived."""

    def __init__(self, k: KafkaSettings) -> None:
        self.arrived: dict[str, float] = {}
        self.in_job_ms: dict[str, float] = {}  # the record's own latency_ms: until emitted
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": k.brokers,
                "group.id": f"bench-load-{uuid.uuid4()}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",  # as a consumer of exactly_once must
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.subscribe([k.output_topic])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            # consume() waits its whole timeout unless the batch fills: a short one, so
            # the time a result is read is within a few ms of its arrival.
            for m in self._consumer.consume(500, 0.002):
                if m.error() is None and m.key() is not None:
                    key = m.key().decode()
                    self.arrived.setdefault(key, time.time())
                    self.in_job_ms.setdefault(key, json.loads(m.value())["latency_ms"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def _lag(ports: list[int]) -> float:
    """Bytewax's consumer lag gauge, summed over the workers' metrics endpoints."""
    total = 0.0
    for port in ports:
        with contextlib.suppress(OSError):
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            for line in text.decode().splitlines():
                if line.startswith("bytewax_kafka_consumer_lag{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def _rss_mb(job: psutil.Process) -> float:
    total = 0.0
    for p in [job, *job.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / 1e6


def produce_at(
    k: KafkaSettings,
    docs: list[InputDocument],
    rate: float,
    seconds: float,
    seed: int,
    sent: dict[str, float],
) -> None:
    """Send documents as a Poisson process of ``rate`` per second for ``seconds``, noting
    in ``sent`` when each was produced, by id."""
    p = Producer({"bootstrap.servers": k.brokers, "linger.ms": 0})
    rng = np.random.default_rng(seed)
    start = time.time()
    due = start
    for d in docs:
        due += rng.exponential(1 / rate)
        if due - start > seconds:
            break
        time.sleep(max(0.0, due - time.time()))
        sent[d.id] = time.time()
        p.produce(k.input_topic, key=d.id.encode(), value=d.model_dump_json().encode())
        p.poll(0)
    p.flush(30)


def one_rate(
    k: KafkaSettings,
    job: psutil.Process,
    results: Results,
    ports: list[int],
    docs: list[InputDocument],
    rate: float,
    seconds: float,
    seed: int,
) -> dict:
    samples: list[dict] = []
    sent: dict[str, float] = {}
    done = threading.Event()

    def sample() -> None:
        t0 = time.time()
        while not done.is_set():
            labeled = sum(1 for i in list(sent) if i in results.arrived)
            samples.append(
                {
                    "t_s": round(time.time() - t0, 1),
                    "in_flight": len(sent) - labeled,
                    "consumer_lag": _lag(ports),
                    "rss_mb": round(_rss_mb(job), 1),
                }
            )
            done.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    produce_at(k, docs, rate, seconds, seed, sent)
    deadline = time.time() + max(120.0, seconds * 2)
    while any(i not in results.arrived for i in sent) and time.time() < deadline:
        time.sleep(0.2)
    done.set()
    sampler.join()
    tokens = {d.id: d.metadata["tokens"] for d in docs}
    lat = {i: results.arrived[i] - t for i, t in sent.items() if i in results.arrived}

    def pct(ids: list[str]) -> dict[str, float]:
        ms = np.asarray([lat[i] * 1000 for i in ids])
        if ms.size == 0:
            return {}
        return {f"p{q}_ms": round(float(np.percentile(ms, q)), 1) for q in (50, 95, 99)} | {
            "max_ms": round(float(ms.max()), 1),
            "n": int(ms.size),
        }

    short = [i for i in lat if tokens[i] <= SHORT]
    in_job = np.asarray([results.in_job_ms[i] for i in short if i in results.in_job_ms])
    return {
        "short_in_job": {
            f"p{q}_ms": round(float(np.percentile(in_job, q)), 1) for q in (50, 95, 99)
        }
        if in_job.size
        else {},
        "rate_docs_s": round(rate, 3),
        "sent": len(sent),
        "labeled": len(lat),
        "lost": len(sent) - len(lat),
        "all": pct(list(lat)),
        "short": pct(short),
        "long": pct([i for i in lat if tokens[i] > SHORT]),
        "max_in_flight": max((s["in_flight"] for s in samples), default=0),
        "max_consumer_lag": max((s["consumer_lag"] for s in samples), default=0),
        "rss_mb_first": samples[0]["rss_mb"] if samples else None,
        "rss_mb_last": samples[-1]["rss_mb"] if samples else None,
        "samples": samples,
    }


def capacity(k: KafkaSettings, results: Results, docs: list[InputDocument]) -> float:
    """Documents per second the warm job labels while draining a backlog of ``docs``."""
    p = Producer({"bootstrap.servers": k.brokers, "linger.ms": 20})
    t0 = time.time()
    for d in docs:
        p.produce(k.input_topic, key=d.id.encode(), value=d.model_dump_json().encode())
        p.poll(0)
    p.flush(60)
    while any(d.id not in results.arrived for d in docs):
        time.sleep(0.2)
    return len(docs) / (max(results.arrived[d.id] for d in docs) - t0)


def run(args: argparse.Namespace) -> dict:
    brokers = args.brokers or ensure_local_broker(args.broker_port).bootstrap
    k = fresh_topics(brokers)
    pool = document_mix(args.data, args.documents, args.model, args.seed, args.longest)
    port = free_port()
    cmd = [a for a in kascade_run_command(k, args.model, *args.extra) if a != "--bounded"]
    cmd += ["--workers", str(args.workers), "--threads", str(args.threads)]
    cmd += ["--metrics-port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    job = psutil.Process(proc.pid)
    ports = [port + i for i in range(args.workers)]
    results = Results(k)
    batches = iter(range(1_000_000))

    def fresh(n: int) -> list[InputDocument]:
        b = next(batches)
        picked = [pool[(b * 7919 + i) % len(pool)] for i in range(n)]
        return [d.model_copy(update={"id": f"b{b}-{i}"}) for i, d in enumerate(picked)]

    try:
        capacity(k, results, fresh(16))  # warm-up: models loaded in every worker
        measured = capacity(k, results, fresh(args.backlog))
        print(f"capacity {measured:.2f} docs/s (backlog of {args.backlog})", flush=True)
        cap = args.capacity or measured  # rates as fractions of one figure across variants
        rows = []
        for fraction in args.rates:
            rate = fraction * cap
            n = int(rate * args.seconds * 1.5) + 10
            row = one_rate(k, job, results, ports, fresh(n), rate, args.seconds, args.seed)
            row["load"] = fraction
            rows.append(row)
            print(
                f"{fraction:.0%} ({rate:.2f} docs/s): short p50/p95/p99"
                f" {row['short'].get('p50_ms')}/{row['short'].get('p95_ms')}/"
                f"{row['short'].get('p99_ms')} ms (in the job"
                f" {row['short_in_job'].get('p50_ms')}/{row['short_in_job'].get('p95_ms')}/"
                f"{row['short_in_job'].get('p99_ms')}), all p99 {row['all'].get('p99_ms')} ms,"
                f" max in flight {row['max_in_flight']}, lost {row['lost']},"
                f" rss {row['rss_mb_first']} -> {row['rss_mb_last']} MB",
                flush=True,
            )
    finally:
        results.close()
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    if err.strip():
        print(err[-2000:])
    return {
        "model": str(args.model),
        "workers": args.workers,
        "threads": args.threads,
        "extra": args.extra,
        "capacity_docs_s": round(measured, 3),
        "rates_of_docs_s": round(cap, 3),
        "seconds_per_rate": args.seconds,
        "rows": rows,
        "environment": environment(),
    }


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    loads = [r["load"] * 100 for r in rows]
    for q, style in (("p50_ms", "o-"), ("p95_ms", "s-"), ("p99_ms", "^-")):
        a.plot(loads, [r["short"].get(q) for r in rows], style, label=f"{q[:3]}, <= {SHORT} tokens")
    a.set_yscale("log")
    a.set_xlabel("load (% of measured capacity)")
    a.set_ylabel("produce-to-result latency (ms)")
    a.legend()
    a.grid(alpha=0.3)
    for r in rows:
        s = r["samples"]
        b.plot([x["t_s"] for x in s], [x["rss_mb"] for x in s], label=f"{r['load']:.0%}")
    b.set_xlabel("seconds into the rate")
    b.set_ylabel("job RSS (MB, all processes)")
    b.legend()
    b.grid(alpha=0.3)
    fig.suptitle(
        f"kascade run --workers {result['workers']}: capacity"
        f" {result['capacity_docs_s']:.1f} docs/s"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("runs/sib200"))
    ap.add_argument("--brokers")
    ap.add_argument("--broker-port", type=int, default=9092)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per worker")
    ap.add_argument(
        "--rates", type=float, nargs="*", default=list(RATES), help="none: capacity only"
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument(
        "--capacity",
        type=float,
        help="documents/s the rates are fractions of (default: the capacity measured now);"
        " give one figure to compare variants at the same send rates",
    )
    ap.add_argument("--backlog", type=int, default=200)
    ap.add_argument("--documents", type=int, default=400, help="distinct documents in the mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--longest", type=int, default=4000, help="tokens of the longest documents")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("extra", nargs="*", help="more kascade run flags (after --)")
    args = ap.parse_args()
    result = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.json, json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
