"""Reading the toolchain's data files: every row is checked, a bad one is named by its
line, and a long document in a CSV field is read whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from kascade.errors import UsageError
from kascade.toolchain.data import read_examples


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("rows.jsonl", '"just a string"\n', "rows.jsonl:1: a row is a JSON object, not str"),
        (
            "rows.jsonl",
            '{"text": "a", "label": "x"}\n\n{"label": "y"}\n',
            "rows.jsonl:3: 'text' is missing",
        ),
        (
            "rows.jsonl",
            '{"text": "a", "label": "x"}\n{"text": ["a"], "label": "y"}\n',
            "rows.jsonl:2: 'text' is not text",
        ),
        ("rows.tsv", "text\tlabel\nhello\tx\nshort\n", "rows.tsv:3: 'label' is missing"),
        ("rows.jsonl", '{"text": "a", "label": null}\n', "rows.jsonl:1: 'label' is missing"),
    ],
)
def test_a_bad_row_is_named_by_its_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(UsageError, match=message):
        read_examples(tmp_path / name)


def test_a_csv_field_longer_than_the_csv_default_limit_is_read_whole(tmp_path: Path) -> None:
    text = "word " * 60_000  # 300,000 characters: csv refuses more than 131,072 by default
    (tmp_path / "long.csv").write_text(f'text,label\n"{text}",x\n')
    assert read_examples(tmp_path / "long.csv").texts == [text]


def test_numbers_are_read_as_text(tmp_path: Path) -> None:
    (tmp_path / "n.jsonl").write_text('{"text": "a", "label": 3}\n')
    assert read_examples(tmp_path / "n.jsonl").labels == ["3"]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        # what kascade sample writes: no lang key where the record named none
        ("s.jsonl", '{"text": "a"}\n{"text": "b", "lang": "de"}\n{"text": "c", "lang": null}\n'),
        ("s.tsv", "text\tlang\na\t\nb\tde\nc\t\n"),
    ],
)
def test_rows_without_a_language_count_as_undetermined_when_a_default_is_given(
    tmp_path: Path, name: str, content: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    got = read_examples(path, label_column="lang", missing_label="und")
    assert (got.texts, got.labels) == (["a", "b", "c"], ["und", "de", "und"])
    if name.endswith(".jsonl"):
        with pytest.raises(UsageError, match="'lang' is missing"):
            read_examples(path, label_column="lang")  # a label that must be there


def test_a_column_is_found_in_any_row_not_only_the_first(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b", "lang": "de"}\n')
    with pytest.raises(UsageError, match="has no column 'language'; its columns are text, lang"):
        read_examples(path, label_column="language", missing_label="und")
