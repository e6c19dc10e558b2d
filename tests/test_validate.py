"""Decoding input records: valid documents pass, everything else becomes a dead letter."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kascade.operators.formats import Read
from kascade.operators.items import Origin
from kascade.operators.validate import decode
from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, SourcePosition

POS = SourcePosition(topic="in", partition=1, offset=42)


def _decode(raw: bytes | None, max_bytes: int = 1000) -> InputDocument | DeadLetter:
    out = decode(Origin(POS, raw, b"k", timestamp_ms=5), max_bytes=max_bytes)
    return out.doc if isinstance(out, Read) else out


def test_a_valid_record_becomes_a_document_with_its_optional_fields() -> None:
    doc = _decode(b'{"id": "d", "text": "t", "lang": "fr", "metadata": {"a": [1]}}')
    assert doc == InputDocument(id="d", text="t", lang="fr", metadata={"a": [1]})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, DeadLetterReason.EMPTY),
        (b"", DeadLetterReason.EMPTY),
        (b"\xc3\x28", DeadLetterReason.NOT_UTF8),
        (b"{not json", DeadLetterReason.NOT_JSON),
        (b'["a list"]', DeadLetterReason.SCHEMA),
        (b'{"id": "d"}', DeadLetterReason.SCHEMA),
        (b'{"id": 7, "text": "t"}', DeadLetterReason.SCHEMA),
        (b'{"id": "d", "text": "t", "colour": "red"}', DeadLetterReason.SCHEMA),
        (json.dumps({"id": "d", "text": "x" * 2000}).encode(), DeadLetterReason.OVERSIZE),
    ],
)
def test_each_kind_of_bad_record_is_dead_lettered_with_its_reason(
    raw: bytes | None, reason: DeadLetterReason
) -> None:
    out = _decode(raw)
    assert isinstance(out, DeadLetter)
    assert out.reason == reason
    assert out.source == POS
    assert out.original_key() == b"k"
    assert out.timestamp_ms == 5


def test_a_schema_violation_names_the_offending_field() -> None:
    out = _decode(b'{"id": "d", "text": 3}')
    assert isinstance(out, DeadLetter)
    assert out.detail.startswith("text:")


def test_the_size_limit_is_checked_on_bytes_before_parsing() -> None:
    raw = json.dumps({"id": "d", "text": "é" * 60}).encode()
    assert isinstance(_decode(raw, max_bytes=len(raw)), InputDocument)
    assert _decode(raw, max_bytes=len(raw) - 1).reason == DeadLetterReason.OVERSIZE


@given(raw=st.binary(max_size=200))
def test_decoding_never_raises_and_a_dead_letter_keeps_the_exact_bytes(raw: bytes) -> None:
    out = _decode(raw)
    if isinstance(out, DeadLetter):
        assert out.original() == raw
