"""The live test of the certified bound on a real model's own audits, offline.

Every chunk of a text set goes through the cascade's cheap stages and the full model,
as an audit would: settled chunks and whether the full model agreed. Then streams of
``--audits`` audits are drawn from those outcomes (with replacement, in random order)
and fed to the test the job runs (:class:`~kascade.operators.bound.BoundTest`, at
the cascade's epsilon and delta / 2 as the overall test gets): how many streams raise an
alarm, and after how many audits.

    python -m bench.long_docs documents --data runs/sib200 --split holdout --count 150 \\
        --boilerplate-share 0.3 --tokenizer-model runs/e5-eps01 --seed 9 \\
        --out runs/guarantee/holdout-docs.jsonl
    python -m bench.guarantee --model runs/e5-eps01 --file runs/guarantee/holdout-docs.jsonl \\
        --json runs/guarantee/like-calibration.json      # drawn like the calibration text
    python -m bench.guarantee --model runs/e5-eps01 --data runs/sib200 \\
        --json runs/guarantee/sentences.json             # single sentences: not like it
    python -m bench.guarantee --model runs/e5-eps01 --boilerplate --json runs/guarantee/mail.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from bench.long_docs import _rows, boilerplate
from kascade.operators.bound import BoundTest
from kascade.operators.calibration import Cascade
from kascade.operators.chunking import SpecialTokens, chunk_text
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.operators.items import ChunkTask, DocMeta
from kascade.operators.verdicts import cheap_stages
from kascade.schemas.files import write_text_atomically


def audits(
    model_dir: Path, texts: list[str], langs: list[str | None] | None = None
) -> list[list[bool]]:
    """Per text, for each chunk the cheap stages settle (chunked as the cascade was
    certified, at the thresholds of the text's stratum): did the full model disagree?"""
    model = load_model_dir(model_dir)
    encoder = Encoder(model, graphs="stages")
    cascade = Cascade.load(model_dir, model.manifest_sha256)
    cheap = cheap_stages(encoder, cascade, 0.0)
    chunking = cascade.spec.chunking
    specials = SpecialTokens.of(model.tokenizer)
    out = []
    for n, text in enumerate(texts):
        chunks = chunk_text(
            text,
            model.tokenizer,
            max_tokens=chunking.max_tokens,
            overlap=chunking.overlap,
            max_chunks=64,
            specials=specials,
        )
        lang = None if langs is None else langs[n]
        meta = DocMeta(
            id="x", total_chunks=len(chunks), lang=lang, metadata=None, timestamp_ms=None
        )
        disagree = []
        for c in chunks:
            v = cheap(ChunkTask(meta, c.index, c.ids, c.n_tokens))
            if v.stage != "uncertain":
                disagree.append(int(np.argmax(encoder.logits(c.ids))) != int(v.probs.argmax()))
        out.append(disagree)
    return out


def streams(disagree: list[bool], epsilon: float, delta: float, n: int, audits: int) -> dict:
    rng = random.Random(0)
    alarms = []
    for _ in range(n):
        test = BoundTest(epsilon, delta / 2)
        at = next((i + 1 for i in range(audits) if test.observe(rng.choice(disagree))), None)
        alarms.append(at)
    fired = sorted(a for a in alarms if a is not None)
    return {
        "streams": n,
        "audits_per_stream": audits,
        "fired": len(fired),
        "median_audits_to_alarm": float(np.median(fired)) if fired else None,
        "max_audits_to_alarm": max(fired) if fired else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("runs/sib200"))
    ap.add_argument("--boilerplate", action="store_true", help="mail headers, not SIB-200")
    ap.add_argument("--file", type=Path, help="JSON lines with a text field (bench.long_docs)")
    ap.add_argument("--texts", type=int, default=1500)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--audits", type=int, default=10_000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(1)
    if args.file is not None:
        rows = [json.loads(line) for line in args.file.read_text().splitlines() if line]
        texts = [r["text"] for r in rows][: args.texts]
    elif args.boilerplate:
        tokenizer = load_model_dir(args.model).tokenizer
        n_tokens = lambda s: len(tokenizer.encode(s).ids)  # noqa: E731
        texts = [boilerplate(rng, n_tokens, target=200) for _ in range(args.texts // 5)]
    else:
        pool = [t for ts in _rows(args.data, ("holdout",)).values() for t in ts]
        texts = rng.sample(pool, min(args.texts, len(pool)))
    disagree = [d for per_text in audits(args.model, texts) for d in per_text]
    point = Cascade.load(args.model, load_model_dir(args.model).manifest_sha256).point
    result = {
        "model": str(args.model),
        "texts": str(args.file)
        if args.file
        else "boilerplate"
        if args.boilerplate
        else "held-out SIB-200 sentences",
        "epsilon": point.epsilon,
        "delta": point.delta,
        "settled_chunks": len(disagree),
        "disagreement": sum(disagree) / len(disagree),
        **streams(disagree, point.epsilon, point.delta, args.streams, args.audits),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.json, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
