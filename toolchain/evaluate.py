"""Quality and cost of model variants on a labeled set, side by side with a reference.

For each variant and engine: macro-F1 and accuracy, the F1 change and the argmax
agreement against the reference (the FP32 export under ONNX Runtime), median ms per
chunk on one thread, file size and the peak memory of a process that loads it and
classifies one 256-token chunk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kascade.errors import UsageError
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import read_manifest
from kascade.toolchain.data import Examples
from kascade.toolchain.measure import Run, peak_rss_mb, run, size_mb, tokenize


@dataclass(frozen=True)
class Row:
    variant: str
    engine: str
    directory: str
    size_mb: float
    macro_f1: float | None
    accuracy: float | None
    f1_delta: float | None
    agreement: float
    ms_per_chunk: float
    speedup: float
    peak_rss_mb: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def macro_f1(y_true: list[str], y_pred: list[str], labels: list[str]) -> float:
    """Macro-averaged F1 over the labels that occur in truth or prediction.

    >>> macro_f1(["a", "b"], ["a", "a"], ["a", "b", "c"])
    0.3333333333333333
    """
    from sklearn.metrics import f1_score

    present = [label for label in labels if label in set(y_true) | set(y_pred)]
    return float(f1_score(y_true, y_pred, labels=present, average="macro", zero_division=0))


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b))


def score(
    result: Run, reference: Run, labels: list[str], truth: list[str] | None, ref_f1: float | None
) -> dict:
    preds = [labels[i] for i in result.predictions]
    out: dict = {
        "agreement": agreement(result.predictions, reference.predictions),
        "ms_per_chunk": result.ms_median,
        "speedup": reference.ms_median / result.ms_median,
        "macro_f1": None,
        "accuracy": None,
        "f1_delta": None,
    }
    if truth is not None:
        f1 = macro_f1(truth, preds, labels)
        out |= {
            "macro_f1": f1,
            "accuracy": float(np.mean([p == t for p, t in zip(preds, truth, strict=True)])),
            "f1_delta": None if ref_f1 is None else f1 - ref_f1,
        }
    return out


def evaluate(
    directories: list[Path],
    data: Examples,
    *,
    reference: Path,
    memory: bool = True,
    engines: tuple[Engine, ...] = (Engine(),),
) -> list[Row]:
    """One row per directory and engine; the reference (usually the FP32 export, under
    ONNX Runtime in FP32) comes first."""
    ref_manifest, _ = read_manifest(reference)
    labels = ref_manifest.labels
    if data.labels is not None:
        unknown = sorted(set(data.labels) - set(labels))
        if unknown:
            raise UsageError(f"labels not known to the model: {', '.join(unknown[:5])}")
    seqs = tokenize(reference, data.texts)
    ref_run = run(reference, seqs)
    ref_f1 = (
        None
        if data.labels is None
        else macro_f1(data.labels, [labels[i] for i in ref_run.predictions], labels)
    )
    rows = []
    for d in [reference, *[x for x in directories if Path(x) != Path(reference)]]:
        manifest, _ = read_manifest(d)
        if manifest.labels != labels:
            raise UsageError(f"{d} has different labels than the reference {reference}")
        for engine in engines:
            reused = d == reference and engine == Engine()
            result = ref_run if reused else run(d, seqs, engine=engine)
            rows.append(
                Row(
                    variant=manifest.variant,
                    engine=engine.name,
                    directory=str(d),
                    size_mb=size_mb(d),
                    peak_rss_mb=peak_rss_mb(d, engine=engine) if memory else None,
                    **score(result, ref_run, labels, data.labels, ref_f1),
                )
            )
    return rows
