"""The two exit rules and the turns, each on its own: what a document's reading ends
with, and when its chunks are read (never what they give)."""

from __future__ import annotations

import numpy as np

from kascade.operators.exits import certified_stop, read_all, stop_reached
from kascade.operators.items import ChunkResult, ChunkTask, DocMeta, Escalation, Outcome
from kascade.operators.turns import Turns
from kascade.operators.verdicts import CascadeState, Verdict
from kascade.schemas import Aggregation, Reading, StopReason
from kascade.schemas.cascade import StopRule

META = DocMeta(id="d", total_chunks=4, lang=None, metadata=None, timestamp_ms=None, text_tokens=400)


def state(*verdicts: Verdict, suspended: bool = False) -> CascadeState:
    s = CascadeState(META, suspended=suspended)
    for i, v in enumerate(verdicts):
        s.tasks[i] = ChunkTask(META, i, np.arange(100), 100, end_token=100 * (i + 1))
        s.verdicts[i] = v
    return s


TO_THE_END = Reading(
    chunks_read=2, chunks_total=2, tokens_read=200, tokens_total=200, stopped=StopReason.END
)
SURE_B = Verdict("s1", np.array([0.05, 0.95]))
UNSURE = Verdict("uncertain", np.array([0.45, 0.55]), np.zeros(1))


def test_the_certified_stop_says_how_far_it_read_first_and_keeps_cheap_estimates() -> None:
    s = state(SURE_B, UNSURE)
    reading = Reading(chunks_read=2, tokens_read=200, stopped=StopReason.CERTAIN)
    out = certified_stop(s, reading, audit_fraction=0.0)
    assert isinstance(out[0], Outcome) and out[0].reading is not None
    assert out[0].reading.stopped is StopReason.CERTAIN
    assert (out[0].reading.chunks_read, out[0].reading.tokens_read) == (2, 200)
    assert [(r.index, r.stage) for r in out[1:] if isinstance(r, ChunkResult)] == [
        (0, "s1"),
        (1, "skipped"),
    ]


def test_a_stop_rule_is_reached_only_when_the_verdicts_read_make_the_label_certain() -> None:
    rule = StopRule(min_chunks=2, min_lead=0.5)
    assert stop_reached(rule, state(SURE_B, SURE_B), Aggregation.TOKEN_MEAN) == 1  # its label
    assert stop_reached(rule, state(SURE_B, UNSURE), Aggregation.TOKEN_MEAN) is None


def test_reading_everything_escalates_an_uncertain_chunk_that_could_change_the_label() -> None:
    out = read_all(state(SURE_B, UNSURE), TO_THE_END, Aggregation.TOKEN_MEAN, audit_fraction=0.0)
    assert isinstance(out[0], Outcome) and out[0].reading is TO_THE_END
    assert [type(x) for x in out[1:]] == [ChunkResult, Escalation]


def test_the_outcome_says_when_the_live_test_had_suspended_the_cheap_stages() -> None:
    out = read_all(
        state(UNSURE, suspended=True), TO_THE_END, Aggregation.TOKEN_MEAN, audit_fraction=0.0
    )
    assert isinstance(out[0], Outcome) and out[0].suspended


def test_every_settled_chunk_is_audited_at_fraction_one() -> None:
    out = read_all(state(SURE_B, SURE_B), TO_THE_END, Aggregation.TOKEN_MEAN, audit_fraction=1.0)
    audits = [x for x in out if isinstance(x, Escalation)]
    assert [(a.task.index, a.audit_of) for a in audits] == [(0, 1), (1, 1)]


def test_turns_let_a_document_read_its_share_then_wait_for_the_next_turn() -> None:
    turns = Turns(size=1)
    assert [turns.take(), turns.take()] == [True, False]
    assert turns.notify_at(waiting=True) is not None
    assert turns.notify_at(waiting=False) is None
    turns.next_turn()
    assert turns.take()
    turns.end()  # the end of the input: whatever is ready is read at once
    assert all(turns.take() for _ in range(10)) and turns.notify_at(waiting=True) is None
