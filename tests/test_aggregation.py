"""Aggregation strategies: how a document's label is combined, and when a partial
document is already decided (the cascade's early exit) under the same rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kascade.operators.aggregation import STRATEGIES
from kascade.schemas import Aggregation

TM = Aggregation.TOKEN_MEAN


def p(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64)


def decided(known: list[tuple[float, np.ndarray]], unknown: list[float], name: Aggregation):
    probs = np.stack([q for _, q in known]) if known else np.empty((0, 0))
    weights = np.asarray([w for w, _ in known], dtype=np.float64)
    return STRATEGIES[name].decided(probs, weights, unknown)


def test_every_name_in_the_contract_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(Aggregation)
    assert all(s.name is name for name, s in STRATEGIES.items())


@pytest.mark.parametrize(
    ("known", "unknown", "expected"),
    [
        ([(100, p(0.9, 0.1))], [], True),
        ([], [10], False),
        ([(100, p(0.9, 0.1))], [79], True),  # margin 80 > 79
        ([(100, p(0.9, 0.1))], [80], False),  # 80 could tie: not decided
        ([(50, p(0.6, 0.4)), (50, p(0.6, 0.4))], [19], True),  # margin 20
        ([(50, p(0.6, 0.4)), (50, p(0.6, 0.4))], [10, 10], False),
    ],
)
def test_token_mean_is_decided_only_when_the_worst_case_cannot_flip_it(known, unknown, expected):
    assert decided(known, unknown, TM) is expected


def test_majority_is_decided_when_the_unknown_votes_cannot_catch_up() -> None:
    known = [(1, p(0.9, 0.1, 0)), (1, p(0.8, 0.2, 0)), (1, p(0.7, 0.3, 0))]
    assert decided(known, [1, 1], Aggregation.MAJORITY)
    assert not decided(known, [1, 1, 1], Aggregation.MAJORITY)


def test_max_is_never_decided_while_a_chunk_is_unknown() -> None:
    assert not decided([(1, p(0.99, 0.01))], [1], Aggregation.MAX)
    assert decided([(1, p(0.99, 0.01))], [], Aggregation.MAX)


def test_majority_breaks_a_tie_by_the_token_weighted_mean() -> None:
    winner, scores = STRATEGIES[Aggregation.MAJORITY].combine(
        np.stack([p(0.9, 0.1), p(0.4, 0.6)]), np.array([10.0, 50.0])
    )
    assert (winner, scores) == (1, [0.5, 0.5])


_vec = st.lists(st.floats(0.01, 1.0), min_size=3, max_size=3).map(
    lambda xs: np.asarray(xs) / sum(xs)
)
_chunk = st.tuples(st.integers(1, 300).map(float), _vec)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(list(Aggregation)),
    known=st.lists(_chunk, min_size=1, max_size=6),
    unknown=st.lists(_chunk, min_size=1, max_size=3),
)
def test_a_decided_label_survives_whatever_the_unknown_chunks_say(name, known, unknown) -> None:
    """The early exit is sound: once ``decided``, completing the document with any
    answers for the missing chunks gives the label the known chunks already give."""
    strategy = STRATEGIES[name]
    kp, kw = np.stack([q for _, q in known]), np.asarray([w for w, _ in known])
    if not strategy.decided(kp, kw, [w for w, _ in unknown]):
        return
    leader = strategy.combine(kp, kw)[0]
    up, uw = np.stack([q for _, q in unknown]), np.asarray([w for w, _ in unknown])
    # The adversary's strongest move: every unknown chunk all-in on one rival.
    for rival in range(3):
        onehot = np.zeros_like(up)
        onehot[:, rival] = 1.0
        for answers in (up, onehot):
            full = strategy.combine(np.vstack([kp, answers]), np.concatenate([kw, uw]))[0]
            assert full == leader
