"""How often a certified document stop holds on held-out documents.

The document stop's certificate is one draw too: with probability at most delta, the
documents its rule stops early disagree with the full read on more than epsilon_doc of
them. This builds multi-chunk documents from SIB-200 (a topic's sentences joined, in one
language; ``--opening-share`` of them open with a few sentences of another topic, the
stop's hard case) and repeats the documented calibration on ``--splits`` random disjoint
calibration/held-out splits: half of the calibration documents certify the chunk
thresholds (heads fitted on 40% of them, per kind as ``kascade calibrate`` does, and the
on-topic head on the same chunks), the other half certify the stop (``kascade calibrate
--documents`` given the ``--texts`` file itself), and the certified rule reads the
held-out documents. It holds where the held-out stopped documents disagree with their
full read on at most epsilon_doc.

Every document is read from the features of one full-model pass (the cheap heads'
probabilities, the thresholds of its chunks' stratum, the on-topic head, the full
model's answers), exactly as :func:`~kascade.toolchain.document_stop.read_documents`
reads it through the graphs, so a split costs no model run. A block of sentence ids
makes one document in every language, and a block with all its translations goes to one
side of every split; the stop's test counts a block's translations as one draw, as
``kascade calibrate --group-column`` does (``--each-document``: each one, as before).

    python -m bench.stop_coverage --model ~/.cache/kascade/models/demo-e5-small-55bb0dcc0bd3 \\
        --data ../shared/data/sib200 --json runs/stop_coverage.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from bench.env import report_splits
from bench.sib200 import joined, parallel
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.calibration import Head, on_topic_of
from kascade.operators.encoder import load_model_dir
from kascade.operators.reading import STOP_PATH, Seen
from kascade.schemas import Aggregation
from kascade.toolchain.calibrate import ChunkCertificate, certify_chunks, fit_on_topic
from kascade.toolchain.certify import CalibrationTooSmall
from kascade.toolchain.document_stop import Document, certify_stop, replay
from kascade.toolchain.features import Features, extract
from kascade.toolchain.overlap import split_by_group


def documents(
    data: Path, sentences: tuple[int, int], opening_share: float, opening: tuple[int, int],
    seed: int,
) -> tuple[list[str], list[int]]:  # fmt: skip
    """Documents of one topic and language each (some opening with another topic's
    sentences), and the block each was made of: its group, shared by its translations."""
    rng = random.Random(seed)
    by_lang, topics = parallel(data)
    for ids in topics.values():
        rng.shuffle(ids)
    blocks: list[list[str]] = []
    names = sorted(topics)
    while True:
        topic = rng.choice([t for t in names if len(topics[t]) >= sentences[0]] or [None])
        if topic is None:
            break
        body = [
            topics[topic].pop() for _ in range(min(rng.randint(*sentences), len(topics[topic])))
        ]
        others = [t for t in names if t != topic and topics[t]]
        if others and rng.random() < opening_share:
            other = topics[rng.choice(others)]
            body = [other.pop() for _ in range(min(rng.randint(*opening), len(other)))] + body
        blocks.append(body)
    return joined(by_lang, blocks)


def subset(feats: Features, chunks: np.ndarray) -> Features:
    return replace(feats, **{f.name: getattr(feats, f.name)[chunks] for f in fields(feats)})


def read_all(
    feats: Features,
    docs: np.ndarray,
    got: ChunkCertificate,
    on_topic: Head | None,
    aggregation: Aggregation,
    groups: list[int] | None = None,
) -> list[Document]:
    """Each document of ``docs`` (text indices) as a run reads it, from the features,
    with its group of related documents where ``groups`` (one per text) gives one."""
    s0, s1 = Head.of(got.s0.weights), Head.of(got.s1.weights)
    out = []
    for d in docs:
        rows = np.flatnonzero(feats.source == d)
        if len(rows) < 2:
            continue
        by0, by1, _ = got.settles(feats, rows)
        p0, p1 = s0.probs(feats.embeddings[rows]), s1.probs(feats.hidden[rows])
        seen = [
            Seen(
                bool(by0[i] or by1[i]),
                p0[i] if by0[i] else p1[i],
                int(feats.tokens[r]),
                1.0 if on_topic is None else on_topic_of(on_topic, feats.embeddings[r]),
            )
            for i, r in enumerate(rows)
        ]
        weights = np.maximum(feats.tokens[rows], 1).astype(np.float64)
        full, _ = STRATEGIES[aggregation].combine(feats.full[rows], weights)
        ends = [int(e) for e in feats.ends[rows]]
        group = None if groups is None else groups[d]
        out.append(Document(seen, int(full), ends, int(feats.text_tokens[rows[0]]), group))
    return out


def one_split(
    feats: Features, groups: list[int], n_labels: int, s: int, args: argparse.Namespace
) -> dict:
    agg = Aggregation(args.aggregation)
    held, calib = split_by_group(feats.source, groups, args.held_out, seed=1000 + s)
    chunk_pos, stop_pos = split_by_group(feats.source[calib], groups, 0.5, seed=2000 + s)
    chunks, stop_chunks = calib[chunk_pos], calib[stop_pos]
    fit_pos, cert_pos = split_by_group(feats.source[chunks], groups, 0.4, seed=s)
    fit, cert = chunks[fit_pos], chunks[cert_pos]
    row: dict = {"split": s, "certify_chunks": len(cert)}
    try:
        got = certify_chunks(
            feats, fit, cert, n_labels, epsilon=args.epsilon, delta=args.delta, seed=s
        )
    except CalibrationTooSmall:
        return row | {"certified": False, "why": "chunks"}
    weights = fit_on_topic(subset(feats, chunks), agg, s)
    on_topic = None if weights is None else Head.of(weights)
    related = None if args.each_document else groups  # a block's translations: one draw
    stop_docs = read_all(feats, np.unique(feats.source[stop_chunks]), got, on_topic, agg, related)
    held_docs = read_all(feats, np.unique(feats.source[held]), got, on_topic, agg)
    row |= {"stop_documents": len(stop_docs), "held_out_documents": len(held_docs)}
    # As kascade calibrate: without an on-topic head, no rule that asks it.
    path = tuple(r for r in STOP_PATH if on_topic is not None or r.min_on_topic == 0)
    try:
        stop = certify_stop(
            stop_docs, aggregation=agg, epsilon=args.epsilon_doc, delta=args.delta, path=path,
            seed=s,
        )  # fmt: skip
    except CalibrationTooSmall:
        return row | {"certified": False, "why": "stop"}
    r = replay(stop.rule, held_docs, agg)
    rate = r.disagreements / r.stopped if r.stopped else 0.0
    return row | {
        "certified": True,
        "rule": stop.rule.describe(),
        "calibration": f"{stop.disagreements}/{stop.stopped}",
        "draws": stop.draws,
        "held_out_stopped": r.stopped,
        "held_out_disagreement": rate,
        "above_epsilon_doc": rate > args.epsilon_doc,
        "held_out_tokens_read": r.tokens_read / max(r.tokens, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--held-out", type=float, default=0.3, help="share of the blocks held out")
    ap.add_argument("--sentences", type=int, nargs=2, default=(20, 30))
    ap.add_argument("--opening-share", type=float, default=0.3)
    ap.add_argument("--opening", type=int, nargs=2, default=(4, 8), help="sentences")
    ap.add_argument("--epsilon", type=float, default=0.02)
    ap.add_argument("--epsilon-doc", type=float, default=0.05)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--aggregation", default="token_mean")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--overlap", type=int, default=32)
    ap.add_argument(
        "--each-document",
        action="store_true",
        help="count every document as a draw, as calibration did before it counted groups",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    texts, groups = documents(
        args.data, tuple(args.sentences), args.opening_share, tuple(args.opening), seed=0
    )
    t0 = time.perf_counter()
    feats = extract(args.model, texts, max_tokens=args.chunk_tokens, overlap=args.overlap)
    extract_s = time.perf_counter() - t0
    n_labels = len(load_model_dir(args.model).manifest.labels)
    rows = []
    for s in range(args.splits):
        rows.append(one_split(feats, groups, n_labels, s, args))
        print(json.dumps(rows[-1]), flush=True)
    certified = [r for r in rows if r["certified"]]
    rates = [r["held_out_disagreement"] for r in certified]
    summary = {
        "documents": len(texts),
        "blocks": len(set(groups)),
        "chunks": len(feats.target),
        "extract_s": round(extract_s, 1),
        "splits": args.splits,
        "certified": len(certified),
        "above_epsilon_doc": sum(r["above_epsilon_doc"] for r in certified),
        "epsilon_doc": args.epsilon_doc,
        "draws": "each document" if args.each_document else "one per block",
        "delta": args.delta,
        "median_held_out_disagreement": float(np.median(rates)) if rates else None,
        "max_held_out_disagreement": max(rates, default=None),
        "median_held_out_tokens_read": float(
            np.median([r["held_out_tokens_read"] for r in certified])
        )
        if certified
        else None,
    }
    report_splits(args.json, summary, rows)


if __name__ == "__main__":
    main()
