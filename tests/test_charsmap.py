"""The precompiled charsmap built from a replacement table: the ``tokenizers`` library's
own ``Precompiled`` normalizer applies exactly that table, on any text."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import normalizers

from kascade.toolchain.charsmap import precompiled_charsmap

# Characters that are graphemes on their own (the normalizer looks up whole graphemes
# first), from several scripts and byte lengths; no NUL (it ends a key in the trie).
ALPHABET = [
    c
    for c in map(
        chr,
        [
            *range(0x01, 0x250),
            *range(0x391, 0x3CA),
            *range(0x4E00, 0x4E40),
            *range(0xFF01, 0xFF5F),
            *range(0x1F600, 0x1F610),
        ],
    )
    if unicodedata.category(c)[0] not in "MC" or c in "\t\n\x07"
]
chars = st.sampled_from(ALPHABET)
tables = st.dictionaries(chars, st.text(alphabet=chars, max_size=3), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(table=tables, text=st.text(alphabet=chars, max_size=80))
def test_the_normalizer_replaces_exactly_the_tables_characters(table, text) -> None:
    n = normalizers.Precompiled(precompiled_charsmap(table))
    assert n.normalize_str(text) == "".join(table.get(c, c) for c in text)


@given(text=st.text(max_size=200))
def test_no_text_makes_the_normalizer_fail(text) -> None:
    # Any byte may follow a prefix in the trie; the reader must always land in the array.
    n = normalizers.Precompiled(precompiled_charsmap({"\uff21": "A", "\u00e9": "e", "\t": " "}))
    n.normalize_str(text.replace("\x00", ""))


def test_a_key_with_nul_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="NUL"):
        precompiled_charsmap({"\x00": ""})
