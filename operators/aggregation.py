"""How chunk probabilities become one document label: one object per named strategy.

A strategy answers two questions about the same rule, so they cannot drift apart: how
the chunks of a complete document combine (:meth:`Strategy.combine`), and whether a
partial document's label is already decided whatever its missing chunks turn out to
say (:meth:`Strategy.decided`, the cascade's document-level early exit).

The names are the contract's :class:`~kascade.schemas.Aggregation` (settings, flags and
output records read them there); :data:`STRATEGIES` must cover every name, which is
checked when this module is imported.

>>> p = np.array([[0.9, 0.1], [0.2, 0.8]])
>>> STRATEGIES[Aggregation.TOKEN_MEAN].combine(p, np.array([30.0, 10.0]))
(0, [0.725, 0.275])
>>> STRATEGIES[Aggregation.TOKEN_MEAN].decided(p[:1], np.array([100.0]), [30.0])
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from kascade.schemas import Aggregation


class Strategy(ABC):
    """A closed rule from chunk probabilities (``chunks x labels``) and token weights."""

    name: Aggregation

    @abstractmethod
    def combine(self, probs: np.ndarray, weights: np.ndarray) -> tuple[int, list[float]]:
        """The winning label's index and a score per label (summing to 1)."""

    @abstractmethod
    def decided(self, probs: np.ndarray, weights: np.ndarray, unknown: Sequence[float]) -> bool:
        """True when no answer for the ``unknown`` chunks (their token weights) can change
        the label that ``combine`` would give; each may be any probability vector."""


def _token_mean(probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (probs * weights[:, None]).sum(axis=0) / weights.sum()


def lead(values: np.ndarray) -> float:
    """How far the top value is ahead of the next one."""
    top = int(values.argmax())
    return float(values[top] - np.delete(values, top).max())


class TokenMean(Strategy):
    """Mean of the probabilities weighted by chunk tokens (the default)."""

    name = Aggregation.TOKEN_MEAN

    def combine(self, probs: np.ndarray, weights: np.ndarray) -> tuple[int, list[float]]:
        mean = _token_mean(probs, weights)
        return int(mean.argmax()), mean.tolist()

    def decided(self, probs: np.ndarray, weights: np.ndarray, unknown: Sequence[float]) -> bool:
        if not unknown:
            return True
        if len(probs) == 0:
            return False
        # Worst case: every unknown chunk puts all its weight on the strongest rival.
        return lead((probs * weights[:, None]).sum(axis=0)) > sum(unknown)


class Max(Strategy):
    """The label of the single most confident chunk."""

    name = Aggregation.MAX

    def combine(self, probs: np.ndarray, weights: np.ndarray) -> tuple[int, list[float]]:
        peak = probs.max(axis=0)
        scores = peak / peak.sum()
        return int(scores.argmax()), scores.tolist()

    def decided(self, probs: np.ndarray, weights: np.ndarray, unknown: Sequence[float]) -> bool:
        # An unknown chunk can always be the single most confident one.
        return not unknown


class Majority(Strategy):
    """Most chunk votes; ties go to the higher token-weighted mean."""

    name = Aggregation.MAJORITY

    def combine(self, probs: np.ndarray, weights: np.ndarray) -> tuple[int, list[float]]:
        votes = np.bincount(probs.argmax(axis=1), minlength=probs.shape[1]).astype(np.float64)
        tied = np.flatnonzero(votes == votes.max())
        winner = int(tied[np.argmax(_token_mean(probs, weights)[tied])])
        return winner, (votes / votes.sum()).tolist()

    def decided(self, probs: np.ndarray, weights: np.ndarray, unknown: Sequence[float]) -> bool:
        if not unknown:
            return True
        if len(probs) == 0:
            return False
        votes = np.bincount(probs.argmax(axis=1), minlength=probs.shape[1]).astype(np.float64)
        return lead(votes) > len(unknown)


STRATEGIES: dict[Aggregation, Strategy] = {s.name: s for s in (TokenMean(), Max(), Majority())}

_missing = set(Aggregation) - set(STRATEGIES)
if _missing:  # a name in the contract with no rule behind it
    raise ImportError(f"aggregation strategies without an implementation: {sorted(_missing)}")
