"""kascade against the consumer a user would write first, on the same long documents.

The naive baseline: one consumer loop, a Hugging Face ``transformers`` text-classification
pipeline on PyTorch FP32, batches of 32, truncation at 8192 tokens, results produced back
to Kafka. kascade: ``kascade run`` with its defaults (256-token chunks, the INT8 + INT4
model, two worker processes). Both are timed from start to the last result, model loading
included, on the same documents, one after the other on the same 2 cores.

    python -m bench.baseline --fp32 runs/mmbert-small-fp32 \\
        --kascade-model runs/mmbert-small-int8-int4emb --data runs/sib200 \\
        --doc-tokens 4000 --documents 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kascade.dataflow.consume import read_all
from kascade.dataflow.local_broker import ensure_local_broker
from kascade.operators.encoder import load_model_dir
from kascade.schemas import InputDocument
from kascade.schemas.files import write_text_atomically
from kascade.schemas.settings import KafkaSettings

from bench.chunks import long_documents
from bench.flow import fresh_topics, kascade_run_command, latency_percentiles, send


def naive_consumer(k: KafkaSettings, checkpoint: Path, expect: int, batch: int = 32) -> float:
    """What a first version looks like; returns seconds from start to the last result."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    t0 = time.perf_counter()
    torch.set_num_threads(2)
    clf = pipeline(
        "text-classification",
        model=AutoModelForSequenceClassification.from_pretrained(checkpoint),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint),
        device=-1,
    )
    consumer = Consumer(
        {
            "bootstrap.servers": k.brokers,
            "group.id": "naive",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": "true",
        }
    )
    parts = consumer.list_topics(k.input_topic, timeout=10).topics[k.input_topic].partitions
    consumer.assign([TopicPartition(k.input_topic, p, 0) for p in parts])
    producer = Producer({"bootstrap.servers": k.brokers})
    done, eof, pending = 0, set(), []
    while done < expect:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition())
        elif msg is not None:
            pending.append(json.loads(msg.value()))
        if len(pending) >= batch or (pending and len(eof) == len(parts)):
            with torch.no_grad():
                out = clf(
                    [d["text"] for d in pending], batch_size=batch, truncation=True, max_length=8192
                )
            for d, o in zip(pending, out, strict=True):
                producer.produce(
                    k.output_topic,
                    key=d["id"].encode(),
                    value=json.dumps({"id": d["id"], **o}).encode(),
                )
            producer.flush()
            done += len(pending)
            pending = []
    consumer.close()
    return time.perf_counter() - t0


def kascade_job(k: KafkaSettings, model: Path, workers: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(kascade_run_command(k, model, "--workers", str(workers)), check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--fp32",
        type=Path,
        required=True,
        help="FP32 model directory (its source checkpoint is rebuilt)",
    )
    p.add_argument("--kascade-model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--doc-tokens", type=int, default=4000)
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--brokers")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    brokers = args.brokers or ensure_local_broker(9092).bootstrap
    loaded = load_model_dir(args.kascade_model)
    docs = [
        InputDocument(id=f"long-{i}", text=text)
        for i, (_, text, _) in enumerate(
            long_documents(args.data, [args.doc_tokens], args.documents, loaded.tokenizer)
        )
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint"
        from kascade.toolchain.architectures import random_classifier
        from kascade.toolchain.export import default_tokenizer_dir
        from transformers import AutoTokenizer

        manifest = load_model_dir(args.fp32).manifest
        name = manifest.source.split(":")[1] if manifest.source.startswith("random-init:") else None
        if name is None:
            raise SystemExit("the baseline rebuilds random-init checkpoints only")
        random_classifier(name, manifest.labels, seed=0).save_pretrained(ckpt)
        AutoTokenizer.from_pretrained(default_tokenizer_dir()).save_pretrained(ckpt)
        k1 = fresh_topics(brokers)
        send(k1, docs)
        naive_s = naive_consumer(k1, ckpt, len(docs))
        naive_latency = latency_percentiles(k1)
    k2 = fresh_topics(brokers)
    send(k2, docs)
    kascade_s = kascade_job(k2, args.kascade_model, args.workers)
    assert len(read_all(k2, k2.output_topic)) == len(docs)
    kascade_latency = latency_percentiles(k2)
    result = {
        "documents": len(docs),
        "doc_tokens": args.doc_tokens,
        "naive_s": naive_s,
        "kascade_s": kascade_s,
        "naive_docs_per_s": len(docs) / naive_s,
        "kascade_docs_per_s": len(docs) / kascade_s,
        "ratio": naive_s / kascade_s,
        "naive_latency": naive_latency,
        "kascade_latency": kascade_latency,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
