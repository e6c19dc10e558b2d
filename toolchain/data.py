"""Labeled and unlabeled text from TSV, CSV or JSONL files, by column name."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kascade.errors import UsageError
from kascade.toolchain.overlap import groups, split_by_group


@dataclass(frozen=True)
class Examples:
    texts: list[str]
    labels: list[str] | None
    # Each text's group of related texts (None: related to no other), where given.
    groups: list[str | None] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, rows: np.ndarray) -> Examples:
        labels = None if self.labels is None else [self.labels[i] for i in rows]
        related = None if self.groups is None else [self.groups[i] for i in rows]
        return Examples([self.texts[i] for i in rows], labels, related)


# A long document is one field: csv's default limit (131,072 characters) would refuse
# exactly the texts calibrate --documents is for.
csv.field_size_limit(2**31 - 1)


def _rows(path: Path) -> list[tuple[int, dict]]:
    """Each row of ``path`` with the line it starts on."""
    if not path.is_file():
        raise UsageError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            with open(path, encoding="utf-8") as f:
                rows = [(n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip()]
            for n, row in rows:
                if not isinstance(row, dict):
                    raise UsageError(
                        f"{path}:{n}: a row is a JSON object, not {type(row).__name__}"
                    )
            return rows
        if suffix in (".tsv", ".csv"):
            with open(path, encoding="utf-8", newline="") as f:
                reader = (
                    csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                    if suffix == ".tsv"
                    else csv.DictReader(f)
                )
                return [(reader.line_num, row) for row in reader]
        if suffix == ".txt":
            with open(path, encoding="utf-8") as f:
                return [
                    (n, {"text": line.rstrip("\n")}) for n, line in enumerate(f, 1) if line.strip()
                ]
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    raise UsageError(f"{path}: unsupported data format {suffix!r} (use .tsv, .csv, .jsonl, .txt)")


def read_examples(
    path: Path | str,
    *,
    text_column: str = "text",
    label_column: str | None = "label",
    missing_label: str | None = None,
    group_column: str | None = None,
    optional: bool = False,
) -> Examples:
    """Texts (and labels, if ``label_column`` is given) from ``path``; every row must have
    them, as text or a number (UsageError naming the line otherwise), except that with
    ``missing_label`` a row without a label (no key, null, an empty cell) gets that one:
    ``kascade sample`` writes no ``lang`` for a record that named none. ``group_column``
    relates texts with one value in it (a row without one is related to none). With
    ``optional``, a file without the label or the group column has none (``None``)."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise UsageError(f"{path} has no rows")
    columns = list(dict.fromkeys(col for _, row in rows for col in row))
    if optional:
        label_column = label_column if label_column in columns else None
        group_column = group_column if group_column in columns else None
    for col in (text_column, label_column, group_column):
        if col is not None and col not in columns:
            raise UsageError(f"{path} has no column {col!r}; its columns are {', '.join(columns)}")

    def cell(n: int, row: dict, col: str, default: str | None = None) -> str:
        value = row.get(col)
        if default is not None and value in (None, ""):
            return default
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise UsageError(f"{path}:{n}: {col!r} is {'missing' if value is None else 'not text'}")
        return str(value)

    texts = [cell(n, r, text_column) for n, r in rows]
    labels = (
        None if label_column is None else [cell(n, r, label_column, missing_label) for n, r in rows]
    )
    related = (
        None if group_column is None else [cell(n, r, group_column, "") or None for n, r in rows]
    )
    return Examples(texts, labels, related)


def split_documents(examples: Examples, *, seed: int) -> tuple[Examples, Examples]:
    """A seeded half of the texts (with their labels and groups) and the other half,
    sharing no text, no sentence and no group (whole groups to either side,
    :mod:`overlap`).

    >>> one, rest = split_documents(Examples(list("abcd"), list("ABCD")), seed=0)
    >>> sorted(one.texts + rest.texts), [t.upper() for t in rest.texts] == rest.labels
    (['a', 'b', 'c', 'd'], True)
    """
    related = groups(examples.texts, examples.groups)
    first, second = split_by_group(np.arange(len(examples)), related, 0.5, seed)
    return examples.subset(first), examples.subset(second)
