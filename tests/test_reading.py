"""The certified document stop: the pure rule, the cascade reading a document in order up
to it, and the certification that chooses it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import word_chunker, word_doc

from kascade.operators.cascade import CascadeLogic
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, Outcome
from kascade.operators.reading import STOP_PATH, Seen, first_stop, stop_label
from kascade.operators.reduce import AssembleLogic, Labeling
from kascade.operators.verdicts import Verdict
from kascade.schemas import (
    Aggregation,
    DeadLetter,
    DeadLetterReason,
    ModelIdentity,
    StopReason,
)
from kascade.schemas.cascade import StopRule
from kascade.toolchain.certify import CalibrationTooSmall
from kascade.toolchain.document_stop import Document, certify_stop, replay

TM = Aggregation.TOKEN_MEAN
A, B = np.array([0.95, 0.05]), np.array([0.05, 0.95])
MILD_A = np.array([0.6, 0.4])
TWO = StopRule(min_chunks=2, min_lead=0.5)


def settled(p: np.ndarray, n: int = 100) -> Seen:
    return Seen(True, p, n)


def uncertain(p: np.ndarray = MILD_A, n: int = 100) -> Seen:
    return Seen(False, p, n)


# --- the rule ---------------------------------------------------------------------------


def test_agreeing_settled_chunks_stop_the_read_once_the_window_is_full() -> None:
    assert stop_label(TWO, [settled(A)], TM) is None
    assert stop_label(TWO, [settled(A), settled(A)], TM) == 0
    assert first_stop(TWO, [settled(B)] * 6, TM) == 2


def test_an_uncertain_chunk_in_the_window_never_stops_the_read() -> None:
    assert stop_label(TWO, [settled(A), uncertain(A)], TM) is None
    assert stop_label(TWO, [uncertain(A), settled(A)], TM) is None
    assert first_stop(TWO, [settled(A), uncertain(A)] * 5, TM) is None


def test_settled_chunks_that_disagree_never_stop_the_read() -> None:
    assert stop_label(TWO, [settled(A), settled(B)], TM) is None
    assert first_stop(TWO, [settled(A), settled(B)] * 5, TM) is None


def test_a_chunk_the_cheap_stages_failed_on_never_stops_the_read() -> None:
    failed = Seen(False, None, 100)
    assert first_stop(TWO, [failed, settled(A), settled(A), settled(A)], TM) is None


def test_an_uncertain_opening_is_read_past_until_the_text_outweighs_it() -> None:
    """Mail headers the cheap heads are unsure of (leaning to topic 0), then a text about
    topic 1. (An opening they settle confidently and wrongly is the certification's to
    catch: no rule can tell it from the text.)"""
    doc = [uncertain(MILD_A)] * 3 + [settled(B)] * 10
    n = first_stop(TWO, doc, TM)
    assert n is not None and n > 4  # not on the opening, nor as soon as B is in the window
    assert stop_label(TWO, doc[:n], TM) == 1


def test_a_topic_that_changes_halfway_is_not_stopped_before_the_change_by_a_long_window() -> None:
    half = [settled(A)] * 3 + [uncertain(MILD_A)] + [settled(B)] * 3
    assert first_stop(StopRule(min_chunks=4, min_lead=0.6), half, TM) is None


def test_the_lead_is_that_of_everything_read_not_just_the_window() -> None:
    uncertain_b = uncertain(np.array([0.0, 1.0]), n=300)
    assert stop_label(TWO, [uncertain_b, settled(A), settled(A)], TM) is None
    assert stop_label(StopRule(min_chunks=2, min_lead=0.0), [settled(A)] * 2, TM) == 0


def test_a_window_chunk_the_on_topic_head_doubts_never_stops_the_read() -> None:
    rule = StopRule(min_chunks=1, min_lead=0.5, min_on_topic=0.8)
    header = Seen(True, A, 100, on_topic=0.2)  # settled confidently, but looks like headers
    assert first_stop(rule, [header, header, header] + [Seen(True, A, 100, 0.95)] * 3, TM) == 4
    assert stop_label(StopRule(min_chunks=1, min_lead=0.5), [header], TM) == 0


def test_on_topic_targets_mark_the_chunks_whose_label_is_not_their_documents() -> None:
    from kascade.toolchain.document_stop import on_topic_targets
    from kascade.toolchain.features import Features

    full = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.1, 0.9], [0.8, 0.2]])
    f = Features(
        embeddings=np.zeros((5, 2)),
        hidden=np.zeros((5, 2)),
        target=full.argmax(1),
        tokens=np.full(5, 100),
        source=np.array([0, 0, 0, 0, 1]),
        full=full,
        ends=np.arange(5),
        text_tokens=np.full(5, 400),
    )
    assert on_topic_targets(f, TM).tolist() == [0, 1, 1, 1, 1]


def test_the_path_starts_conservative_and_ends_aggressive() -> None:
    assert STOP_PATH[0].min_chunks == max(r.min_chunks for r in STOP_PATH)
    assert STOP_PATH[-1].min_chunks == 1
    assert len(set(STOP_PATH)) == len(STOP_PATH)
    asking = [r.min_on_topic > 0 for r in STOP_PATH]
    assert asking == sorted(asking, reverse=True)  # the on-topic rules come first


# --- the cascade reading in order --------------------------------------------------------


class Stages:
    def __init__(self, verdicts: list[Verdict]) -> None:
        self.verdicts, self.read = verdicts, []

    def __call__(self, t: ChunkTask) -> Verdict:
        self.read.append(t.index)
        return self.verdicts[t.index]


def clear_doc(chunks: int = 6) -> Stages:
    return Stages([Verdict("s1", B)] * chunks)


def reader(stages: Stages, max_chunks: int = 256, **kw) -> CascadeLogic:
    """The cascade over texts of words, 100 tokens a chunk (:func:`helpers.word_chunker`)."""
    return CascadeLogic(stages, word_chunker(100), max_chunks, TM, **kw)


def read(logic: CascadeLogic, words: int = 600) -> list:
    return logic.on_item(word_doc("doc", words))[0]


def outcome_of(out: list) -> tuple[Outcome | None, list]:
    """The document's one outcome (once decided), and the other items in order."""
    outcomes = [x for x in out if isinstance(x, Outcome)]
    assert len(outcomes) <= 1, outcomes
    return (outcomes[0] if outcomes else None), [x for x in out if not isinstance(x, Outcome)]


def test_a_clear_document_stops_and_the_rest_is_never_computed_nor_tokenized() -> None:
    stages = clear_doc(60)
    logic = reader(stages, stop=TWO)
    outcome, out = outcome_of(read(logic, 6000))
    assert stages.read == [0, 1]
    assert [(r.index, r.stage) for r in out] == [(0, "s1"), (1, "s1")]
    assert outcome is not None and not outcome.suspended
    reading = outcome.reading
    assert reading is not None and reading.stopped is StopReason.CERTAIN
    assert (reading.chunks_read, reading.tokens_read) == (2, 200)
    # The text was tokenized as far as the two chunks and the sight of a third, no further:
    # its totals in tokens and chunks are not known; in characters they are.
    assert logic.state is not None and 200 < len(logic.state.text.ids) < 1000
    assert (reading.chunks_total, reading.tokens_total) == (None, None)
    assert (reading.chars_read, reading.chars_total) == (2 * 200 - 1, 2 * 6000 - 1)
    assert logic.state.decided


def test_a_stop_reports_the_totals_where_reading_reached_the_end_of_the_text() -> None:
    outcome, _ = outcome_of(read(reader(clear_doc(3), stop=TWO), 250))
    assert outcome is not None and outcome.reading is not None
    assert outcome.reading.stopped is StopReason.CERTAIN
    assert (outcome.reading.chunks_total, outcome.reading.tokens_total) == (3, 250)


def test_the_state_is_dropped_once_the_document_is_decided() -> None:
    logic = reader(clear_doc(), stop=TWO, turn=1)
    assert logic.on_item(word_doc("doc", 600))[1] is CascadeLogic.RETAIN  # one chunk read
    assert logic.on_notify()[1] is CascadeLogic.DISCARD  # the second: the stop


def test_uncertain_chunks_read_before_a_stop_keep_their_cheap_estimate() -> None:
    stages = Stages([Verdict("uncertain", MILD_A)] + [Verdict("s0", A)] * 5)
    _, out = outcome_of(read(reader(stages, stop=TWO)))
    assert [(r.index, r.stage) for r in out] == [(0, "skipped"), (1, "s0"), (2, "s0")]
    assert not any(isinstance(x, Escalation) for x in out)


def test_without_a_stop_every_chunk_is_read_and_uncertain_ones_escalated() -> None:
    stages = Stages([Verdict("s1", B)] * 5 + [Verdict("uncertain", A, np.zeros(1))])
    outcome, out = outcome_of(read(reader(stages)))
    assert stages.read == list(range(6))
    assert outcome is not None and outcome.reading is not None
    assert outcome.reading.stopped is StopReason.END  # read to the end
    assert (outcome.reading.chunks_total, outcome.reading.tokens_total) == (6, 600)
    assert len(out) == 6  # a result or an escalation for every chunk


def test_replay_after_a_restart_reads_the_same_chunks_and_gives_the_same_results() -> None:
    verdicts = [Verdict("uncertain", MILD_A), Verdict("s0", B), Verdict("s1", B)] + [
        Verdict("s1", B)
    ] * 3
    straight = read(reader(Stages(verdicts), stop=TWO))
    first = reader(Stages(verdicts), stop=TWO, turn=1)
    read(first)
    first.on_notify()  # chunks 0 and 1 read before the snapshot
    resumed_stages = Stages(verdicts)
    resumed = reader(resumed_stages, stop=TWO, turn=1, state=first.snapshot())
    again = read(resumed)  # the input replayed from the snapshot
    while resumed.notify_at() is not None:
        again += resumed.on_notify()[0]
    assert resumed_stages.read == [2]
    (was, straight), (now, again) = outcome_of(straight), outcome_of(again)
    assert [(r.index, r.stage) for r in again] == [(r.index, r.stage) for r in straight]
    assert now == was and now is not None and now.reading is not None


def test_a_text_past_the_limit_is_labeled_when_its_stop_comes_before_the_limit() -> None:
    out = read(reader(clear_doc(9), max_chunks=3, stop=TWO), 900)
    assert [type(x) for x in out] == [Outcome, ChunkResult, ChunkResult]


def test_a_text_past_the_limit_without_a_stop_before_it_is_dead_lettered_too_long() -> None:
    stages = Stages([Verdict("s1", A), Verdict("s1", B), Verdict("s1", A)] * 3)
    (dead,) = read(reader(stages, max_chunks=3, stop=TWO), 900)
    assert isinstance(dead, DeadLetter) and dead.reason is DeadLetterReason.TOO_LONG
    assert "more than 3 chunks" in dead.detail and stages.read == [0, 1, 2]
    assert dead.original() == word_doc("doc", 900).origin.raw


def test_without_a_stop_a_text_over_the_limit_is_dead_lettered_before_any_chunk_is_read() -> None:
    stages = clear_doc(9)
    (dead,) = read(reader(stages, max_chunks=3), 900)
    assert isinstance(dead, DeadLetter) and dead.reason is DeadLetterReason.TOO_LONG
    assert dead.detail == "900 tokens make 9 chunks; the limit is 3" and stages.read == []


def test_a_text_the_tokenizer_fails_on_is_dead_lettered_with_the_reason() -> None:
    from tokenizers import Tokenizer

    class Failing:
        def encode(self, text: str, add_special_tokens: bool = True) -> Tokenizer:
            raise RuntimeError("cannot tokenize this")

    chunker = dataclasses.replace(word_chunker(100), tokenizer=Failing())
    (dead,) = CascadeLogic(clear_doc(), chunker, 256, TM, stop=TWO).on_item(word_doc("d", 600))[0]
    assert isinstance(dead, DeadLetter) and dead.reason is DeadLetterReason.PROCESSING
    assert dead.detail == "RuntimeError: cannot tokenize this"


def test_a_text_without_a_token_is_decided_at_once_with_nothing_to_read() -> None:
    stages = clear_doc()
    # Not blank, so the flow sends it to the cascade; the tokenizer makes no token of it.
    out, discard = reader(stages, stop=TWO).on_item(word_doc("d", 0, text="\u200b \u200b"))
    assert discard is CascadeLogic.DISCARD and stages.read == []
    (outcome,) = out
    assert isinstance(outcome, Outcome) and outcome.reading is not None
    assert (outcome.reading.chunks_read, outcome.reading.stopped) == (0, StopReason.END)


def test_the_reduce_completes_a_stopped_document_with_its_read_chunks() -> None:
    out = read(reader(clear_doc(60), stop=TWO), 6000)
    labeling = Labeling(
        labels=["a", "b"],
        aggregation=TM,
        model=ModelIdentity(name="m", variant="fp32", manifest_sha256="0" * 64),
    )
    assemble = AssembleLogic(labeling, now_ms=lambda: 0, with_outcome=True)
    outcome, chunks = outcome_of(out)
    assert outcome is not None
    assert assemble.on_item(chunks[0]) == ([], AssembleLogic.RETAIN)
    assert assemble.on_item(chunks[1]) == ([], AssembleLogic.RETAIN)  # how far: not yet said
    (labeled,), discard = assemble.on_item(outcome)
    assert discard is AssembleLogic.DISCARD
    record = labeled.record
    assert record.label == "b"
    assert record.chunks.total is None and record.chunks.unread is None
    assert record.chunks.settled_s1 == 2
    assert record.reading is not None and record.reading.skipped_tokens is None
    assert record.reading.skipped_chars == 2 * 6000 - 1 - (2 * 200 - 1)


# --- certification -----------------------------------------------------------------------


def doc(seen: list[Seen], full_label: int) -> Document:
    return Document(seen, full_label, [100 * (i + 1) for i in range(len(seen))], 100 * len(seen))


def test_replay_counts_stopped_documents_and_their_disagreements() -> None:
    docs = [doc([settled(A)] * 5, 0), doc([settled(A)] * 5, 1), doc([uncertain()] * 5, 0)]
    r = replay(TWO, docs, TM)
    assert (r.stopped, r.disagreements) == (2, 1)
    assert (r.chunks_read, r.chunks) == (2 + 2 + 5, 15)
    assert (r.tokens_read, r.tokens) == (200 + 200 + 500, 1500)


def test_certification_refuses_too_few_documents_saying_how_many_it_needs() -> None:
    docs = [doc([settled(A)] * 5, 0)] * 100
    with pytest.raises(CalibrationTooSmall, match="needs >= 299 documents stopped early"):
        certify_stop(docs, aggregation=TM, epsilon=0.01, delta=0.05)


def test_certification_skips_rules_that_stop_boilerplate_openings_wrongly() -> None:
    """Clear documents, and documents whose 2-chunk opening settles as the wrong topic:
    two-chunk rules stop those wrongly, so the path ends before them."""
    clear = [doc([settled(A)] * 10, 0)] * 400
    boiler = [doc([settled(B), settled(B)] + [settled(A)] * 8, 0)] * 100
    stop = certify_stop(clear + boiler, aggregation=TM, epsilon=0.02, delta=0.05)
    assert stop.rule.min_chunks >= 3 and stop.disagreements == 0
    assert stop.stopped == 500 and stop.documents == 500
    assert 0 < stop.tokens_read_share < 0.5


def test_a_certified_stop_holds_on_fresh_documents() -> None:
    """Seeded simulation: documents whose opening chunks are settled at random (sometimes
    wrongly). Over many calibration draws, the true disagreement of the stopped documents
    at the certified rule exceeds epsilon in at most about delta of them."""
    epsilon, delta, n_cal = 0.05, 0.1, 400
    rng = np.random.default_rng(7)

    def draw(n: int) -> list[Document]:
        docs = []
        for _ in range(n):
            label = int(rng.integers(2))
            seen = []
            for _ in range(8):
                r = rng.random()
                if r < 0.12:
                    seen.append(settled(B if label == 0 else A))  # confidently wrong
                elif r < 0.75:
                    seen.append(settled(A if label == 0 else B))
                else:
                    seen.append(uncertain())
            docs.append(doc(seen, label))
        return docs

    path = tuple(r for r in STOP_PATH if r.min_on_topic == 0)  # no on-topic head here
    fresh = draw(6000)
    truth = {rule: replay(rule, fresh, TM) for rule in path}
    violations = certified = 0
    for _ in range(60):
        try:
            stop = certify_stop(
                draw(n_cal), aggregation=TM, epsilon=epsilon, delta=delta, path=path
            )
        except CalibrationTooSmall:
            continue
        certified += 1
        t = truth[stop.rule]
        violations += t.disagreements / t.stopped > epsilon
    assert certified > 40
    assert violations / certified <= delta + 3 * np.sqrt(delta * (1 - delta) / certified)


def test_related_documents_count_as_one_draw_so_a_wrong_rule_certifies_at_most_delta() -> None:
    """Seeded simulation of translations: every document of a group reads alike and is
    right or wrong together (one text's opening fools the stop in every language). The
    rule stops 6% of texts wrongly, above epsilon 5%, so every certificate is wrong.
    Counted one by one, 30 texts in 20 languages look like 600 draws and certify the
    wrong rule in far more than delta of calibrations; counted once per group they
    cannot (30 draws are too few), and 100 texts in 6 languages certify it in <= delta."""
    epsilon, delta = 0.05, 0.05
    rng = np.random.default_rng(11)

    def draw(texts: int, languages: int, grouped: bool) -> list[Document]:
        docs = []
        for g in range(texts):
            label = int(rng.integers(2))
            right, wrong = (A, B) if label == 0 else (B, A)
            opening = wrong if rng.random() < 0.06 else right
            text = doc([settled(opening)] * 2 + [settled(right)] * 4, label)
            docs += [dataclasses.replace(text, group=g if grouped else None)] * languages
        return docs

    def certified(texts: int, languages: int, grouped: bool, calibrations: int = 300) -> float:
        wrong = 0
        for _ in range(calibrations):
            try:
                stop = certify_stop(
                    draw(texts, languages, grouped), aggregation=TM, epsilon=epsilon,
                    delta=delta, path=(TWO,),
                )  # fmt: skip
            except CalibrationTooSmall:
                continue
            assert stop.draws == texts * (1 if grouped else languages)
            assert stop.documents == texts * languages
            wrong += 1
        return wrong / calibrations

    assert certified(30, 20, grouped=False) > 0.3  # the overstated evidence
    assert certified(30, 20, grouped=True) == 0
    assert certified(100, 6, grouped=True) <= delta + 3 * np.sqrt(delta * (1 - delta) / 300)


def test_a_group_too_small_to_certify_is_named_in_the_refusal() -> None:
    clean = doc([settled(A)] * 4, 0)
    docs = [dataclasses.replace(clean, group=g) for g in range(50) for _ in range(10)]
    assert certify_stop([clean] * 500, aggregation=TM, epsilon=0.05, delta=0.05).draws == 500
    with pytest.raises(
        CalibrationTooSmall, match=r"on 50 independent documents \(500 documents in 50 groups"
    ):
        certify_stop(docs, aggregation=TM, epsilon=0.05, delta=0.05)
    more = docs + [dataclasses.replace(clean, group=g) for g in range(50, 70) for _ in range(10)]
    stop = certify_stop(more, aggregation=TM, epsilon=0.05, delta=0.05)
    assert (stop.documents, stop.draws, stop.stopped, stop.disagreements) == (700, 70, 70, 0)
