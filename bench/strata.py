"""Per-kind certificates against one certificate for the mix, on streams of one kind.

One certificate bounds the disagreement of the chunks the cheap stages settle on text
mixed as the calibration's was. This builds documents from SIB-200 (a topic's sentences
joined, in one language): long ones (``--long-sentences``, several chunks) and short
ones (``--short-sentences``, one chunk), repeats the chunk calibration on ``--splits``
random disjoint calibration/held-out splits, certifying once for the mix
(``by_kind=False``) and once per kind (``kascade calibrate`` now: by document length
here, the languages being too small to stand alone at this size), and measures each
certificate on held-out streams of one kind: short documents only, long only, the mix.
A certificate holds on a stream where the held-out disagreement is at most epsilon.

A block of sentence ids (all of one topic) makes one document in every language; a
block and all its translations go to one side of every split (``index_id`` groups, as
in :mod:`bench.coverage`).

    python -m bench.strata --model ~/.cache/kascade/models/demo-e5-small-55bb0dcc0bd3 \\
        --data ../shared/data/sib200 --json runs/strata.json
    # per language: one-sentence documents in 20 languages (about 400 certification
    # chunks each), epsilon 0.05, where a language holds enough to stand alone
    python -m bench.strata --model ... --data ../shared/data/sib200 --long-share 0 \
        --short-sentences 1 1 --epsilon 0.05 --by-language --json runs/strata_languages.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.env import report_splits
from bench.sib200 import joined, parallel
from kascade.operators.encoder import load_model_dir
from kascade.toolchain.calibrate import ChunkCertificate, certify_chunks
from kascade.toolchain.certify import CalibrationTooSmall
from kascade.toolchain.features import Features, extract
from kascade.toolchain.overlap import split_by_group
from kascade.toolchain.strata import chunk_kinds


def documents(
    data: Path, long_share: float, long_sentences: tuple[int, int],
    short_sentences: tuple[int, int], seed: int,
) -> tuple[list[str], list[int], list[str]]:  # fmt: skip
    """Documents of one topic and language each, the block of sentence ids each was
    made of (its group: shared by its translations), and its language."""
    rng = random.Random(seed)
    by_lang, topics = parallel(data)
    blocks: list[list[str]] = []
    for ids in topics.values():
        rng.shuffle(ids)
        cut = int(len(ids) * long_share)
        for part, (lo, hi) in ((ids[:cut], long_sentences), (ids[cut:], short_sentences)):
            while part:
                n = rng.randint(lo, hi)
                blocks.append(part[:n])
                part = part[n:]
    texts, groups = joined(by_lang, blocks)
    return texts, groups, [lang for _ in blocks for lang in by_lang]  # as joined orders them


def rates(got: ChunkCertificate, feats: Features, held: np.ndarray, kinds: dict) -> dict:
    """The held-out disagreement and settled share of each stream: one kind, or the mix."""
    out = {}
    for name, members in kinds.items():
        chunks = held[members[held]]
        by0, by1, wrong = got.settles(feats, chunks)
        settled = by0 | by1
        rate = float(wrong.sum() / settled.sum()) if settled.any() else 0.0
        out[name] = {"disagreement": rate, "settled_share": float(settled.mean())}
    return out


def _summary(held: list[dict], epsilon: float) -> dict:
    rate = [h["disagreement"] for h in held]
    share = [h["settled_share"] for h in held]
    return {
        "above_epsilon": sum(r > epsilon for r in rate),
        "median_disagreement": float(np.median(rate)) if rate else None,
        "max_disagreement": max(rate, default=None),
        "median_settled_share": float(np.median(share)) if share else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--held-out", type=float, default=0.3, help="share of the blocks held out")
    ap.add_argument("--long-share", type=float, default=0.75, help="of the sentence ids")
    ap.add_argument("--long-sentences", type=int, nargs=2, default=(12, 20))
    ap.add_argument("--short-sentences", type=int, nargs=2, default=(1, 4))
    ap.add_argument(
        "--fit-fraction", type=float, default=0.4, help="of the calibration, for the heads"
    )
    ap.add_argument("--epsilon", type=float, default=0.02)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--overlap", type=int, default=32)
    ap.add_argument(
        "--by-language",
        action="store_true",
        help="name each text's language to the calibration (strata by language) and"
        " measure held-out streams of one language each",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    texts, groups, langs = documents(
        args.data, args.long_share, tuple(args.long_sentences), tuple(args.short_sentences), 0
    )
    languages = langs if args.by_language else None
    t0 = time.perf_counter()
    feats = extract(args.model, texts, max_tokens=args.chunk_tokens, overlap=args.overlap)
    extract_s = time.perf_counter() - t0
    _, lengths = chunk_kinds(None, feats.source)
    kinds = {"short": lengths == "short", "long": lengths == "long", "mix": lengths != ""}
    if args.by_language:
        of_chunk = np.asarray(langs)[feats.source]
        kinds = {lang: of_chunk == lang for lang in sorted(set(langs))} | {"mix": lengths != ""}
    n_labels = len(load_model_dir(args.model).manifest.labels)
    rows = []
    for s in range(args.splits):
        held, calib = split_by_group(feats.source, groups, args.held_out, seed=1000 + s)
        fit_pos, cert_pos = split_by_group(feats.source[calib], groups, args.fit_fraction, seed=s)
        fit, cert = calib[fit_pos], calib[cert_pos]
        row: dict = {"split": s, "fit": len(fit), "certify": len(cert), "held_out": len(held)}
        for how, by_kind in (("one", False), ("per_kind", True)):
            try:
                got = certify_chunks(
                    feats, fit, cert, n_labels, epsilon=args.epsilon, delta=args.delta,
                    seed=s, by_kind=by_kind, languages=languages,
                )  # fmt: skip
            except CalibrationTooSmall:
                row[how] = None
                continue
            row[how] = {
                "strata": [st.model_dump() for st in got.strata],
                "held_out": rates(got, feats, held, kinds),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        "texts": len(texts),
        "chunks": len(feats.target),
        "chunks_by_kind": {k: int(m.sum()) for k, m in kinds.items()},
        "extract_s": round(extract_s, 1),
        "splits": args.splits,
        "epsilon": args.epsilon,
        "delta": args.delta,
    }
    for how in ("one", "per_kind"):
        done = [r[how] for r in rows if r[how] is not None]
        summary[how] = {"certified": len(done)} | {
            kind: _summary([d["held_out"][kind] for d in done], args.epsilon) for kind in kinds
        }
    report_splits(args.json, summary, rows)


if __name__ == "__main__":
    main()
