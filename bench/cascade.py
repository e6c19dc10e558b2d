"""How much of the stream the cascade settles without the full model, and what that costs
in agreement, against the full-model-only answer on the same documents.

Documents are built per language from same-topic sentences (``--per-doc`` each): the
calibration documents from the calibration split and its translations, the test
documents from the held-out split and its translations (never seen by training,
quantization or calibration). Offline (no Kafka): every chunk gets both the cheap
verdicts and the full model's answer, so settled-chunk agreement, document agreement and
macro-F1 can be compared exactly.

    python -m bench.cascade --model runs/minilm-auto99 --data runs/sib200 \\
        --epsilon 0.02 --delta 0.05 --json runs/cascade.json
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from kascade.operators.calibration import Cascade
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, load_model_dir, softmax
from kascade.operators.exits import read_all
from kascade.operators.items import ChunkResult, ChunkTask, DocMeta, Escalation, Outcome
from kascade.operators.reduce import ChunkVerdict, aggregate
from kascade.operators.verdicts import CascadeState, Verdict, cheap_stages
from kascade.schemas import Aggregation, Reading, StopReason
from kascade.schemas.files import write_text_atomically
from kascade.schemas.settings import ChunkSettings
from kascade.toolchain.calibrate import calibrate, min_accepted
from kascade.toolchain.calibrate_config import CalibrateConfig
from kascade.toolchain.evaluate import macro_f1


def topic_documents(files: list[Path], per_doc: int) -> list[tuple[str, str, str]]:
    """(id, text, category) documents of ``per_doc`` same-topic sentences, per file."""
    docs = []
    for f in files:
        with open(f, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
        by_topic: dict[str, list[str]] = defaultdict(list)
        for r in rows:
            by_topic[r["category"]].append(r["text"])
        for topic, sents in sorted(by_topic.items()):
            for i in range(0, len(sents) - per_doc + 1, per_doc):
                text = " ".join(sents[i : i + per_doc])
                docs.append((f"{f.stem}/{topic}/{i}", text, topic))
    return docs


def language_of(doc_id: str) -> str:
    """The language of a document of :func:`topic_documents` (English files carry none).

    >>> language_of("holdout-deu_Latn/health/3"), language_of("holdout/health/3")
    ('deu_Latn', 'eng_Latn')
    """
    stem = doc_id.split("/", 1)[0]
    return stem.split("-", 1)[1] if "-" in stem else "eng_Latn"


def evaluate(
    model: Path, docs: list[tuple[str, str, str]], *, max_tokens: int, strategy: Aggregation
) -> dict:
    loaded = load_model_dir(model)
    labels = loaded.manifest.labels
    encoder = Encoder(loaded, graphs="stages")
    cascade = Cascade.load(model, loaded.manifest_sha256)
    cheap = cheap_stages(encoder, cascade, 0.0)
    timing = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    # per language: chunks, settled chunks, settled agreeing, documents, documents agreeing
    per_lang: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(5, dtype=int))
    gold, full_pred, cascade_pred = [], [], []
    for doc_id, text, topic in docs:
        chunks = chunk_text(
            text, loaded.tokenizer, max_tokens=max_tokens, overlap=32, max_chunks=10_000
        )
        meta = DocMeta(doc_id, len(chunks), None, None, None)
        tasks = [ChunkTask(meta, c.index, c.ids, c.n_tokens) for c in chunks]
        verdicts: dict[int, Verdict] = {}
        full: dict[int, np.ndarray] = {}
        for t in tasks:
            t0 = time.perf_counter()
            v = cheap(t)
            timing[f"cheap_{v.stage}"].append(time.perf_counter() - t0)
            verdicts[t.index] = v
            ids = t.ids[None, :]
            mask = np.ones_like(ids)
            hidden = (
                v.hidden
                if v.hidden is not None
                else encoder.prefix(encoder.embeddings(ids, mask), mask)
            )
            t0 = time.perf_counter()
            full[t.index] = softmax(encoder.suffix(hidden, mask)[0].astype(np.float64))
            timing["suffix"].append(time.perf_counter() - t0)
        # Read to the end (no stop in this benchmark): the document-level early exit.
        state = CascadeState(meta, {t.index: t for t in tasks}, verdicts)
        to_the_end = Reading(chunks_read=len(tasks), tokens_read=0, stopped=StopReason.END)
        out = read_all(state, to_the_end, strategy, 0.0) if tasks else []
        results = []
        for x in out:
            if isinstance(x, Outcome):
                continue
            if isinstance(x, Escalation):
                results.append(ChunkVerdict(x.task.index, x.task.n_tokens, full[x.task.index]))
                counts["full"] += 1
            else:
                assert isinstance(x, ChunkResult)
                results.append(ChunkVerdict(x.index, x.n_tokens, x.probs))
                counts[x.stage] += 1
                if x.stage in ("s0", "s1"):
                    agrees = int(x.probs.argmax() == full[x.index].argmax())
                    per_lang[language_of(doc_id)] += (0, 1, agrees, 0, 0)
        reference = [ChunkVerdict(t.index, t.n_tokens, full[t.index]) for t in tasks]
        a = aggregate(results, strategy, labels).label
        b = aggregate(reference, strategy, labels).label
        per_lang[language_of(doc_id)] += (len(tasks), 0, 0, 1, int(a == b))
        gold.append(topic)
        cascade_pred.append(a)
        full_pred.append(b)
    n_chunks = sum(counts.values())
    total = sum(per_lang.values())
    ms = {k: float(np.mean(v) * 1000) for k, v in timing.items()}
    f1_full = macro_f1(gold, full_pred, labels)
    f1_cascade = macro_f1(gold, cascade_pred, labels)
    return {
        "documents": len(docs),
        "chunks": n_chunks,
        "share": {k: v / n_chunks for k, v in counts.items()},
        "settled_chunk_agreement": total[2] / max(total[1], 1),
        "settled_chunks": int(total[1]),
        "document_agreement": total[4] / total[3],
        "macro_f1_full_only": f1_full,
        "macro_f1_cascade": f1_cascade,
        "f1_delta": f1_cascade - f1_full,
        "mean_ms": ms,
        "by_language": {
            lang: {
                "chunks": int(c[0]),
                "settled_share": c[1] / c[0],
                "settled_chunk_agreement": c[2] / max(c[1], 1),
                "document_agreement": c[4] / c[3],
            }
            for lang, c in sorted(per_lang.items())
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", type=Path, required=True, help="model directory (copied, then calibrated)"
    )
    p.add_argument("--data", type=Path, required=True, help="bench.sib200 output folder")
    p.add_argument("--work", type=Path, default=Path("runs/cascade-model"))
    p.add_argument("--per-doc", type=int, default=3, help="sentences per test document")
    p.add_argument("--calib-per-doc", type=int, help="sentences per calibration text")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--epsilon", type=float, default=0.02)
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--english-only", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    def files(split: str) -> list[Path]:
        return (
            [args.data / f"{split}.tsv"]
            if args.english_only
            else sorted(args.data.glob(f"{split}*.tsv"))
        )

    calib = topic_documents(files("calibration"), args.calib_per_doc or args.per_doc)
    # Heads are fitted on the fine-tuning text (English) or its translations: any text
    # works for fitting; only the certification split must be unseen.
    heads_files = (
        [args.data / "finetune.tsv"] if args.english_only else sorted(args.data.glob("heads-*.tsv"))
    )
    heads = topic_documents(heads_files, args.calib_per_doc or args.per_doc)
    test = topic_documents(files("holdout"), args.per_doc)
    if args.work.exists():
        shutil.rmtree(args.work)
    shutil.copytree(args.model, args.work)
    print(
        f"{len(calib)} calibration documents, {len(test)} test documents;"
        f" certifying needs >= {min_accepted(args.epsilon, args.delta)} accepted, none disagreeing"
    )
    spec = calibrate(
        args.work,
        [t for _, t, _ in calib],
        CalibrateConfig(
            epsilon=args.epsilon,
            delta=args.delta,
            chunking=ChunkSettings(max_tokens=args.max_tokens),
        ),
        head_texts=[t for _, t, _ in heads],
        languages=[language_of(d) for d, _, _ in calib],
    )
    result = {
        "calibration": spec.report.model_dump()
        | {"point": spec.operating_points[spec.default_operating_point].model_dump()},
        "test": evaluate(
            args.work, test, max_tokens=args.max_tokens, strategy=Aggregation.TOKEN_MEAN
        ),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
