"""The statistics a calibration certifies with: exact binomial tests of "disagreement >
epsilon", walked over candidates fixed in advance (fixed-sequence testing, as in
Learn-then-Test), and the Clopper-Pearson bound reported with the result.

Chunk thresholds (:mod:`kascade.toolchain.calibrate`) and the document stop
(:mod:`kascade.toolchain.document_stop`) are certified by the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from scipy.stats import beta, binom

from kascade.errors import UsageError
from kascade.toolchain import ToolchainError

T = TypeVar("T")
DISABLED = 1.01  # a threshold no probability reaches


class CalibrationTooSmall(ToolchainError, UsageError):
    """The calibration set cannot certify the requested guarantee."""


def min_accepted(epsilon: float, delta: float) -> int:
    """Accepted chunks needed to certify ``epsilon`` at ``delta`` with zero disagreements.

    >>> min_accepted(0.01, 0.05), min_accepted(0.02, 0.05)
    (299, 149)
    """
    if not (0 < epsilon < 1 and 0 < delta < 1):
        raise ValueError(f"epsilon and delta must be between 0 and 1, not {epsilon}, {delta}")
    return math.ceil(math.log(delta) / math.log(1 - epsilon))


def p_value(disagreements: int, accepted: int, epsilon: float) -> float:
    """P(at most this many disagreements | true rate = epsilon): small rejects "rate > epsilon"."""
    return float(binom.cdf(disagreements, accepted, epsilon)) if accepted else 1.0


def upper_bound(disagreements: int, accepted: int, delta: float) -> float:
    """One-sided Clopper-Pearson upper bound on the disagreement rate at confidence 1 - delta."""
    if accepted == 0:
        return 1.0
    if disagreements >= accepted:
        return 1.0
    return float(beta.ppf(1 - delta, disagreements + 1, accepted - disagreements))


def certify_sequence(
    candidates: Sequence[T],
    outcome: Callable[[T], tuple[int, int]],
    epsilon: float,
    delta: float,
) -> tuple[T, int, int] | None:
    """Fixed-sequence test over ``candidates`` (most conservative first).

    ``outcome(c)`` gives (accepted, disagreements) on the certification split at ``c``.
    Returns the last candidate whose "disagreement > epsilon" was rejected at ``delta``,
    with its counts, or ``None``.

    A candidate that accepts too few items for any test to reject (fewer than
    :func:`min_accepted`, whatever the disagreements) is passed over rather than ending
    the sequence: which candidates are passed over depends only on the counts accepted,
    and given those counts the first candidate actually tested is rejected wrongly with
    probability at most ``delta``, so the guarantee stands.
    """
    best = None
    untestable_below = min_accepted(epsilon, delta)
    for c in candidates:
        n, k = outcome(c)
        if n < untestable_below and best is None:
            continue
        if p_value(k, n, epsilon) > delta:
            break
        best = (c, n, k)
    return best


def certify(
    thresholds: list[float],
    outcome: Callable[[float], tuple[int, int]],
    epsilon: float,
    delta: float,
) -> tuple[float, int, int]:
    """:func:`certify_sequence` over confidence thresholds; ``DISABLED`` when none holds."""
    return certify_sequence(thresholds, outcome, epsilon, delta) or (DISABLED, 0, 0)
