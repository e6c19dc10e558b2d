"""Throughput of the streaming job through a real broker, and what Kafka + Bytewax cost.

``overhead``: the same chunks classified (a) by calling the encoder in a plain loop and
(b) by the whole flow (Kafka in, validate, chunk, full model, reduce, Kafka out) in one
process; reports CPU seconds of each and the flow's share spent outside the model.

``scaling``: ``kascade run --workers N`` for each N on the same documents; throughput
is measured between the first and last output record's Kafka timestamps, so process
start-up and model loading are excluded.

    python -m bench.flow overhead --model runs/minilm-int8pc --data runs/sib200/holdout.tsv
    python -m bench.flow scaling --model runs/minilm-int8pc --data runs/sib200/holdout.tsv \
        --workers 1 2
    python -m bench.flow scaling --model runs/e5-cascade --data runs/sib200/holdout*.tsv \
        --workers 2 --cascade off on
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from kascade.dataflow.consume import read_all
from kascade.demo.local_broker import ensure_local_broker
from kascade.demo.local_broker import fresh_topics as kafka_fresh_topics
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas import InputDocument
from kascade.schemas.files import write_text_atomically
from kascade.schemas.kafka import KafkaSettings
from kascade.toolchain.data import read_examples


def long_documents(paths: list[Path], sentences_per_doc: int, copies: int) -> list[InputDocument]:
    """Single-topic documents of ``sentences_per_doc`` sentences of one file each (grouped
    by its ``category`` column), the whole set repeated ``copies`` times with fresh ids."""
    docs = []
    for path in paths:
        labeled = read_examples(path, text_column="text", label_column="category")
        by_topic: dict[str, list[str]] = {}
        for text, topic in zip(labeled.texts, labeled.labels or [], strict=True):
            by_topic.setdefault(topic, []).append(text)
        for c in range(copies):
            for topic, texts in sorted(by_topic.items()):
                for i in range(0, len(texts) - sentences_per_doc + 1, sentences_per_doc):
                    text = " ".join(texts[i : i + sentences_per_doc])
                    docs.append(InputDocument(id=f"{path.stem}-c{c}-{topic}-{i}", text=text))
    return docs


def fresh_topics(brokers: str) -> KafkaSettings:
    return kafka_fresh_topics(brokers, "bench", partitions=4)


def send(k: KafkaSettings, docs: list[InputDocument]) -> None:
    p = Producer({"bootstrap.servers": k.brokers, "linger.ms": 20})
    for d in docs:
        p.produce(k.input_topic, key=d.id.encode(), value=d.model_dump_json().encode())
        p.poll(0)
    assert p.flush(60) == 0


def timestamps(k: KafkaSettings, topic: str) -> dict[bytes | None, int]:
    """Kafka timestamp (ms) of every record on ``topic``, by key (the last one per key)."""
    c = Consumer(
        {
            "bootstrap.servers": k.brokers,
            "group.id": f"bench-{uuid.uuid4()}",
            "enable.partition.eof": "true",
            "auto.offset.reset": "earliest",
        }
    )
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    stamps: dict[bytes | None, int] = {}
    eof: set[int] = set()
    while len(eof) < len(parts):
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            eof.add(m.partition())
            continue
        stamps[m.key()] = m.timestamp()[1]
    c.close()
    return stamps


def output_span_s(k: KafkaSettings) -> tuple[int, float]:
    """Number of output records and seconds between the first and the last one."""
    stamps = list(timestamps(k, k.output_topic).values())
    return len(stamps), (max(stamps) - min(stamps)) / 1000


def output_labels(k: KafkaSettings) -> dict[str, str]:
    """The label of every document on the output topic, by document id."""
    records = (json.loads(v) for _, v in read_all(k, k.output_topic))
    return {r["id"]: r["label"] for r in records}


def latency_percentiles(k: KafkaSettings) -> dict[str, float]:
    """p50 / p99 seconds from a document's input record to its result, by Kafka timestamps."""
    sent, done = timestamps(k, k.input_topic), timestamps(k, k.output_topic)
    lat = np.asarray([(done[key] - sent[key]) / 1000 for key in done if key in sent])
    return {"p50_s": float(np.percentile(lat, 50)), "p99_s": float(np.percentile(lat, 99))}


def kascade_run_command(k: KafkaSettings, model: Path, *extra: str) -> list[str]:
    """``kascade run --bounded`` on the topics of ``k`` with ``model``."""
    return [
        sys.executable, "-m", "kascade", "run", "--bounded",
        "--brokers", k.brokers,
        "--input-topic", k.input_topic,
        "--output-topic", k.output_topic,
        "--dead-letter-topic", k.dead_letter_topic,
        "--model-dir", str(model),
        *extra,
    ]  # fmt: skip


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def overhead(model: Path, docs: list[InputDocument], brokers: str, chunk_tokens: int) -> dict:
    from bytewax.testing import run_main

    from kascade.dataflow.flow import build_flow
    from kascade.schemas.settings import Settings

    loaded = load_model_dir(model)
    chunks = [
        c.ids
        for d in docs
        for c in chunk_text(
            d.text,
            loaded.tokenizer,
            max_tokens=chunk_tokens,
            overlap=min(32, chunk_tokens // 4),
            max_chunks=10_000,
        )
    ]
    encoder = Encoder(loaded)
    encoder.logits(chunks[0])
    t0, c0 = time.perf_counter(), cpu_s()
    for ids in chunks:
        encoder.logits(ids)
    direct = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s() - c0}

    k = fresh_topics(brokers)
    send(k, docs)
    chunking = {"max_tokens": chunk_tokens, "overlap": min(32, chunk_tokens // 4)}
    settings = Settings(kafka=k, model_dir=model, chunking=chunking)
    flow = build_flow(settings)
    t0, c0 = time.perf_counter(), cpu_s()
    run_main(flow)
    flow_run = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s() - c0}
    n_out = len(read_all(k, k.output_topic))
    assert n_out == len(docs), f"{n_out} outputs for {len(docs)} documents"
    return {
        "documents": len(docs),
        "chunks": len(chunks),
        "direct": direct,
        "flow": flow_run,
        "overhead_cpu_share": 1 - direct["cpu_s"] / flow_run["cpu_s"],
        "direct_chunks_per_s": len(chunks) / direct["wall_s"],
        "flow_chunks_per_s": len(chunks) / flow_run["wall_s"],
    }


def scaling(
    model: Path,
    docs: list[InputDocument],
    brokers: str,
    workers: list[int],
    chunk_tokens: int,
    cascade_modes: tuple[str, ...] = ("off",),
) -> list[dict]:
    rows = []
    labels: dict[tuple[int, str], dict[str, str]] = {}
    loaded = load_model_dir(model)
    n_chunks = sum(
        len(
            chunk_text(
                d.text, loaded.tokenizer, max_tokens=chunk_tokens, overlap=32, max_chunks=10_000
            )
        )
        for d in docs
    )
    for n, mode in [(n, m) for m in cascade_modes for n in workers]:
        k = fresh_topics(brokers)
        send(k, docs)
        cmd = kascade_run_command(
            k, model, "--workers", str(n), "--chunk-tokens", str(chunk_tokens), "--cascade", mode
        )
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        count, span = output_span_s(k)
        assert count == len(docs)
        labels[(n, mode)] = output_labels(k)
        rows.append(
            {
                "workers": n,
                "cascade": mode,
                "documents": count,
                "chunks": n_chunks,
                "wall_s": wall,
                "span_s": span,
                "chunks_per_s": n_chunks / span,
                "docs_per_s": count / span,
            }
        )
    for r in rows:
        r["speedup"] = r["chunks_per_s"] / rows[0]["chunks_per_s"]
        reference = labels.get((r["workers"], "off"))
        if r["cascade"] != "off" and reference is not None:
            mine = labels[(r["workers"], r["cascade"])]
            r["document_agreement_with_off"] = sum(
                mine[key] == label for key, label in reference.items()
            ) / len(reference)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["overhead", "scaling"])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument(
        "--data",
        type=Path,
        nargs="+",
        required=True,
        help="sentences (.tsv with text and category columns); documents from each file",
    )
    p.add_argument("--sentences-per-doc", type=int, default=8)
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cascade", nargs="+", default=["off"], choices=["off", "on"])
    p.add_argument("--brokers", help="default: the local broker on port 9092")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    brokers = args.brokers or ensure_local_broker(9092).bootstrap
    docs = long_documents(args.data, args.sentences_per_doc, args.copies)
    if args.what == "overhead":
        result: object = overhead(args.model, docs, brokers, args.chunk_tokens)
    else:
        result = scaling(
            args.model, docs, brokers, args.workers, args.chunk_tokens, tuple(args.cascade)
        )
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
