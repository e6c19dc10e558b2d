"""Strata: the kinds of text a calibration certifies apart (language, document length), so
that a stream whose mix moves between them keeps its bound.

One certificate on the pooled chunks bounds disagreement on text mixed as the
calibration's was; a stream of only short documents, or of one language, may fall where
the cheap stages do worse, and the live test then suspends everything. Certified per
stratum, each at its share of delta (Bonferroni: all hold together with probability at
least 1 - delta), the bound holds for any mix of the strata, each drawn like its
calibration chunks.

A kind of text (a language and a length, :func:`~kascade.schemas.cascade.length_of`)
stands alone where the calibration holds enough of its certification chunks; a
language's small lengths stand together where they are enough together; the rest is the
pool (:data:`~kascade.schemas.cascade.POOL`), which also serves kinds the calibration
never held: certified on the rest where that is enough, else on every certification
chunk (the calibration's mix, as one certificate did before). Which strata stand alone
depends on the counts only, never on how the cheap stages did on them, so choosing
costs the guarantee nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kascade.operators.bound import EVERYTHING
from kascade.schemas.cascade import (
    ANY_LANGUAGE,
    LENGTHS,
    POOL,
    UNDETERMINED,
    Stratum,
    length_of,
    stratum_in,
)
from kascade.toolchain.certify import certify, min_accepted, upper_bound

# Languages that never stand alone: the pool's name, the live test's name for everything,
# and the mark of a stratum of any language would all mean something else as a stratum.
RESERVED = {POOL, EVERYTHING}

# A kind of text stands alone with this many times the fewest accepted chunks its test
# needs (fewer and it would likely certify nothing: its chunks would all go to the full
# model).
STAND_ALONE = 3


@dataclass(frozen=True)
class Planned:
    """A stratum before its test: what it covers and its certification chunks."""

    name: str
    languages: tuple[str, ...]  # (): the pool
    lengths: tuple[str, ...]
    members: np.ndarray  # bool, over the certification chunks


def chunk_kinds(
    languages: Sequence[str] | None, source: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk's language (:data:`ANY_LANGUAGE` where the texts name none) and its
    text's length, from the index of the text each chunk came from.

    >>> langs, lengths = chunk_kinds(["de", "ja"], np.array([0, 1, 1]))
    >>> langs.tolist(), lengths.tolist()
    (['de', 'ja', 'ja'], ['short', 'long', 'long'])
    """
    per_text = np.bincount(source)
    lengths = np.array([length_of(int(n)) for n in per_text[source]], dtype=object)
    if languages is None:
        return np.full(len(source), ANY_LANGUAGE, dtype=object), lengths
    # A text's own "*" does not mean every language: it goes to the pool, as at run time.
    named = [POOL if lang == ANY_LANGUAGE else lang or UNDETERMINED for lang in languages]
    return np.asarray(named, dtype=object)[source], lengths


def plan(langs: np.ndarray, lengths: np.ndarray, epsilon: float, delta: float) -> list[Planned]:
    """The strata of certification chunks of these languages and lengths, the pool last.

    >>> langs = np.array(["de"] * 2000 + ["sw"] * 50, dtype=object)
    >>> lengths = np.array(["long"] * 1000 + ["short"] * 1000 + ["long"] * 50, dtype=object)
    >>> [(p.name, int(p.members.sum())) for p in plan(langs, lengths, 0.02, 0.05)]
    [('de/short', 1000), ('de/long', 1000), ('other', 2050)]
    >>> [p.name for p in plan(langs[:1100], lengths[:1100], 0.02, 0.05)]  # one kind, mostly
    ['other']
    """
    cells = {(str(a), str(b)) for a, b in zip(langs.tolist(), lengths.tolist(), strict=True)}
    bar = STAND_ALONE * min_accepted(epsilon, delta / (len(cells) + 1))
    out: list[Planned] = []
    left = np.ones(len(langs), dtype=bool)
    for lang in sorted({a for a, _ in cells} - RESERVED):
        mine = langs == lang
        small = []
        for length in LENGTHS:
            cell = mine & (lengths == length)
            if cell.sum() >= bar:
                out.append(Planned(_named(lang, (length,)), (lang,), (length,), cell))
                left &= ~cell
            elif cell.any():
                small.append(length)
        together = mine & np.isin(lengths, small)
        if len(small) > 1 and together.sum() >= bar:
            out.append(Planned(_named(lang, tuple(small)), (lang,), tuple(small), together))
            left &= ~together
    everything = np.ones(len(langs), dtype=bool)
    if left.sum() >= bar:
        return [*out, Planned(POOL, (), LENGTHS, left)]
    if len(out) <= 1:  # one kind and a few others: the mix is all there is to certify
        return [Planned(POOL, (), LENGTHS, everything)]
    return [*out, Planned(POOL, (), LENGTHS, everything)]


def _named(lang: str, lengths: tuple[str, ...]) -> str:
    where = "" if lang == ANY_LANGUAGE else lang
    if len(lengths) == len(LENGTHS):
        return where or "all lengths"
    return f"{where}/{lengths[0]}" if where else lengths[0]


Outcome = Callable[[float, np.ndarray], tuple[int, int]]


def certify_strata(
    planned: list[Planned],
    outcome: Outcome,
    path: Sequence[float],
    epsilon: float,
    delta: float,
    s0_of: Callable[[float], float],
) -> list[Stratum]:
    """Each planned stratum certified on its own chunks at ``delta / len(planned)``:
    ``outcome(t, members)`` is (accepted, disagreements) at S1 threshold ``t``; a stratum
    no threshold certifies goes to the full model (its thresholds disabled)."""
    share = delta / len(planned)
    out = []
    for p in planned:
        at = functools.partial(_at, outcome, p)
        t, accepted, wrong = certify(list(path), at, epsilon, share)
        out.append(
            Stratum(
                name=p.name,
                languages=list(p.languages),
                lengths=list(p.lengths),
                threshold_s0=s0_of(t),
                threshold_s1=t,
                delta=share,
                certify=int(p.members.sum()),
                accepted=accepted,
                disagreements=wrong,
                upper_bound_at_delta=upper_bound(wrong, accepted, share),
            )
        )
    return out


def _at(outcome: Outcome, planned: Planned, t: float) -> tuple[int, int]:
    return outcome(t, planned.members)


def thresholds_of(
    strata: list[Stratum], langs: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """S0's and S1's thresholds for each chunk of these kinds, by the stratum covering it."""
    kinds = list(zip(langs.tolist(), lengths.tolist(), strict=True))
    found = {k: stratum_in(strata, *k) for k in set(kinds)}
    return (
        np.array([found[k].threshold_s0 for k in kinds]),
        np.array([found[k].threshold_s1 for k in kinds]),
    )
