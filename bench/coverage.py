"""How often a calibration done the documented way holds on held-out text.

One certificate is one draw: with probability at most delta it is wrong. This repeats
the whole chunk calibration (group split, heads fitted, thresholds certified) on
``--splits`` random disjoint calibration/held-out splits of SIB-200 in every language
the data folder holds, and measures the cheap stages' disagreement with the full model
on the held-out chunks they settle. The certificate holds where that rate is at most
epsilon; it may fail in at most delta of the splits.

SIB-200 is a parallel corpus: a sentence and its translations share an ``index_id`` and
go to the same side of every split (a translation on the other side would leak its
meaning), as do texts sharing a sentence (``toolchain/overlap.py``). The full model runs
once over the pool; each split refits the heads and recertifies on its own part.

    python -m bench.coverage --model ~/.cache/kascade/models/demo-e5-small-55bb0dcc0bd3 \\
        --data ../shared/data/sib200 --json runs/coverage.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.env import report_splits
from bench.sib200 import read
from kascade.operators.encoder import load_model_dir
from kascade.schemas.settings import ChunkSettings
from kascade.toolchain.calibrate import certify_chunks
from kascade.toolchain.certify import CalibrationTooSmall
from kascade.toolchain.features import extract
from kascade.toolchain.overlap import groups, split_by_group


def pool(data: Path, per_language: int, seed: int) -> tuple[list[str], list[str], list[int]]:
    """Texts, their languages, and their group: the sentence's index_id, merged with
    groups of shared sentences."""
    rng = random.Random(seed)
    by_id: dict[str, list[tuple[str, str]]] = {}
    for lang_dir in sorted(p for p in data.iterdir() if p.is_dir()):
        rows = read(lang_dir / "train.tsv") + read(lang_dir / "dev.tsv")
        for row in rng.sample(rows, min(per_language, len(rows))):
            by_id.setdefault(row["index_id"], []).append((row["text"], lang_dir.name))
    texts, langs, ids = [], [], []
    for index_id, members in sorted(by_id.items()):
        for text, lang in members:
            texts.append(text)
            langs.append(lang)
            ids.append(index_id)
    return texts, langs, groups(texts, related=ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--per-language", type=int, default=150)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--held-out", type=float, default=0.5, help="share of the pool held out")
    ap.add_argument("--epsilon", type=float, default=0.02)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--overlap", type=int, default=32)
    ap.add_argument(
        "--within",
        choices=["group", "chunk"],
        default="group",
        help="how the calibration part splits into fitting and certifying: by group of"
        " texts (kascade calibrate), or by chunk (kascade before issue #29), to compare",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    texts, langs, text_groups = pool(args.data, args.per_language, seed=0)
    chunking = ChunkSettings(max_tokens=args.chunk_tokens, overlap=args.overlap)
    t0 = time.perf_counter()
    feats = extract(args.model, texts, max_tokens=chunking.max_tokens, overlap=chunking.overlap)
    extract_s = time.perf_counter() - t0
    n_labels = len(load_model_dir(args.model).manifest.labels)
    rows = []
    for s in range(args.splits):
        held, calib = split_by_group(feats.source, text_groups, args.held_out, seed=1000 + s)
        within = text_groups if args.within == "group" else list(range(len(texts)))
        chunk_of = feats.source[calib] if args.within == "group" else np.arange(len(calib))
        fit_pos, cert_pos = split_by_group(chunk_of, within, 0.4, seed=s)
        fit, cert = calib[fit_pos], calib[cert_pos]
        row: dict = {"split": s, "fit": len(fit), "certify": len(cert), "held_out": len(held)}
        try:
            got = certify_chunks(
                feats, fit, cert, n_labels, epsilon=args.epsilon, delta=args.delta, seed=s
            )
        except CalibrationTooSmall:
            rows.append(row | {"certified": False})
            continue
        by0, by1, wrong = got.settles(feats, held)
        settled = by0 | by1
        rate = float(wrong.sum() / settled.sum()) if settled.any() else 0.0
        rows.append(
            row
            | {
                "certified": True,
                "threshold_s1": got.threshold,
                "calibration_disagreements": f"{got.disagreements}/{got.accepted}",
                "held_out_settled_share": float(settled.mean()),
                "held_out_disagreement": rate,
                "above_epsilon": rate > args.epsilon,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    certified = [r for r in rows if r["certified"]]
    above = sum(r["above_epsilon"] for r in certified)
    summary = {
        "languages": len(set(langs)),
        "texts": len(texts),
        "within": args.within,
        "chunks": len(feats.target),
        "extract_s": round(extract_s, 1),
        "splits": args.splits,
        "certified": len(certified),
        "above_epsilon": above,
        "share_above_epsilon": above / len(certified) if certified else None,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "median_held_out_disagreement": float(
            np.median([r["held_out_disagreement"] for r in certified])
        )
        if certified
        else None,
        "median_settled_share": float(np.median([r["held_out_settled_share"] for r in certified]))
        if certified
        else None,
    }
    report_splits(args.json, summary, rows)


if __name__ == "__main__":
    main()
