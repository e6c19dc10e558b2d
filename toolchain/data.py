"""Labeled and unlabeled text from TSV, CSV or JSONL files, by column name."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kascade.errors import UsageError


@dataclass(frozen=True)
class Examples:
    texts: list[str]
    labels: list[str] | None

    def __len__(self) -> int:
        return len(self.texts)


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise UsageError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        if suffix in (".tsv", ".csv"):
            with open(path, encoding="utf-8", newline="") as f:
                delimiter = "\t" if suffix == ".tsv" else ","
                quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
                return list(csv.DictReader(f, delimiter=delimiter, quoting=quoting))
        if suffix == ".txt":
            with open(path, encoding="utf-8") as f:
                return [{"text": line.rstrip("\n")} for line in f if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    raise UsageError(f"{path}: unsupported data format {suffix!r} (use .tsv, .csv, .jsonl, .txt)")


def read_examples(
    path: Path | str, *, text_column: str = "text", label_column: str | None = "label"
) -> Examples:
    """Texts (and labels, if ``label_column`` is given) from ``path``."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise UsageError(f"{path} has no rows")
    columns = list(rows[0].keys())
    for col in (text_column, label_column):
        if col is not None and col not in columns:
            raise UsageError(f"{path} has no column {col!r}; its columns are {', '.join(columns)}")
    texts = [str(r[text_column]) for r in rows]
    labels = None if label_column is None else [str(r[label_column]) for r in rows]
    return Examples(texts, labels)


def split_documents(
    examples: Examples, *, seed: int
) -> tuple[list[str], list[str] | None, list[str]]:
    """A seeded half of the texts (with their labels) and the other half, disjoint.

    >>> texts, labels, rest = split_documents(Examples(list("abcd"), list("ABCD")), seed=0)
    >>> sorted(texts + rest), [t.upper() for t in texts] == labels
    (['a', 'b', 'c', 'd'], True)
    """
    order = np.random.default_rng(seed).permutation(len(examples))
    first, second = np.split(order, [len(examples) // 2])
    labels = None if examples.labels is None else [examples.labels[i] for i in first]
    return [examples.texts[i] for i in first], labels, [examples.texts[i] for i in second]
