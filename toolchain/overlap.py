"""Text that the heads learn from must share nothing with the text that certifies them.

A certificate is a statement about text the heads have not seen. Corpora repeat
sentences across documents (SIB-200's documents are assembled from shared sentences,
scraped pages repeat boilerplate), and a chunk-level split puts the chunks of one
document, or two documents with one sentence, on both sides: the heads then settle
certification chunks they have in effect seen, and the certified figure is optimistic on
held-out text (docs/BENCHMARKS.md section 14). So calibration splits *groups* of texts:
texts that share a sentence (after normalization: case, digits, punctuation and spacing
ignored) are one group, and a group goes wholly to fitting or wholly to certifying.

>>> groups(["The cat sat on the mat today.", "A dog. THE CAT SAT ON THE MAT, TODAY!", "x"])
[0, 0, 2]
>>> groups(["Le chat dort.", "x", "The cat sleeps."], related=["s1", "s2", "s1"])  # translations
[0, 1, 0]
>>> shared(["Rain is expected over the weekend."], ["rain is expected over the weekend"])
(1, 1)
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Hashable

import numpy as np

# Sentence ends in the scripts kascade is measured on (Latin, CJK, Devanagari, Arabic).
_SENTENCE_END = re.compile(r"(?<=[.!?;\u3002\uff01\uff1f\u0964\u061f])\s*|\n+")
_NOT_WORD = re.compile(r"[\W\d_]+")
# Shorter normalized sentences ("Yes.", "Read more") repeat by chance, not by copying.
MIN_CHARS = 20


def sentence_keys(text: str) -> set[bytes]:
    """Hashes of the normalized sentences of ``text`` long enough to mean copying."""
    keys = set()
    for sentence in _SENTENCE_END.split(text):
        norm = _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", sentence).casefold()).strip()
        if len(norm) >= MIN_CHARS:
            keys.add(hashlib.blake2b(norm.encode(), digest_size=12).digest())
    return keys


def groups(texts: list[str], related: list[Hashable] | None = None) -> list[int]:
    """For each text, its group: the smallest index of a text it is connected to through
    shared sentences, or through an equal ``related`` value (e.g. the id a parallel
    corpus gives a sentence and its translations), by union-find."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[Hashable, int] = {}
    for i, text in enumerate(texts):
        keys: set[Hashable] = set(sentence_keys(text))
        if related is not None:
            keys.add(("related", related[i]))
        for key in keys:
            j = first.setdefault(key, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(texts))]


def shared(these: list[str], those: list[str]) -> tuple[int, int]:
    """How many of ``these`` texts share a sentence with ``those``, and how many distinct
    sentences they share."""
    theirs = set().union(*(sentence_keys(t) for t in those)) if those else set()
    common: set[bytes] = set()
    texts = 0
    for text in these:
        both = sentence_keys(text) & theirs
        texts += bool(both)
        common |= both
    return texts, len(common)


def split_by_group(
    source: np.ndarray, text_groups: list[int], fit_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk indices to fit the heads on and to certify on (each in a seeded order): whole
    groups of texts (:func:`groups`) to one side, about ``fit_fraction`` of the
    chunks to fitting, so no text and no sentence is on both sides.

    >>> source = np.array([0, 0, 1, 2, 2, 3])  # the text of each chunk
    >>> fit, cert = split_by_group(source, [0, 1, 0, 3], 0.5, seed=0)  # texts 0, 2 share
    >>> sorted(source[fit].tolist()), sorted(source[cert].tolist())
    ([0, 0, 2, 2, 3], [1])
    """
    rng = np.random.default_rng(seed)
    group = np.asarray(text_groups)[source]
    fit_groups: set[int] = set()
    taken = 0
    for g in rng.permutation(np.unique(group)).tolist():
        if taken >= fit_fraction * len(source):
            break
        fit_groups.add(g)
        taken += int((group == g).sum())
    order = rng.permutation(len(source))
    in_fit = np.isin(group[order], list(fit_groups))
    return order[in_fit], order[~in_fit]
