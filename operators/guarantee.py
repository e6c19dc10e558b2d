"""The certified bound, checked while the job runs: a sequential test on the audits.

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

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from kascade.operators import metrics
from kascade.schemas import suspensions
from kascade.schemas.cascade import LENGTHS, POOL

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Shared:
    """Where the job keeps its suspensions (the recovery directory) and the calibration
    they are about: a restarted process keeps them, and every process adopts the others'."""

    recovery_dir: Path
    cascade_sha256: str


@dataclass
class Guard:
    """A process's part in watching the bound, and what a violation does: one line per
    test that fires, the gauge, and (``suspend``) the full model for the chunks in the
    scope the test covers from then on: one language's test fired, that language (or the
    pool of the rest) goes to the full model while the others keep their cascade; the
    overall test fired, every chunk does. The job never stops for it and no record is lost.

    The job has one test (``watch``), kept by the flow as state (:meth:`resume`): every
    audit reaches it on one worker, and a restart resumes it where the last snapshot
    left it. With ``shared``, suspensions outlive the process and reach the job's other
    processes (:mod:`kascade.schemas.suspensions`): adopted at start, and read again at
    most once a second while the stream flows.
    """

    watch: Watch
    suspend: bool
    scopes: set[str] = field(default_factory=set)  # suspended: EVERYTHING or test keys
    shared: Shared | None = None
    # The languages the suspended pool (OTHER) does not cover: those tested on their own
    # when it fired.
    named: set[str] = field(default_factory=set)
    _said: set[str] = field(default_factory=set, repr=False)
    _looked: float = field(default=0.0, repr=False)  # monotonic time of the last read
    _seen: float | None = field(default=None, repr=False)  # the file's mtime then

    def __post_init__(self) -> None:
        self._gauge(EVERYTHING, self.watch.overall)
        self._adopt(why="before this process started")

    @property
    def suspended(self) -> bool:
        """Whether anything is suspended."""
        return bool(self.scopes)

    def suspends(self, lang: str | None) -> bool:
        """Whether a chunk of a document in ``lang`` goes to the full model."""
        if self.shared is not None and time.monotonic() - self._looked >= 1.0:
            self._adopt(why="by another worker process")
        if EVERYTHING in self.scopes:
            return True
        if lang is None or not self.scopes:
            return False
        pooled = lang in (OTHER, EVERYTHING) or lang not in self.named
        return lang in self.scopes or (OTHER in self.scopes and pooled)

    def resume(self, state: Watch | None) -> Watch:
        """The job's test as the flow keeps it: ``state`` (what the last snapshot held)
        where it judged the calibration in force, else this guard's own, fresh."""
        if state is not None and state is not self.watch and state.judging == self.watch.judging:
            self.watch = state
            self._gauge(EVERYTHING, state.overall)
            for key, test in state.languages.items():
                self._gauge(key, test)
        return self.watch

    def _adopt(self, why: str) -> None:
        """Take up the suspensions recorded for this calibration (by this job's other
        processes, or before a restart)."""
        if self.shared is None or not self.suspend:
            return
        self._looked = time.monotonic()
        path = self.shared.recovery_dir / suspensions.SUSPENSIONS_FILE
        try:
            mtime = path.stat().st_mtime if path.exists() else None
            if mtime == self._seen:
                return
            recorded = suspensions.load(self.shared.recovery_dir)
            self._seen = mtime
        except (OSError, ValueError) as e:  # never costs a worker: the file is read again
            log.warning("cannot read %s: %s", path, e)
            return
        for entry in recorded.suspended:
            if entry.cascade_sha256 != self.shared.cascade_sha256 or entry.scope in self.scopes:
                continue
            self.scopes.add(entry.scope)
            if entry.scope == OTHER:
                self.named = set(entry.named)
            self._said.add(entry.scope)
            what = (
                "every chunk goes"
                if entry.scope == EVERYTHING
                else (f"the chunks of {described(entry.scope)} go")
            )
            log.error(
                "cascade guarantee violated %s (%s, recorded in %s): %s to the full model"
                " until another calibration is in force",
                why,
                entry.evidence,
                path,
                what,
            )
            self._set_gauge(entry.scope, violated=True)

    def _worst(self) -> str:
        """The language disagreeing most, where the stream says which."""
        if not self.watch.languages:
            return ""
        lang, t = max(self.watch.languages.items(), key=lambda kv: kv[1].rate)
        return f" (most on language {lang}: {100 * t.rate:.1f}% of {t.audits})"

    def audit(self, agree: bool, lang: str | None) -> None:
        key = None if lang is None else self.watch.tested_as(lang)
        fired = self.watch.observe(not agree, lang)
        self._gauge(EVERYTHING, self.watch.overall)
        if key is not None:
            self._gauge(key, self.watch.languages[key])
        if fired is None:
            return
        scope = EVERYTHING if fired is self.watch.overall else key
        assert scope is not None
        if scope in self._said or EVERYTHING in self._said:
            return  # nothing wider to say: later alarms show in the gauge
        self._said.add(scope)
        where = self._worst() if scope == EVERYTHING else f" on {described(scope)}"
        others = "languages" if described(scope).startswith("language") else "kinds of text"
        then = (
            "the cascade goes on (cascade.on_violation = alert)"
            if not self.suspend
            else "every chunk goes to the full model from now on (cascade.on_violation)"
            if scope == EVERYTHING
            else f"the chunks of {described(scope)} go to the full model from now on, the"
            f" other {others} keep their cascade (cascade.on_violation)"
        )
        measured = f"{100 * fired.rate:.3g}% of {fired.audits} audited chunks"
        bound = (
            f"above the certified epsilon {100 * self.watch.epsilon:g}% (confidence"
            f" {100 * (1 - self.watch.delta):g}%)"
        )
        log.error(
            "cascade guarantee violated%s: the cheap stages disagreed with the full model"
            " on %s, %s; %s; recalibrate on a sample of this stream (kascade sample)",
            where,
            measured,
            bound,
            then,
        )
        if self.suspend:
            if scope == OTHER:
                self.named = self.watch.named()
            self.scopes.add(scope)
            self._share(scope, f"{measured} disagreed, {bound}")

    def _share(self, scope: str, evidence: str) -> None:
        if self.shared is None:
            return
        named = self.named if scope == OTHER else ()
        try:
            suspensions.add(
                self.shared.recovery_dir, self.shared.cascade_sha256, scope, evidence, named
            )
        except (OSError, ValueError) as e:  # this process stays suspended regardless
            log.warning("cannot record the suspension in %s: %s", self.shared.recovery_dir, e)

    def _gauge(self, lang: str, test: BoundTest) -> None:
        self._set_gauge(lang, violated=test.violated or lang in self.scopes)

    @staticmethod
    def _set_gauge(lang: str, violated: bool) -> None:
        state = "violated" if violated else "holding"
        for s in ("holding", "violated"):
            metrics.GUARANTEE.labels(lang, s).set(1.0 if s == state else 0.0)


def described(scope: str) -> str:
    """A test's scope in words: a language, a length of document, or both.

    >>> described("sw"), described("short"), described("de/long")
    ('language sw', 'short documents', 'long documents in language de')
    """
    lang, _, length = scope.rpartition("/")
    if length in LENGTHS:
        return f"{length} documents" + (f" in language {lang}" if lang else "")
    return f"language {scope}"


def never_suspended(_doc: object) -> bool:
    """The verdict source of a cascade without a guard: its cheap stages, always."""
    return False
