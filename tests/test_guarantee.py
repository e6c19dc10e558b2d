"""The live test of the certified bound: valid however long it runs and however often it
is looked at, quick above the bound, named per language; and what a violation does to
the cascade (every chunk to the full model, records marked) and to the gauge."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from helpers import word_chunker, word_doc

from kascade.operators import metrics
from kascade.operators.bound import BoundTest, Watch
from kascade.operators.cascade import CascadeLogic
from kascade.operators.guarantee import Guard
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, Outcome
from kascade.operators.reduce import Labeling, label_document
from kascade.operators.verdicts import Verdict
from kascade.schemas import Aggregation, CascadeUse, ModelIdentity


def first_alarm(test: BoundTest, rate: float, audits: int, rng: random.Random) -> int | None:
    """Feed a stream of ``audits`` draws, looking after every one (optional stopping)."""
    for i in range(audits):
        if test.observe(rng.random() < rate):
            return i + 1
    return None


def test_at_the_bound_the_test_fires_on_at_most_delta_of_streams_however_long_it_watches() -> None:
    rng = random.Random(7)
    epsilon, delta, streams = 0.05, 0.2, 300
    alarms = [first_alarm(BoundTest(epsilon, delta), epsilon, 2_000, rng) for _ in range(streams)]
    fired = sum(a is not None for a in alarms)
    assert fired / streams <= delta, fired  # Ville: P(ever) <= delta, not per look


def test_below_the_bound_ten_thousand_audits_raise_no_alarm_on_any_of_twenty_streams() -> None:
    rng = random.Random(3)
    for _ in range(20):
        assert first_alarm(BoundTest(0.02, 0.05), 0.01, 10_000, rng) is None


def test_at_three_times_epsilon_the_test_fires_well_within_two_thousand_audits() -> None:
    rng = random.Random(11)
    alarms = [first_alarm(BoundTest(0.02, 0.05), 0.06, 2_000, rng) for _ in range(100)]
    assert all(a is not None for a in alarms)
    assert float(np.median(alarms)) < 300


def test_a_drifting_language_is_named_even_while_the_total_holds() -> None:
    rng = random.Random(5)
    watch = Watch(epsilon=0.02, delta=0.05)
    fired = None
    for i in range(20_000):
        lang = "sw" if i % 20 == 0 else "en"  # 5% of the stream, disagreeing on 20%
        f = watch.observe(rng.random() < (0.2 if lang == "sw" else 0.005), lang)
        fired = fired or f
    assert fired is watch.languages["sw"]
    assert not watch.languages["en"].violated


def test_the_violation_line_keeps_the_precision_of_a_small_epsilon(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = Guard(Watch(epsilon=0.0005, delta=0.01), suspend=False)
    with caplog.at_level(logging.ERROR, logger="kascade.operators.guarantee"):
        for i in range(3000):
            guard.audit(agree=i % 100 != 0, lang="en")  # 1% disagree
    (line,) = [r.getMessage() for r in caplog.records]
    assert "above the certified epsilon 0.05% (confidence 99%)" in line


def test_a_violation_is_one_line_sets_the_gauge_and_suspends_the_cheap_stages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True)
    with caplog.at_level(logging.ERROR, logger="kascade.operators.guarantee"):
        for i in range(400):
            guard.audit(agree=i % 5 != 0, lang="de")  # 20% disagree
    assert guard.suspends("de") and guard.suspends("fr") and guard.suspends(None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("cascade guarantee violated (most on language de: ")
    assert "above the certified epsilon 2% (confidence 95%)" in line
    assert "every chunk goes to the full model from now on" in line
    state = metrics.GUARANTEE.labels("all", "violated")._value.get()
    assert state == 1.0 and metrics.GUARANTEE.labels("all", "holding")._value.get() == 0.0
    # another guard (another run in this process) starts from its own state
    assert not Guard(Watch(epsilon=0.02, delta=0.05), suspend=True).suspends("de")


def test_with_alert_only_the_cascade_goes_on_after_a_violation() -> None:
    guard = Guard(Watch(epsilon=0.02, delta=0.05), suspend=False)
    for i in range(400):
        guard.audit(agree=i % 5 != 0, lang=None)
    assert guard.watch.violated and not guard.suspended


def test_a_suspended_cascade_sends_every_chunk_to_the_full_model_and_the_record_says_so() -> None:
    calls = []

    def cheap(t: ChunkTask) -> Verdict:
        calls.append(t.index)
        return Verdict("s0", np.array([0.9, 0.1]))

    guard = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, scopes={"all"})
    logic = CascadeLogic(
        cheap,
        word_chunker(10),
        256,
        Aggregation.TOKEN_MEAN,
        suspends=lambda doc: guard.suspends(doc.lang),
    )
    out = logic.on_item(word_doc("d", 20, lang="en"))[0]
    assert calls == []  # not even S0
    outcome, escalated = out[0], out[1:]
    assert isinstance(outcome, Outcome) and outcome.suspended
    assert len(escalated) == 2 and all(isinstance(e, Escalation) for e in escalated)
    results = [
        ChunkResult(e.task.doc, e.task.index, 10, np.array([0.2, 0.8]), stage="full")
        for e in escalated
    ]
    labeling = Labeling(
        labels=["a", "b"],
        aggregation=Aggregation.TOKEN_MEAN,
        model=ModelIdentity(name="x", variant="fp32", manifest_sha256="0" * 64),
        cascade=CascadeUse.ON,
    )
    record = label_document(outcome.doc, results, labeling, now_ms=0, outcome=outcome)
    assert record.cascade is CascadeUse.SUSPENDED and record.chunks.full_model == 2


def test_one_drifted_language_goes_to_the_full_model_while_the_others_keep_their_cascade(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = Guard(Watch(epsilon=0.02, delta=0.05, max_languages=16), suspend=True)
    rng = random.Random(5)
    langs = [f"l{i}" for i in range(9)] + ["sw"]
    with caplog.at_level(logging.ERROR, logger="kascade.operators.guarantee"):
        for _ in range(6000):
            lang = rng.choice(langs)
            guard.audit(agree=rng.random() >= (0.15 if lang == "sw" else 0.002), lang=lang)
    assert guard.scopes == {"sw"}  # overall 1.7%, within epsilon 2%: only sw's test fires
    assert guard.suspends("sw") and not guard.suspends("l0") and not guard.suspends(None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("cascade guarantee violated on language sw: ")
    assert "the chunks of language sw go to the full model from now on" in line


def test_a_violation_of_the_pool_suspends_every_language_tested_in_it() -> None:
    guard = Guard(Watch(epsilon=0.02, delta=0.05, max_languages=2), suspend=True)
    rng = random.Random(7)
    for i in range(1, 6001):  # en and de come first: the two named
        if i % 10:
            guard.audit(agree=rng.random() >= 0.002, lang=("en", "de")[i % 2])
        else:  # a tenth of the stream in languages past the first two, 15% disagreeing
            guard.audit(agree=rng.random() >= 0.15, lang=f"zz-{i % 7}")
    assert guard.scopes == {"other"}
    assert guard.suspends("zz-3") and guard.suspends("never-seen-yet")
    assert not guard.suspends("en") and not guard.suspends("de")


def test_a_record_calling_its_language_all_is_tested_in_the_pool_not_as_the_whole() -> None:
    watch = Watch(epsilon=0.02, delta=0.05)
    assert watch.tested_as("all") == "other" and watch.tested_as("other") == "other"


def test_a_hundred_thousand_languages_keep_the_tests_bounded_and_the_alarm_budget_whole() -> None:
    watch = Watch(epsilon=0.02, delta=0.05, max_languages=16)
    for i in range(100_000):
        watch.observe(i % 50 == 0, f"zz-{i}")
    assert len(watch.languages) == 16 + 1
    assert watch.languages["other"].audits == 100_000 - 16
    spent = watch.overall.delta + sum(t.delta for t in watch.languages.values())
    assert spent <= 0.05 + 1e-12
    assert min(t.delta for t in watch.languages.values()) == pytest.approx(0.05 / 2 / 17)


def test_the_audit_draw_cannot_be_predicted_from_outside_a_process() -> None:
    import subprocess
    import sys

    code = (
        "from kascade.operators.audits import audit_pick;"
        "print(''.join('1' if audit_pick(f'doc-{i}', 0, 0.5) else '0' for i in range(64)))"
    )
    draws = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        for _ in range(2)
    }
    assert len(draws) == 2  # another key in every process


def _fire(guard: Guard, lang: str | None) -> None:
    for i in range(400):
        guard.audit(agree=i % 5 != 0, lang=lang)  # 20% disagree


def test_a_suspension_reaches_the_other_processes_and_outlives_a_restart(tmp_path) -> None:
    from kascade.operators.guarantee import Shared

    shared = Shared(tmp_path, "ab" * 32)
    one = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    other = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    _fire(one, None)
    assert one.suspends("de")
    other._looked = 0.0  # its next look at the file is due
    assert other.suspends("de") and other.scopes == {"all"}
    restarted = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    assert restarted.scopes == {"all"}  # before a single audit


def test_a_language_suspension_spreads_as_that_language_only(tmp_path) -> None:
    from kascade.operators.guarantee import Shared

    shared = Shared(tmp_path, "ab" * 32)
    one = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    for i in range(3000):  # sw 15% disagreeing among agreeing languages
        lang = ("sw", "de", "fr", "en", "it", "nl", "pl", "pt", "tr", "es")[i % 10]
        one.audit(agree=not (lang == "sw" and i % 70 < 10), lang=lang)
    assert one.scopes == {"sw"}
    restarted = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    assert restarted.suspends("sw") and not restarted.suspends("de")


def test_a_suspension_of_one_length_in_one_language_outlives_a_restart_as_that_scope_only(
    tmp_path,
) -> None:
    # Scopes as Cascade.scope_of names them where a stratum was certified per length
    from kascade.operators.guarantee import Shared

    shared = Shared(tmp_path, "ab" * 32)
    one = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    for i in range(3000):  # short German documents 7% disagreeing (1.4% of all), the rest agree
        scope = ("de/short", "de/long", "fr/short", "fr/long", "short")[i % 5]
        one.audit(agree=not (scope == "de/short" and i % 70 < 5), lang=scope)
    assert one.scopes == {"de/short"}
    restarted = Guard(Watch(epsilon=0.02, delta=0.05), suspend=True, shared=shared)
    assert restarted.suspends("de/short")
    assert not any(restarted.suspends(s) for s in ("de/long", "de", "fr/short", "short", None))


def test_another_calibration_in_force_ends_the_suspension(tmp_path) -> None:
    from kascade.operators.guarantee import Shared

    _fire(Guard(Watch(0.02, 0.05), suspend=True, shared=Shared(tmp_path, "ab" * 32)), None)
    recalibrated = Guard(Watch(0.02, 0.05), suspend=True, shared=Shared(tmp_path, "cd" * 32))
    assert not recalibrated.suspended and not recalibrated.suspends("de")


def test_an_unreadable_suspensions_file_costs_a_warning_not_a_worker(tmp_path, caplog) -> None:
    from kascade.operators.guarantee import Shared

    (tmp_path / "suspensions.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="kascade.operators.guarantee"):
        guard = Guard(Watch(0.02, 0.05), suspend=True, shared=Shared(tmp_path, "ab" * 32))
    assert not guard.suspended and "cannot read" in caplog.text


def test_a_pool_suspension_reaches_another_process_with_the_languages_it_leaves_out(
    tmp_path,
) -> None:
    from kascade.operators.guarantee import Shared

    shared = Shared(tmp_path, "ab" * 32)
    one = Guard(Watch(epsilon=0.02, delta=0.05, max_languages=2), suspend=True, shared=shared)
    rng = random.Random(7)
    for i in range(1, 6001):  # as above: en and de named, 15% disagreeing past them
        if i % 10:
            one.audit(agree=rng.random() >= 0.002, lang=("en", "de")[i % 2])
        else:
            one.audit(agree=rng.random() >= 0.15, lang=f"zz-{i % 7}")
    assert one.scopes == {"other"}
    # a process whose own (empty) test never saw a language
    other = Guard(Watch(epsilon=0.02, delta=0.05, max_languages=2), suspend=True, shared=shared)
    assert other.suspends("zz-3") and other.suspends("never-seen-yet") and other.suspends("all")
    assert not other.suspends("en") and not other.suspends("de") and not other.suspends(None)


def test_the_job_s_test_resumes_from_the_flow_s_state_unless_it_judged_another_calibration() -> (
    None
):
    before = Guard(Watch(0.1, 0.1, judging="ab" * 32), suspend=True)
    before.audit(agree=False, lang=None)  # one disagreement: evidence, no alarm yet
    state = before.watch
    assert not state.violated and state.overall.audits == 1

    restarted = Guard(Watch(0.1, 0.1, judging="ab" * 32), suspend=True)
    assert restarted.resume(state) is state
    restarted.audit(agree=False, lang=None)  # the second in a row: fires on the sum
    assert restarted.scopes == {"all"} and state.overall.fired_at == 2

    fresh = Guard(Watch(0.1, 0.1, judging="ab" * 32), suspend=True)
    fresh.audit(agree=False, lang=None)
    assert not fresh.suspended  # what the restart would have done without the state

    recalibrated = Guard(Watch(0.1, 0.1, judging="cd" * 32), suspend=True)
    assert recalibrated.resume(state) is recalibrated.watch is not state
    assert recalibrated.watch.overall.audits == 0


def stop_watch() -> Watch:
    """A run's test with a certified document stop at epsilon_doc 0.02 beside it."""
    return Watch(epsilon=0.02, delta=0.05, stop=BoundTest(0.02, 0.05))


def test_a_stop_that_labels_stopped_documents_otherwise_is_suspended_and_chunks_keep_theirs(
    tmp_path, caplog
) -> None:
    from kascade.operators.guarantee import Shared

    shared = Shared(tmp_path, "ab" * 32)
    guard = Guard(stop_watch(), suspend=True, shared=shared)
    for _ in range(100):  # the stop is right: it holds
        guard.audit_stop(agree=True)
    assert guard.stop_in_force()
    with caplog.at_level(logging.ERROR, logger="kascade.operators.guarantee"):
        for i in range(200):  # one stopped document in five labeled otherwise
            guard.audit_stop(agree=i % 5 != 0)
    assert not guard.stop_in_force()
    assert not any(guard.suspends(lang) for lang in ("de", None, "other"))  # chunks: cascade
    said = [r.getMessage() for r in caplog.records]
    alarms = [m for m in said if "document stop guarantee violated" in m]
    assert len(alarms) == 1 and "every document is read to its end" in alarms[0], alarms
    restarted = Guard(stop_watch(), suspend=True, shared=shared)
    assert not restarted.stop_in_force() and not restarted.suspends("de")


def test_a_violated_stop_only_alerts_where_the_run_says_so() -> None:
    guard = Guard(stop_watch(), suspend=False)
    for i in range(200):
        guard.audit_stop(agree=i % 2 == 0)
    assert guard.watch.stop is not None and guard.watch.stop.violated
    assert guard.stop_in_force()


def test_a_snapshot_from_before_the_stop_had_a_test_resumes_with_one() -> None:
    old = Watch(epsilon=0.02, delta=0.05, judging="ab" * 32)
    del old.__dict__["stop"]  # as unpickled from a snapshot written before the field
    guard = Guard(Watch(0.02, 0.05, judging="ab" * 32, stop=BoundTest(0.02, 0.05)), True)
    resumed = guard.resume(old)
    assert resumed is old and resumed.stop is not None
    guard.audit_stop(agree=False)
    assert resumed.stop.audits == 1


class CountingEncoder:
    """The full model's two calls, answering ``probs`` for every chunk, counted."""

    def __init__(self, probs: list[float], fail: bool = False) -> None:
        self.logits_out, self.fail = np.log(np.asarray(probs)), fail
        self.calls: list[str] = []

    def logits(self, ids: np.ndarray) -> np.ndarray:
        self.calls.append("whole")
        if self.fail:
            raise RuntimeError("the full model failed")
        return self.logits_out

    def suffix(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.calls.append("suffix")
        return self.logits_out[None, :]


def stopped(label: int, chunks: int = 10, read: int = 2):
    from kascade.operators.items import DocMeta, FullRead

    doc = DocMeta("d", chunks, "en", None, None)
    tasks = [ChunkTask(doc, i, np.arange(64), 64) for i in range(chunks)]
    hidden = {i: np.zeros((1, 64, 8), dtype=np.float32) for i in range(read)}
    return FullRead(tasks, hidden, label, Aggregation.TOKEN_MEAN)


def test_a_full_read_ends_once_the_unread_chunks_cannot_change_its_label() -> None:
    from kascade.operators.full_model import read_through

    encoder = CountingEncoder([0.05, 0.95])
    (checked,) = read_through(encoder, stopped(label=1))  # type: ignore[arg-type]
    assert checked.agree
    # lead 0.9 a chunk: after k of 10 equal chunks, decided once 0.9 k > 10 - k
    assert encoder.calls == ["suffix"] * 2 + ["whole"] * 4
    encoder = CountingEncoder([0.95, 0.05])
    assert not read_through(encoder, stopped(label=1))[0].agree  # type: ignore[arg-type]
    assert len(encoder.calls) == 6
    encoder = CountingEncoder([0.45, 0.55])  # undecided to the end: every chunk is read
    assert read_through(encoder, stopped(label=1))[0].agree  # type: ignore[arg-type]
    assert len(encoder.calls) == 10


def test_a_stopped_document_the_full_model_failed_on_counts_in_no_test() -> None:
    from kascade.operators.full_model import read_through

    encoder = CountingEncoder([0.05, 0.95], fail=True)
    assert read_through(encoder, stopped(label=1)) == []  # type: ignore[arg-type]
    assert encoder.calls == ["suffix", "suffix", "whole"]
