"""The certified bound, checked while the job runs: each process's :class:`Guard` counts
the audits into the job's test (:mod:`.bound`) and, where a test fires, suspends what it
covers, in this process and (through the recovery directory) in every other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from kascade.operators import metrics
from kascade.operators.bound import EVERYTHING, OTHER, STOP, BoundTest, Watch, described
from kascade.schemas import suspensions

log = logging.getLogger(__name__)


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
    overall test fired, every chunk does. The certified document stop has a test of its
    own (stopped documents read to the end by the full model); where it fires, every
    document is read to its end. The job never stops for it and no record is lost.

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
        if self.watch.stop is not None:
            self._gauge(STOP, self.watch.stop)
        self._adopt(why="before this process started")

    @property
    def suspended(self) -> bool:
        """Whether anything is suspended."""
        return bool(self.scopes)

    def suspends(self, lang: str | None) -> bool:
        """Whether a chunk of a document in ``lang`` goes to the full model."""
        self._look()
        if EVERYTHING in self.scopes:
            return True
        if lang is None or not self.scopes:
            return False
        pooled = lang in (OTHER, EVERYTHING) or lang not in self.named
        return lang in self.scopes or (OTHER in self.scopes and pooled)

    def stop_in_force(self) -> bool:
        """Whether the certified document stop may end a reading (its test has not
        suspended it)."""
        self._look()
        return STOP not in self.scopes

    def _look(self) -> None:
        if self.shared is not None and time.monotonic() - self._looked >= 1.0:
            self._adopt(why="by another worker process")

    def resume(self, state: Watch | None) -> Watch:
        """The job's test as the flow keeps it: ``state`` (what the last snapshot held)
        where it judged the calibration in force, else this guard's own, fresh."""
        if state is not None and state is not self.watch and state.judging == self.watch.judging:
            if state.stop is None:  # a snapshot from before the stop had its test
                state.stop = self.watch.stop
            self.watch = state
            self._gauge(EVERYTHING, state.overall)
            for key, test in state.languages.items():
                self._gauge(key, test)
            if state.stop is not None:
                self._gauge(STOP, state.stop)
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
                "every document is read to its end"
                if entry.scope == STOP
                else "every chunk goes to the full model"
                if entry.scope == EVERYTHING
                else (f"the chunks of {described(entry.scope)} go to the full model")
            )
            log.error(
                "%s guarantee violated %s (%s, recorded in %s): %s"
                " until another calibration is in force",
                "document stop" if entry.scope == STOP else "cascade",
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

    def audit_stop(self, agree: bool) -> None:
        """Count one stopped document that the full model also read to its end: whether
        its label agreed with the stop's."""
        test = self.watch.stop
        if test is None:
            return
        fired = test.observe(not agree)
        self._gauge(STOP, test)
        if not fired or STOP in self._said:
            return
        self._said.add(STOP)
        measured = f"{100 * test.rate:.3g}% of {test.audits} stopped documents"
        bound = (
            f"above the certified epsilon_doc {100 * test.epsilon:g}% (confidence"
            f" {100 * (1 - test.delta):g}%)"
        )
        then = (
            "the stop goes on (cascade.on_violation = alert)"
            if not self.suspend
            else "every document is read to its end from now on, the chunk cascade goes on"
            " (cascade.on_violation)"
        )
        log.error(
            "document stop guarantee violated: a full read by the full model labeled %s"
            " otherwise, %s; %s; recalibrate the stop on a sample of this stream (kascade"
            " sample, kascade calibrate --documents)",
            measured,
            bound,
            then,
        )
        if self.suspend:
            self.scopes.add(STOP)
            self._share(STOP, f"{measured} labeled otherwise, {bound}")

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
            on = 1.0 if s == state else 0.0
            if lang == STOP:
                metrics.STOP_GUARANTEE.labels(s).set(on)
            else:
                metrics.GUARANTEE.labels(lang, s).set(on)


def never_suspended(_doc: object) -> bool:
    """The verdict source of a cascade without a guard: its cheap stages, always."""
    return False


def always() -> bool:
    """The document stop of a cascade without a guard: in force, always."""
    return True
