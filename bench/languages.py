"""Agreement with FP32 on the other languages' translations of the held-out sentences:
a low-margin stress test for quantized variants of an English model.

    python -m bench.languages runs/minilm-fp32 runs/minilm-auto99 --data runs/sib200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from kascade.schemas.files import write_text_atomically
from kascade.toolchain.data import read_examples
from kascade.toolchain.measure import run, tokenize


def agreement_by_language(reference: Path, variants: list[Path], data: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in sorted(data.glob("holdout-*.tsv")):
        lang = f.stem.removeprefix("holdout-")
        texts = read_examples(f, text_column="text", label_column=None).texts
        seqs = tokenize(reference, texts)
        ref = run(reference, seqs, warmup=0).predictions
        out[lang] = {
            str(v): float(np.mean(run(v, seqs, warmup=0).predictions == ref)) for v in variants
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", type=Path)
    p.add_argument("variants", nargs="+", type=Path)
    p.add_argument("--data", type=Path, required=True, help="folder of bench.sib200 splits")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = agreement_by_language(args.reference, args.variants, args.data)
    for lang, row in result.items():
        print(lang, " ".join(f"{Path(k).name}={v:.3f}" for k, v in row.items()))
    means = {v: float(np.mean([r[v] for r in result.values()])) for v in map(str, args.variants)}
    print("mean", " ".join(f"{Path(k).name}={v:.3f}" for k, v in means.items()))
    if args.json:
        write_text_atomically(
            args.json, json.dumps({"by_language": result, "mean": means}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
