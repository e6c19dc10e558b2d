"""The live test as a step of the flow: every audit the full model made goes to the job's
one test of the certified bounds (:class:`~kascade.operators.bound.Watch`, kept as the
flow's state under one key, so a restart resumes it from the snapshot).

Two kinds of audit reach it. A settled chunk the full model classified again counts in
the test of the chunk bound. A document the certified stop ended early that the full
model read to its end (:func:`~kascade.operators.full_model.read_through`) counts in the
test of the stop: whether the label a full read gives is the label the stop gave.
"""

from __future__ import annotations

import functools
import logging

import bytewax.operators as op
from bytewax.dataflow import Stream, operator

from kascade.operators import metrics
from kascade.operators.bound import Watch
from kascade.operators.calibration import Cascade
from kascade.operators.guarantee import Guard
from kascade.operators.items import ChunkResult, StopChecked

log = logging.getLogger(__name__)

# Every audit of the job goes to one test, kept as the flow's state under this key.
LIVE_TEST = "bound"


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
    checked: Stream[StopChecked],
    guard: Guard,
    in_force: Cascade,
) -> Stream[ChunkResult]:
    """The audits among the full model's results, and the stopped documents it read to
    their end, counted in the job's test; the other results (the chunks the cascade
    escalated) go on."""
    audits = op.branch("is_audit", full, lambda r: r.audit_of is not None)
    counted = op.merge("audited", audits.trues, checked)
    one_test = op.key_on("to_the_test", counted, lambda _r: LIVE_TEST)
    op.stateful_map("count", one_test, functools.partial(_count, guard, in_force))
    return audits.falses
