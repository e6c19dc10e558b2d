"""Text that the heads learn from must share nothing with the text that certifies them.

A certificate is a statement about text the heads have not seen. Corpora repeat
sentences across documents (SIB-200's documents are assembled from shared sentences,
scraped pages repeat boilerplate), and a chunk-level split puts the chunks of one
document, or two documents with one sentence, on both sides: the heads then settle
certification chunks they have in effect seen, and the certified figure is optimistic on
held-out text (docs/BENCHMARKS.md section 14). So calibration splits *groups* of texts:
texts that share a sentence (after normalization: case, digits, punctuation and spacing
ignored) are one group, and a group goes wholly to fitting or wholly to certifying.
Between the separate inputs (``--texts``, ``--head-texts``, ``--documents``),
:func:`shared` also finds near-duplicates (the same sentence with a word, a name or a
date changed) and calibration names them with the counts. (Within one input the split
does not join near-duplicates: text made from templates, like the test corpus, would
collapse into a few groups; docs/BENCHMARKS.md section 21 measured the split as is.)

>>> groups(["The cat sat on the mat today.", "A dog. THE CAT SAT ON THE MAT, TODAY!", "x"])
[0, 0, 2]
>>> groups(["Le chat dort.", "x", "The cat sleeps."], related=["s1", "s2", "s1"])  # translations
[0, 1, 0]
>>> shared(["Rain is expected over the weekend."], ["rain is expected over the weekend"])
(1, 1)
>>> shared(["Heavy rain is expected over the long weekend in the north of the country."],
...        ["Heavy rain is expected over the long weekend in the south of the country."])
(1, 1)
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
from datasketch import MinHash, MinHashLSH

# Sentence ends in the scripts kascade is measured on (Latin, CJK, Devanagari, Arabic).
_SENTENCE_END = re.compile(r"(?<=[.!?;\u3002\uff01\uff1f\u0964\u061f])\s*|\n+")
_NOT_WORD = re.compile(r"[\W\d_]+")
# Shorter normalized sentences ("Yes.", "Read more") repeat by chance, not by copying.
MIN_CHARS = 20
# Near-duplicates: sentences whose character 5-grams overlap this much (Jaccard), as a
# copied sentence with a date, a name or a word changed does (one word of a 100-character
# sentence: about 0.8); unrelated sentences stay far below (~0.1).
SHINGLE_CHARS = 5
NEAR = 0.7
PERMUTATIONS = 64
# A sentence in this share of an input's texts (and in at least COMMON_TEXTS of them) is
# the furniture of its kind of text, not content: a mail's disclaimer, a site's chrome, a
# template's frame. A text of the stream carries it as often as a calibration text does,
# so having seen it is no advantage the stream lacks, and it relates no texts; joined
# through it, every text that opens with the same boilerplate was one group, a third of a
# calibration on one side of the split (docs/BENCHMARKS.md section 31). Content repeats in
# a few texts, far below this.
COMMON_SHARE = 0.03
COMMON_TEXTS = 10


def _words(text: str) -> str:
    """``text`` with case, digits, punctuation and spacing normalized away."""
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def sentences(text: str) -> list[str]:
    """The normalized sentences of ``text`` long enough to mean copying."""
    return [norm for norm in map(_words, _SENTENCE_END.split(text)) if len(norm) >= MIN_CHARS]


def _exact(sentence: str) -> bytes:
    return hashlib.blake2b(sentence.encode(), digest_size=12).digest()


def _shingles(sentence: str) -> list[bytes]:
    """Character shingles: the same in every script, spaced or not."""
    n = SHINGLE_CHARS
    return [sentence[i : i + n].encode() for i in range(max(1, len(sentence) - n + 1))]


def common(texts: Sequence[str]) -> frozenset[bytes]:
    """The sentences (their exact keys) in at least :data:`COMMON_SHARE` of ``texts`` and
    in at least :data:`COMMON_TEXTS` of them: boilerplate.

    >>> furniture = "Please read the forum rules before posting anything new."
    >>> posts = [f"{furniture} A post about {w} and nothing else." for w in "abcdefghij"]
    >>> common(posts) == {_exact(_words(furniture))}, common(posts[:9])
    (True, frozenset())
    """
    seen = Counter(key for text in texts for key in {_exact(s) for s in sentences(text)})
    least = max(COMMON_TEXTS, COMMON_SHARE * len(texts))
    return frozenset(k for k, n in seen.items() if n >= least)


class SentenceIndex:
    """The sentences seen so far, each with the text it came from, found again exactly
    or, with ``near``, nearly (MinHash over character shingles, LSH at Jaccard
    :data:`NEAR`); sentences in ``ignore`` (exact keys, :func:`common`) are passed over."""

    def __init__(self, near: bool = True, ignore: frozenset[bytes] = frozenset()) -> None:
        self._ignore = ignore
        self._exact: dict[bytes, int] = {}
        self._lsh = MinHashLSH(threshold=NEAR, num_perm=PERMUTATIONS) if near else None
        self._owner: dict[int, int] = {}  # LSH key -> text

    def match(self, text: str) -> tuple[set[int], int]:
        """The texts that hold a sentence of ``text`` (exactly or nearly), and how many of
        its sentences they hold."""
        owners: set[int] = set()
        found = 0
        for sentence, sketch in self._sketched(text):
            hits = self._hits(sentence, sketch)
            owners |= hits
            found += bool(hits)
        return owners, found

    def add(self, owner: int, text: str) -> set[int]:
        """Index the sentences of text ``owner``; the texts seen before that hold one."""
        owners: set[int] = set()
        for sentence, sketch in self._sketched(text):
            owners |= self._hits(sentence, sketch)
            if self._exact.setdefault(_exact(sentence), owner) == owner and sketch is not None:
                key = len(self._owner)
                self._owner[key] = owner
                self._near_index().insert(key, sketch)
        return owners - {owner}

    def _hits(self, sentence: str, sketch: MinHash | None) -> set[int]:
        hits = (
            set() if sketch is None else {self._owner[k] for k in self._near_index().query(sketch)}
        )
        exact = self._exact.get(_exact(sentence))
        return hits if exact is None else hits | {exact}

    def _near_index(self) -> MinHashLSH:
        assert self._lsh is not None  # a sketch is made only where there is one
        return self._lsh

    def _sketched(self, text: str) -> list[tuple[str, MinHash | None]]:
        found = [s for s in sentences(text) if _exact(s) not in self._ignore]
        if self._lsh is None:
            return [(s, None) for s in found]
        sketches = MinHash.bulk([_shingles(s) for s in found], num_perm=PERMUTATIONS, seed=1)
        return list(zip(found, sketches, strict=True))


def groups(
    texts: list[str], related: Sequence[Hashable | None] | None = None, *, by_sentence: bool = True
) -> list[int]:
    """For each text, its group: the smallest index of a text it is connected to through
    shared sentences (with ``by_sentence``, boilerplate aside: :func:`common`; else only
    the same text, case, digits,
    punctuation and spacing aside, as a template's copies are), or through an
    equal ``related`` value (e.g. the id a parallel corpus gives a sentence and its
    translations; ``None`` relates to nothing), by union-find.

    >>> groups(["A long first sentence here. Same tail.", "a long first sentence here"],
    ...        by_sentence=False)
    [0, 1]
    >>> groups(["Same text, twice.", "same  TEXT twice", "x"], [None, None, "s"], by_sentence=False)
    [0, 0, 2]
    """
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    index = SentenceIndex(near=False, ignore=common(texts) if by_sentence else frozenset())
    first: dict[Hashable, int] = {}
    for i, text in enumerate(texts):
        if by_sentence:
            for j in index.add(i, text):
                join(i, j)
        else:
            join(i, first.setdefault(("text", _exact(_words(text))), i))
        if related is not None and related[i] is not None:
            join(i, first.setdefault(("related", related[i]), i))
    return [root(i) for i in range(len(texts))]


def shared(these: list[str], those: list[str]) -> tuple[int, int]:
    """How many of ``these`` texts share a sentence (exactly or nearly) with ``those``,
    and how many of their sentences do; boilerplate of either (:func:`common`) aside."""
    index = SentenceIndex(ignore=common(these) | common(those))
    for i, text in enumerate(those):
        index.add(i, text)
    texts = sentences_shared = 0
    for text in these:
        owners, found = index.match(text)
        texts += bool(owners)
        sentences_shared += found
    return texts, sentences_shared


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
