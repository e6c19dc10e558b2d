"""The sequential test of a certified bound on its audits, and what it judges.

Every audited chunk (a settled chunk the full model also classified) is a Bernoulli
draw: the cheap stages disagreed with the full model, or not. The calibration certified
that the rate is at most epsilon. :class:`BoundTest` tests that claim with a mixture of
likelihood ratios, one per alternative rate above epsilon (1.5x to 10x):

    E_n = mean_j  prod_i (q_j / eps)^x_i ((1 - q_j) / (1 - eps))^(1 - x_i)

Under any rate <= epsilon each product is a nonnegative supermartingale (a draw's
expected factor is p q_j / eps + (1 - p)(1 - q_j)/(1 - eps) <= 1, rising in p to 1 at
p = eps), so their mean is too, and by Ville's inequality E_n ever reaching 1/delta has
probability at most delta: the test is valid however long the job runs and however often
it is looked at (an anytime-valid e-process; a fixed-sample test would not be). Under a
rate of 3 x epsilon it reaches 1/delta after about ln(n_alternatives / delta) / KL audits
(~180 at epsilon 0.02, delta 0.05).

>>> t = BoundTest(epsilon=0.02, delta=0.05)
>>> any(t.observe(False) for _ in range(10_000))  # a stream that always agrees
False
>>> t = BoundTest(epsilon=0.02, delta=0.05)
>>> fired = [t.observe(i % 10 == 0) for i in range(1000)]  # 10% disagree: 5 x epsilon
>>> fired.index(True) < 200, t.fired_at is not None
(True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kascade.schemas import suspensions
from kascade.schemas.cascade import LENGTHS, POOL

# Alternatives the mixture bets on, as multiples of epsilon: a small drift is detected
# later, a large one sooner; equal weights.
MULTIPLES = (1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass
class BoundTest:
    """H0: the cheap stages disagree with the full model on at most ``epsilon`` of the
    settled chunks; fires (once) when H0 is rejected at level ``delta``."""

    epsilon: float
    delta: float
    audits: int = 0
    disagreements: int = 0
    fired_at: int | None = None  # the audit count when it fired
    _log_lr: list[float] = field(default_factory=list, repr=False)
    _alternatives: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.epsilon < 1 or not 0 < self.delta < 1:
            raise ValueError("epsilon and delta must be in (0, 1)")
        self._alternatives = sorted({min(m * self.epsilon, 0.999) for m in MULTIPLES})
        self._alternatives = [q for q in self._alternatives if q > self.epsilon]
        self._log_lr = [0.0] * len(self._alternatives)

    def observe(self, disagree: bool) -> bool:
        """Count one audit; True only on the audit at which the test fires."""
        self.audits += 1
        self.disagreements += disagree
        for j, q in enumerate(self._alternatives):
            if disagree:
                self._log_lr[j] += math.log(q / self.epsilon)
            else:
                self._log_lr[j] += math.log((1 - q) / (1 - self.epsilon))
        if self.fired_at is None and self.log_evidence() >= math.log(1 / self.delta):
            self.fired_at = self.audits
            return True
        return False

    def log_evidence(self) -> float:
        """log E_n, the mixture's log likelihood ratio (>= log(1/delta): rejected)."""
        top = max(self._log_lr)
        mean = sum(math.exp(v - top) for v in self._log_lr) / len(self._log_lr)
        return top + math.log(mean)

    @property
    def rate(self) -> float:
        return self.disagreements / self.audits if self.audits else 0.0

    @property
    def violated(self) -> bool:
        return self.fired_at is not None


# Where the languages past ``max_languages`` are pooled, in the tests and the metrics.
OTHER = POOL  # the calibration's pool stratum is tested as one too
# The overall test's name in the metrics, and the scope of its violation: every language.
# A record's own "all" or "other" (valid tag shapes) is tested in the pool.
EVERYTHING = "all"
STOP = suspensions.STOP  # the document stop's test, and the scope of its violation


@dataclass
class Watch:
    """The bound watched over all audits and per language (a drift in one language is
    named even while the others hide it in the total).

    The overall test gets half of ``delta``; the other half is split evenly between the
    first ``max_languages`` languages the stream brings and one pool for the rest
    (:data:`OTHER`), so the chance of any false alarm stays at most ``delta`` and the
    tests, like the metric series, stay bounded whatever a producer writes in ``lang``.

    >>> w = Watch(epsilon=0.02, delta=0.05, max_languages=2)
    >>> for lang in ["en", "de", "fr", "sw", "en"]:
    ...     _ = w.observe(False, lang)
    >>> sorted(w.languages), w.languages["other"].audits, w.languages["en"].delta
    (['de', 'en', 'other'], 2, 0.008333333333333333)
    """

    epsilon: float
    delta: float
    max_languages: int = 16
    judging: str | None = None  # the sha256 of the cascade.json whose bound it tests
    overall: BoundTest = field(init=False)
    languages: dict[str, BoundTest] = field(default_factory=dict)
    # The certified document stop's own test, at its epsilon and delta: each stopped
    # document read to its end by the full model counts in it. None: no stop to test.
    stop: BoundTest | None = None

    def __post_init__(self) -> None:
        self.overall = BoundTest(self.epsilon, self.delta / 2)

    def tested_as(self, lang: str) -> str:
        """The test ``lang``'s audits count in: its own, or the pool."""
        named = len(self.languages) - (OTHER in self.languages)
        if lang not in (OTHER, EVERYTHING) and (
            lang in self.languages or named < self.max_languages
        ):
            return lang
        return OTHER

    def observe(self, disagree: bool, lang: str | None) -> BoundTest | None:
        """Count one audit; the test that fired on it, if one did (overall first)."""
        fired = None
        if self.overall.observe(disagree):
            fired = self.overall
        if lang is not None:
            key = self.tested_as(lang)
            test = self.languages.get(key)
            if test is None:
                share = self.delta / 2 / (self.max_languages + 1)
                test = self.languages[key] = BoundTest(self.epsilon, share)
            if test.observe(disagree) and fired is None:
                fired = test
        return fired

    @property
    def violated(self) -> bool:
        return self.overall.violated or any(t.violated for t in self.languages.values())

    def named(self) -> set[str]:
        """The languages tested on their own (not in the pool)."""
        return set(self.languages) - {OTHER}


def described(scope: str) -> str:
    """A test's scope in words: a language, a length of document, or both.

    >>> described("sw"), described("short"), described("de/long"), described(STOP)
    ('language sw', 'short documents', 'long documents in language de', 'the document stop')
    """
    if scope == STOP:
        return "the document stop"
    lang, _, length = scope.rpartition("/")
    if length in LENGTHS:
        return f"{length} documents" + (f" in language {lang}" if lang else "")
    return f"language {scope}"
