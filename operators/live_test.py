"""The live test as a step of the flow: every audit the full model made goes to the job's
one test of the certified bounds (:class:`~kascade.operators.bound.Watch`, kept as the
flow's state under one key, so a restart resumes it from the snapshot).

Two kinds of audit reach it. A settled chunk the full model classified again counts in
the test of the chunk bound. A document the certified stop ended early that the full
model read to its end (every chunk, :func:`~kascade.operators.exits.full_read`) counts in
the test of the stop once all its chunks are back: whether the label a full read gives is
the label the stop gave (:func:`gather`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator

from kascade.operators import metrics
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.bound import Watch
from kascade.operators.calibration import Cascade
from kascade.operators.guarantee import Guard
from kascade.operators.items import ChunkResult, DocMeta
from kascade.schemas import Aggregation

log = logging.getLogger(__name__)

# Every audit of the job goes to one test, kept as the flow's state under this key.
LIVE_TEST = "bound"


@dataclass(frozen=True)
class StopChecked:
    """A stopped document read to its end by the full model: did the label agree?"""

    doc: DocMeta
    agree: bool


Read = dict[int, ChunkResult]  # a stopped document's full-model results so far, by chunk


def gather(
    strategy: Aggregation, got: Read | None, result: ChunkResult
) -> tuple[Read | None, list[StopChecked]]:
    """One chunk of a stopped document's full read; once every chunk is back, whether the
    full read's label (``strategy`` over the chunks, as the stop was certified) is the
    stop's. A document the full model failed on counts in no test.

    >>> from kascade.operators.items import StopAudit
    >>> from kascade.schemas import Stage
    >>> doc, audit = DocMeta("d", 2, "en", None, None), StopAudit(label=0, chunks=2)
    >>> def r(i, p):
    ...     return ChunkResult(doc, i, 100, np.array(p), Stage.FULL, stop_audit=audit)
    >>> got, checked = gather(Aggregation.TOKEN_MEAN, None, r(1, [0.2, 0.8]))
    >>> checked, gather(Aggregation.TOKEN_MEAN, got, r(0, [0.9, 0.1]))[1][0].agree
    ([], True)
    """
    audit = result.stop_audit
    assert audit is not None
    got = {**(got or {}), result.index: result}
    if len(got) < audit.chunks:
        return got, []
    read = [got[i] for i in sorted(got)]
    if any(r.probs is None or r.error is not None for r in read):
        return None, []
    probs = np.stack([r.probs for r in read if r.probs is not None]).astype(np.float64)
    weights = np.asarray([max(r.n_tokens, 1) for r in read], dtype=np.float64)
    winner, _ = STRATEGIES[strategy].combine(probs, weights)
    return None, [StopChecked(result.doc, winner == audit.label)]


def _count(
    guard: Guard, in_force: Cascade, state: Watch | None, item: ChunkResult | StopChecked
) -> tuple[Watch, None]:
    """One audit counted in the job's test (on another calibration it starts over)."""
    guard.resume(state)
    try:
        if isinstance(item, StopChecked):
            metrics.STOP_AUDITS.labels(str(item.agree).lower()).inc()
            guard.audit_stop(item.agree)
        elif item.probs is not None:
            agree = int(item.probs.argmax()) == item.audit_of
            metrics.AUDITS.labels(str(agree).lower()).inc()
            guard.audit(agree, in_force.scope_of(item.doc.lang, item.doc.total_chunks))
    except Exception:  # bookkeeping of the live test never costs a worker or a record
        log.exception("the live test of the bound could not count an audit")
    return guard.watch, None


@operator
def live_test(
    step_id: str,
    full: Stream[ChunkResult],
    guard: Guard,
    in_force: Cascade,
    strategy: Aggregation,
) -> Stream[ChunkResult]:
    """The audits among the full model's results counted in the job's test; the other
    results (the chunks the cascade escalated) go on."""
    audits = op.branch(
        "is_audit", full, lambda r: r.audit_of is not None or r.stop_audit is not None
    )
    stops = op.branch("of_stop", audits.trues, lambda r: r.stop_audit is not None)
    by_doc = op.key_on("by_record", stops.trues, lambda r: r.doc.unit)
    read = op.stateful_flat_map("full_read", by_doc, functools.partial(gather, strategy))
    checked = op.key_rm("checked", read)
    counted = op.merge("audited", stops.falses, checked)
    one_test = op.key_on("to_the_test", counted, lambda _r: LIVE_TEST)
    op.stateful_map("count", one_test, functools.partial(_count, guard, in_force))
    return audits.falses
