"""The cascade: document-level early exit, the per-document state machine, and the
calibration that certifies its thresholds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import word_chunker, word_doc

from kascade.operators.audits import audit_pick
from kascade.operators.calibration import Head
from kascade.operators.cascade import CascadeLogic
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, FullRead, Outcome
from kascade.operators.validate import Received
from kascade.operators.verdicts import Verdict
from kascade.schemas import Aggregation, StopReason
from kascade.schemas.cascade import StopRule
from kascade.toolchain.calibrate import HEAD_CS, PATH, fit_head
from kascade.toolchain.certify import certify, min_accepted, p_value, upper_bound

TM = Aggregation.TOKEN_MEAN


def threshold_outcome(conf: np.ndarray, wrong: np.ndarray) -> Callable[[float], tuple[int, int]]:
    """Accepted and disagreeing counts of a single head at a threshold."""

    def outcome(t: float) -> tuple[int, int]:
        accepted = conf >= t
        return int(accepted.sum()), int(wrong[accepted].sum())

    return outcome


def p(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64)


def reader(stages: Callable[[ChunkTask], Verdict], room: int = 100, **kw: Any) -> CascadeLogic:
    """The cascade over texts of words (:func:`helpers.word_chunker`)."""
    return CascadeLogic(stages, word_chunker(room), 256, TM, **kw)


class FakeStages:
    """Cheap verdicts chosen by the test, counting calls."""

    def __init__(self, verdicts: dict[int, Verdict]) -> None:
        self.verdicts, self.calls = verdicts, 0

    def __call__(self, t: ChunkTask) -> Verdict:
        self.calls += 1
        return self.verdicts[t.index]


HIDDEN = np.zeros((1, 4, 2), dtype=np.float32)


def test_uncertain_chunks_are_escalated_when_they_could_change_the_label() -> None:
    stages = FakeStages(
        {
            0: Verdict("s0", p(0.95, 0.05)),
            1: Verdict("uncertain", p(0.4, 0.6), HIDDEN),
            2: Verdict("s1", p(0.3, 0.7)),
        }
    )
    out, discard = reader(stages).on_item(word_doc("doc", 300))
    assert discard is CascadeLogic.DISCARD
    settled = [x for x in out if isinstance(x, ChunkResult)]
    escalated = [x for x in out if isinstance(x, Escalation)]
    assert [(r.index, r.stage) for r in settled] == [(0, "s0"), (2, "s1")]
    assert [e.task.index for e in escalated] == [1]
    assert escalated[0].hidden is HIDDEN  # the suffix reuses the prefix's output
    np.testing.assert_array_equal(escalated[0].fallback, p(0.4, 0.6))


def test_uncertain_chunks_are_skipped_when_the_document_is_already_decided() -> None:
    stages = FakeStages(
        {
            0: Verdict("s0", p(0.99, 0.01)),
            1: Verdict("s1", p(0.97, 0.03)),
            2: Verdict("uncertain", p(0.5, 0.5), HIDDEN),
        }
    )
    # Chunks of 300, 300 and 50 tokens: a margin of 0.96*300*2 far exceeds 50 tokens.
    out, _ = reader(stages, room=300).on_item(word_doc("doc", 650))
    assert isinstance(out[0], Outcome) and out[0].reading is not None
    assert out[0].reading.stopped is StopReason.END  # every chunk read
    assert all(isinstance(x, ChunkResult) for x in out[1:])
    assert [x.stage for x in out[1:]] == ["s0", "s1", "skipped"]


def test_a_replayed_record_of_a_document_being_read_is_not_read_twice() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.9, 0.1)) for i in range(3)})
    logic = reader(stages, turn=1)
    logic.on_item(word_doc("doc", 300))
    assert logic.on_item(word_doc("doc", 300)) == ([], CascadeLogic.RETAIN)
    assert stages.calls == 1


def test_the_state_survives_a_snapshot_and_restore() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.9, 0.1)) for i in range(3)})
    logic = reader(stages, turn=1)
    logic.on_item(word_doc("doc", 300))
    logic.on_notify()
    resumed = reader(stages, turn=1, state=logic.snapshot())
    assert resumed.on_item(word_doc("doc", 300)) == ([], CascadeLogic.RETAIN)  # the replay
    out, discard = resumed.on_notify()
    assert discard is CascadeLogic.DISCARD and len(out) == 1 + 3  # the outcome, 3 results
    assert stages.calls == 3


def test_audits_send_settled_chunks_to_the_full_model_too() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.1, 0.9)) for i in range(3)})
    out, _ = reader(stages, audit_fraction=1.0).on_item(word_doc("doc", 300))
    audits = [x for x in out if isinstance(x, Escalation)]
    assert len(audits) == 3 and all(a.audit_of == 1 and a.fallback is None for a in audits)


STOP_AFTER_TWO = StopRule(min_chunks=2, min_lead=0.5)


def test_a_stopped_document_drawn_for_the_live_test_goes_whole_to_the_full_model() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.05, 0.95), HIDDEN) for i in range(5)})
    logic = reader(stages, stop=STOP_AFTER_TWO, stop_audit_fraction=1.0)
    out, _ = logic.on_item(word_doc("doc", 500))
    assert isinstance(out[0], Outcome) and out[0].reading.stopped is StopReason.CERTAIN
    assert [r.index for r in out if isinstance(r, ChunkResult)] == [0, 1]  # its output
    (full,) = [x for x in out if isinstance(x, FullRead)]
    assert not any(isinstance(x, Escalation) for x in out)
    assert [t.index for t in full.tasks] == [0, 1, 2, 3, 4] and full.label == 1
    assert full.strategy is TM
    assert {i: h is HIDDEN for i, h in full.hidden.items()} == {0: True, 1: True}
    assert stages.calls == 2  # the cheap stages never read the rest


def test_a_stopped_document_past_the_chunk_limit_is_not_audited_and_keeps_its_label() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.05, 0.95)) for i in range(5)})
    logic = CascadeLogic(
        stages, word_chunker(100), 3, TM, stop=STOP_AFTER_TWO, stop_audit_fraction=1.0
    )
    out, _ = logic.on_item(word_doc("doc", 500))
    assert isinstance(out[0], Outcome) and out[0].reading.stopped is StopReason.CERTAIN
    assert not any(isinstance(x, Escalation | FullRead) for x in out)


def test_once_the_live_test_suspends_the_stop_every_document_is_read_to_its_end() -> None:
    stages = FakeStages({i: Verdict("s0", p(0.05, 0.95)) for i in range(5)})
    logic = reader(stages, stop=STOP_AFTER_TWO, stop_in_force=lambda: False)
    out, _ = logic.on_item(word_doc("doc", 500))
    assert isinstance(out[0], Outcome) and out[0].reading.stopped is StopReason.END
    assert out[0].reading.chunks_read == 5 and stages.calls == 5


def test_audit_draws_are_deterministic_and_close_to_the_fraction() -> None:
    picks = [audit_pick(f"doc-{i}", 0, 0.1) for i in range(20_000)]
    assert picks == [audit_pick(f"doc-{i}", 0, 0.1) for i in range(20_000)]
    assert 0.09 < np.mean(picks) < 0.11


# --- calibration math ------------------------------------------------------------------


def test_the_zero_disagreement_sample_sizes_match_the_design_notes() -> None:
    assert min_accepted(0.01, 0.05) == 299
    assert p_value(0, 299, 0.01) <= 0.05 < p_value(0, 298, 0.01)
    assert p_value(1, 473, 0.01) <= 0.05 < p_value(1, 472, 0.01)


def test_the_clopper_pearson_bound_covers_the_observed_rate() -> None:
    assert upper_bound(0, 299, 0.05) == pytest.approx(0.01, abs=2e-4)
    assert 3 / 800 < upper_bound(3, 800, 0.05) < 0.01


def test_fixed_sequence_testing_stops_at_the_first_threshold_that_fails() -> None:
    conf = np.linspace(1, 0, 1000)
    wrong = np.zeros(1000, dtype=bool)
    wrong[400:] = True  # everything below confidence 0.6 is wrong
    t, n, k = certify([0.9, 0.7, 0.3, 0.65], threshold_outcome(conf, wrong), 0.05, 0.05)
    assert t == 0.7 and k == 0 and n == 300  # 0.3 fails, so 0.65 is never tested


def test_the_certified_guarantee_holds_on_fresh_draws() -> None:
    """Seeded simulation: a head whose errors grow as its confidence falls. Over many
    calibration draws, the true disagreement at the certified threshold may exceed
    epsilon in at most about delta of them."""
    epsilon, delta, n_cal = 0.05, 0.1, 600
    rng = np.random.default_rng(1234)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        conf = rng.beta(5, 1.5, size=n)
        wrong = rng.random(n) < 0.6 * (1 - conf) ** 1.5
        return conf, wrong

    fresh_conf, fresh_wrong = draw(400_000)
    path = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5]  # fixed before any draw
    violations, certified = 0, 0
    trials = 300
    for _ in range(trials):
        conf_b, wrong_b = draw(n_cal)
        t, n, _ = certify(path, threshold_outcome(conf_b, wrong_b), epsilon, delta)
        if n == 0:
            continue
        certified += 1
        accepted = fresh_conf >= t
        if fresh_wrong[accepted].mean() > epsilon:
            violations += 1
    assert certified > trials * 0.6  # the procedure is not vacuous here
    # Binomial slack around delta for 300 trials (~3.2 sigma).
    assert violations / certified <= delta + 3.2 * np.sqrt(delta * (1 - delta) / certified)


def test_the_default_path_runs_from_conservative_to_aggressive() -> None:
    assert list(PATH) == sorted(PATH, reverse=True)


def _blobs(n: int, separation: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three labels in 20 dimensions, the first feature carrying the label."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = rng.normal(size=(n, 20)) * 3.0 + 1.0
    x[:, 0] += separation * y
    return x, y


def test_a_head_on_labels_it_cannot_predict_is_regularized_into_modest_confidence() -> None:
    fitted = fit_head(*_blobs(1200, separation=0.0, seed=1), 3, "hidden", seed=0)
    assert fitted.c == HEAD_CS[0]
    probs = Head.of(fitted.weights).probs(_blobs(500, 0.0, seed=2)[0])
    assert probs.max(axis=1).max() < 0.6  # no threshold on the path accepts noise


def test_a_head_on_separable_features_keeps_a_weak_penalty_and_high_confidence() -> None:
    fitted = fit_head(*_blobs(1200, separation=12.0, seed=3), 3, "hidden", seed=0)
    assert fitted.c > HEAD_CS[2]
    test_x, test_y = _blobs(500, 12.0, seed=4)
    probs = Head.of(fitted.weights).probs(test_x)
    assert (probs.argmax(axis=1) == test_y).mean() > 0.95
    assert np.median(probs.max(axis=1)) > 0.99


def test_a_head_never_predicts_a_label_it_was_not_fitted_on() -> None:
    x, y = _blobs(300, separation=12.0, seed=5)
    fitted = fit_head(x, y, 5, "hidden", seed=0)  # labels 3 and 4 never occur
    assert set(Head.of(fitted.weights).probs(x).argmax(axis=1)) <= {0, 1, 2}


def doc(name: str, chunks: int) -> Received:
    return word_doc(name, 100 * chunks)


class Settled:
    """Every chunk settled by S0, in the order they were read."""

    def __init__(self) -> None:
        self.read: list[tuple[str, int]] = []

    def __call__(self, t: ChunkTask) -> Verdict:
        self.read.append((t.doc.id, t.index))
        return Verdict("s0", p(0.9, 0.1))


def activations(logics: dict[str, CascadeLogic], arrivals: list[Received]) -> list[str]:
    """Bytewax's order: a batch of items, then one on_notify per document that asked for
    one, then the next activation's notifications. The documents in decided order."""
    decided = []
    for r in arrivals:
        out, _ = logics[r.doc.id].on_item(r)
        decided += [r.doc.id] if out else []
    while due := [k for k, lg in logics.items() if lg.notify_at() is not None]:
        for k in due:
            out, _ = logics[k].on_notify()
            decided += [k] if out else []
    return decided


def test_with_turns_a_short_document_is_read_before_the_long_one_ahead_of_it_finishes() -> None:
    stages = Settled()
    long, short = doc("long", 16), doc("short", 1)
    logics = {d: reader(stages, turn=1) for d in ("long", "short")}
    assert activations(logics, [long, short]) == ["short", "long"]
    assert stages.read[:2] == [("long", 0), ("short", 0)]  # one turn each, then the rest
    assert len(stages.read) == 17

    # Without turns the long document is read through on arrival, as before.
    stages = Settled()
    logics = {d: reader(stages) for d in ("long", "short")}
    assert activations(logics, [long, short]) == ["long", "short"]
    assert all(lg.notify_at() is None for lg in logics.values())


def test_turns_change_when_chunks_are_read_never_what_a_document_gets() -> None:
    one_by_one = reader(Settled(), turn=1)
    at_once = reader(Settled())
    outs = one_by_one.on_item(doc("d", 5))[0], at_once.on_item(doc("d", 5))[0]
    while one_by_one.notify_at() is not None:
        outs[0].extend(one_by_one.on_notify()[0])
    read = [[(r.index, r.stage) for r in out if isinstance(r, ChunkResult)] for out in outs]
    assert read[0] == read[1] and len(read[0]) == 5


def test_at_the_end_of_the_input_every_waiting_chunk_is_read_at_once() -> None:
    stages = Settled()
    logic = reader(stages, turn=1)
    logic.on_item(doc("d", 4))
    assert len(stages.read) == 1 and logic.notify_at() is not None
    out, discard = logic.on_eof()  # a drain or the end of a bounded run: no more turns
    assert len(stages.read) == 4 and len(out) == 1 + 4  # the outcome, 4 results
    assert discard is CascadeLogic.DISCARD
