"""Chunking: windows cover every token with the configured overlap; chunks keep offsets."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kascade.operators.chunking import (
    ChunkLimitExceeded,
    SpecialTokens,
    chunk_text,
    windows,
)
from kascade.operators.encoder import load_tokenizer
from kascade.operators.items import Origin


@given(n=st.integers(0, 3000), size=st.integers(1, 600), data=st.data())
def test_windows_cover_every_item_with_exactly_the_overlap(n: int, size: int, data) -> None:
    overlap = data.draw(st.integers(0, size - 1))
    spans = windows(n, size=size, overlap=overlap)
    if n == 0:
        assert spans == []
        return
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(0 < b - a <= size for a, b in spans)
    for (a1, b1), (a2, _) in itertools.pairwise(spans):
        assert b1 - a2 == overlap  # consecutive windows share exactly `overlap` items
        assert a2 > a1  # and always move forward


def test_a_text_that_fits_is_one_window() -> None:
    assert windows(5, size=5, overlap=2) == [(0, 5)]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_impossible_window_settings_are_rejected(size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        windows(10, size=size, overlap=overlap)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_models import save_tokenizer

    d = tmp_path_factory.mktemp("tok")
    save_tokenizer(d)
    return load_tokenizer(d / "tokenizer.json")


def test_special_tokens_are_read_from_the_tokenizer_template(tokenizer) -> None:
    specials = SpecialTokens.of(tokenizer)
    assert specials.prefix == (tokenizer.token_to_id("[CLS]"),)
    assert specials.suffix == (tokenizer.token_to_id("[SEP]"),)


def test_every_chunk_has_special_tokens_and_fits_the_budget(tokenizer) -> None:
    text = " ".join(f"the team won the cup final number {i}" for i in range(60))
    chunks = chunk_text(text, tokenizer, max_tokens=32, overlap=4, max_chunks=100)
    assert len(chunks) > 5
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    for i, c in enumerate(chunks):
        assert c.index == i
        assert c.n_tokens <= 32
        assert c.ids[0] == cls and c.ids[-1] == sep
        assert cls not in c.ids[1:-1]
    content = tokenizer.encode(text, add_special_tokens=False).ids
    rebuilt = list(chunks[0].ids[1:-1])
    for c in chunks[1:]:
        rebuilt += list(c.ids[1 + 4 : -1])  # drop the 4 overlapping tokens
    assert rebuilt == content


def test_character_offsets_point_at_the_chunk_text(tokenizer) -> None:
    text = "The striker scored twice. " * 30
    for c in chunk_text(text, tokenizer, max_tokens=16, overlap=2, max_chunks=100):
        piece = text[c.start_char : c.end_char].lower()
        assert tokenizer.encode(piece, add_special_tokens=False).ids == list(c.ids[1:-1])


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_and_whitespace_text_has_no_chunks(tokenizer, text: str) -> None:
    assert chunk_text(text, tokenizer, max_tokens=32, overlap=4, max_chunks=5) == []


def test_too_many_chunks_is_an_error_not_a_silent_truncation(tokenizer) -> None:
    with pytest.raises(ChunkLimitExceeded, match="the limit is 3"):
        chunk_text("the team won " * 100, tokenizer, max_tokens=16, overlap=0, max_chunks=3)


def test_a_saved_truncation_setting_does_not_cut_documents(tmp_path) -> None:
    from tiny_models import save_tokenizer
    from tokenizers import Tokenizer

    save_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.enable_truncation(8)
    tok.save(str(tmp_path / "tokenizer.json"))
    chunks = chunk_text(
        "the team won the cup " * 20,
        load_tokenizer(tmp_path / "tokenizer.json"),
        max_tokens=16,
        overlap=0,
        max_chunks=50,
    )
    assert sum(c.n_tokens - 2 for c in chunks) == 100


class RustPanic(BaseException):
    """What pyo3 raises when a tokenizer's Rust code panics: not an Exception."""


class PanickingTokenizer:
    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def encode(self, *args, **kwargs):
        raise RustPanic("index out of bounds: the len is 9854 but the index is 9855")


def test_a_tokenizer_that_panics_dead_letters_the_record_instead_of_stopping_the_job(
    tokenizer,
) -> None:
    from kascade.operators.chunking import split
    from kascade.operators.validate import Received
    from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, SourcePosition
    from kascade.schemas.settings import ChunkSettings

    doc = InputDocument(id="d", text="any text")
    r = Received(
        doc,
        Origin(SourcePosition(topic="in", partition=0, offset=3), doc.model_dump_json().encode()),
    )
    specials = SpecialTokens.of(tokenizer)
    (dead,) = split(r, PanickingTokenizer(tokenizer), specials, ChunkSettings(), stage="chunk")
    assert isinstance(dead, DeadLetter)
    assert dead.reason is DeadLetterReason.PROCESSING
    assert dead.detail.startswith("RustPanic: index out of bounds")
