"""kascade against the consumer a user would write first, on the same long documents.

The naive baseline: one consumer loop, a Hugging Face ``transformers`` classifier on
PyTorch FP32 (``--bf16``: the one-line ``torch.autocast`` to bf16, which uses AMX where
the host has it), batches of 32, truncation at the model's positions (512 for
BERT-style encoders, 8192 for mmBERT), results produced back to Kafka. kascade: ``kascade
run`` with its defaults (256-token chunks, the quantized model, its cascade if calibrated,
two worker processes). Both are timed from start to the last result, model loading
included, on the same single-topic documents (held-out sentences of every language,
``--doc-tokens`` long), one after the other on the same 2 cores; document accuracy is
scored against the topic the documents were built from.

    python -m bench.baseline --checkpoint runs/e5-sib200 \\
        --kascade-model runs/e5-cascade --data runs/sib200 --doc-tokens 2000 4000 8000
    # a random-init architecture (no trained checkpoint): rebuilt from the FP32 export
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

import numpy as np
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench.chunks import long_documents
from bench.flow import (
    fresh_topics,
    kascade_run_command,
    latency_percentiles,
    output_labels,
    send,
)
from kascade.demo.local_broker import ensure_local_broker
from kascade.operators.encoder import load_model_dir
from kascade.schemas import InputDocument
from kascade.schemas.files import write_text_atomically
from kascade.schemas.kafka import KafkaSettings


def naive_consumer(
    k: KafkaSettings,
    checkpoint: Path,
    expect: int,
    batch: int = 32,
    *,
    windows: bool = False,
    bf16: bool = False,
) -> tuple[float, float, int]:
    """What a first version looks like: PyTorch FP32, padded batches of ``batch``, each
    document truncated at the model's positions, or (``windows``) read whole in windows of
    that many tokens whose probabilities are averaged. Returns seconds from start to the
    last result, the seconds of that spent loading the model, and the window length."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    t0 = time.perf_counter()
    torch.set_num_threads(2)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    max_length = model.config.max_position_embeddings
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
    loaded = time.perf_counter()
    done, eof, pending = 0, set(), []
    while done < expect:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition())
        elif msg is not None:
            pending.append(json.loads(msg.value()))
        if len(pending) >= batch or (pending and len(eof) == len(parts)):
            enc = tokenizer(
                [d["text"] for d in pending],
                truncation=True,
                max_length=max_length,
                return_overflowing_tokens=windows,
                padding=True,
                return_tensors="pt",
            )
            owner = enc.pop("overflow_to_sample_mapping", torch.arange(len(pending)))
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                probs = torch.cat(
                    [
                        torch.softmax(
                            model(**{n: t[s : s + batch] for n, t in enc.items()}).logits.float(),
                            -1,
                        )
                        for s in range(0, len(owner), batch)
                    ]
                )
            for j, d in enumerate(pending):
                mean = probs[owner == j].mean(0)
                label = model.config.id2label[int(mean.argmax())]
                value = {"id": d["id"], "label": label, "score": float(mean.max())}
                producer.produce(k.output_topic, key=d["id"].encode(), value=json.dumps(value))
            producer.flush()
            done += len(pending)
            pending = []
    consumer.close()
    return time.perf_counter() - t0, loaded - t0, max_length


def accuracy(k: KafkaSettings, gold: dict[str, str]) -> float:
    """Share of documents whose result on the output topic names their topic."""
    labels = output_labels(k)
    assert len(labels) == len(gold), f"{len(labels)} results for {len(gold)} documents"
    return sum(labels[i] == topic for i, topic in gold.items()) / len(gold)


def random_init_checkpoint(fp32: Path, out: Path) -> Path:
    """The seeded random-init checkpoint an FP32 export of an architecture was made from."""
    from transformers import AutoTokenizer

    from kascade.toolchain.architectures import random_classifier
    from kascade.toolchain.export import bundled_tokenizer

    manifest = load_model_dir(fp32).manifest
    if not manifest.source.startswith("random-init:"):
        raise SystemExit(f"{fp32} is not a random-init export: give --checkpoint")
    random_classifier(manifest.source.split(":")[1], manifest.labels, seed=0).save_pretrained(out)
    with bundled_tokenizer() as tokenizer:
        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out)
    return out


def kascade_job(k: KafkaSettings, model: Path, workers: int, *extra: str) -> float:
    t0 = time.perf_counter()
    command = kascade_run_command(k, model, "--workers", str(workers), *extra)
    subprocess.run(command, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    naive = p.add_mutually_exclusive_group(required=True)
    naive.add_argument("--checkpoint", type=Path, help="Hugging Face checkpoint for the naive job")
    naive.add_argument(
        "--fp32", type=Path, help="FP32 export of a random-init architecture (rebuilt)"
    )
    p.add_argument("--kascade-model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--doc-tokens", type=int, nargs="+", default=[4000])
    p.add_argument("--documents", type=int, default=8, help="per --doc-tokens size")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--windows",
        action="store_true",
        help="the naive job reads whole documents in windows of the model's positions",
    )
    p.add_argument("--bf16", action="store_true", help="the naive job with bf16 autocast")
    p.add_argument(
        "--run-args", default="", help="more kascade run flags, e.g. '--cascade.mode off'"
    )
    p.add_argument("--brokers")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    brokers = args.brokers or ensure_local_broker(9092).bootstrap
    loaded = load_model_dir(args.kascade_model)
    built = long_documents(args.data, args.doc_tokens, args.documents, loaded.tokenizer)
    docs = [InputDocument(id=f"long-{i}", text=text) for i, (_, text, _) in enumerate(built)]
    gold = {d.id: topic for d, (_, _, topic) in zip(docs, built, strict=True)}
    tokens = [len(loaded.tokenizer.encode(d.text).ids) for d in docs]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint or random_init_checkpoint(args.fp32, Path(tmp) / "checkpoint")
        k1 = fresh_topics(brokers)
        send(k1, docs)
        naive_s, _, truncation = naive_consumer(
            k1, ckpt, len(docs), windows=args.windows, bf16=args.bf16
        )
        naive_latency = latency_percentiles(k1)
    k2 = fresh_topics(brokers)
    send(k2, docs)
    kascade_s = kascade_job(k2, args.kascade_model, args.workers, *args.run_args.split())
    kascade_latency = latency_percentiles(k2)
    result = {
        "documents": len(docs),
        "doc_tokens": args.doc_tokens,
        "tokens_per_doc_median": float(np.median(tokens)),
        "naive_truncation": truncation,
        "naive_windows": args.windows,
        "naive_bf16": args.bf16,
        "kascade_run_args": args.run_args,
        "naive_s": naive_s,
        "kascade_s": kascade_s,
        "naive_docs_per_s": len(docs) / naive_s,
        "kascade_docs_per_s": len(docs) / kascade_s,
        "ratio": naive_s / kascade_s,
        "naive_accuracy": accuracy(k1, gold),
        "kascade_accuracy": accuracy(k2, gold),
        "naive_latency": naive_latency,
        "kascade_latency": kascade_latency,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
