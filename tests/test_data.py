"""Reading the toolchain's data files: every row is checked, a bad one is named by its
line, and a long document in a CSV field is read whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kascade.errors import UsageError
from kascade.toolchain.data import read_examples, split_documents


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


def test_a_group_column_relates_rows_and_the_halves_never_split_a_group(tmp_path: Path) -> None:
    # Translations of one text share a group; a row without one is related to none.
    rows = [{"text": f"text {i} in language {lang}", "src": f"s{i}"} for i in range(20)
            for lang in ("de", "fr", "sw")]  # fmt: skip
    rows += [{"text": "unrelated one"}, {"text": "unrelated two", "src": ""}]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_examples(path, label_column=None, group_column="src")
    assert got.groups is not None
    assert got.groups[:3] == ["s0"] * 3 and got.groups[-2:] == [None, None]
    one, other = split_documents(got, seed=3)
    assert len(one) + len(other) == len(rows)
    assert one.groups is not None and other.groups is not None
    assert not {g for g in one.groups if g} & {g for g in other.groups if g}
    assert all(one.groups.count(g) == 3 for g in one.groups if g)
    # Without the column: an error where it must be there, none where it is optional.
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "a"}\n')
    with pytest.raises(UsageError, match="has no column 'src'"):
        read_examples(plain, label_column=None, group_column="src")
    assert read_examples(plain, label_column=None, group_column="src", optional=True).groups is None
