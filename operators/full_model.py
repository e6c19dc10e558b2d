"""The full model as a Bytewax operator: each worker process holds one encoder and
classifies whichever chunks land on it, one per call or in length-sorted micro-batches.
"""

from __future__ import annotations

import functools

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator

from kascade.operators import inflight, metrics
from kascade.operators.aggregation import STRATEGIES
from kascade.operators.encoder import Encoder, Graphs, Loaded, softmax
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, FullRead, StopChecked
from kascade.schemas import Stage
from kascade.schemas.engine import Engine
from kascade.schemas.settings import EncoderSettings


@functools.lru_cache(maxsize=2)
def worker_encoder(
    model: Loaded, threads: int, graphs: Graphs = "full", engine: Engine | None = None
) -> Encoder:
    """One encoder per process and model, created on first use, from the model the run
    loaded and verified once (its manifest and tokenizer are not read again)."""
    return Encoder(model, threads=threads, graphs=graphs, engine=engine)


Work = ChunkTask | Escalation


Unpacked = tuple[ChunkTask, np.ndarray | None, np.ndarray | None, int | None]


def _unpack(item: Work) -> Unpacked:
    if isinstance(item, Escalation):
        return item.task, item.hidden, item.fallback, item.audit_of
    return item, None, None, None


def _one(encoder: Encoder, task: ChunkTask, hidden: np.ndarray | None) -> np.ndarray:
    """One chunk's logits: the suffix graph on the prefix's output where it was kept, else
    the whole model on its tokens."""
    if hidden is None:
        return encoder.logits(task.ids)
    return encoder.suffix(hidden, np.ones(hidden.shape[:2], dtype=np.int64))[0]


def _classify_all(encoder: Encoder, items: list[Work], micro_batch: int) -> list[ChunkResult]:
    """Full-model results for ``items``; a failed call yields an error result, never raises.

    Escalations carrying the prefix's output run only the suffix graph. Plain chunks run
    one per call, or in length-sorted padded batches when ``micro_batch`` > 1.
    """
    work = [_unpack(x) for x in items]
    singles = [w for w in work if w[1] is not None]
    plain = [w for w in work if w[1] is None]
    if micro_batch > 1:
        plain.sort(key=lambda w: w[0].n_tokens)  # padded batches waste as little as possible
    groups = [[w] for w in singles]
    groups += [plain[i : i + micro_batch] for i in range(0, len(plain), micro_batch)]
    out: list[ChunkResult] = []
    for group in groups:
        # A crash inside a padded batch names no single record, so only singles are noted.
        suspect = group[0][0].doc.source if len(group) == 1 else None
        try:
            with (
                metrics.STAGE_SECONDS.labels("full_model").time(),
                inflight.inside(suspect, "full_model"),
            ):
                if len(group) == 1:
                    logits = _one(encoder, group[0][0], group[0][1])[None, :]
                else:
                    logits = encoder.logits_batch([w[0].ids for w in group])
            probs = softmax(logits.astype(np.float64))
            out.extend(
                ChunkResult(t.doc, t.index, t.n_tokens, p, Stage.FULL, audit_of=audit)
                for (t, _, _, audit), p in zip(group, probs, strict=True)
            )
        except Exception as e:  # a failed call is data: the document is marked degraded
            metrics.CHUNK_FAILURES.inc(len(group))
            reason = f"full model failed: {type(e).__name__}: {e}"[:500]
            out.extend(
                # The cheap estimate stands where there is one (degradation contract).
                ChunkResult(
                    t.doc,
                    t.index,
                    t.n_tokens,
                    fallback,
                    stage=Stage.FULL if fallback is None else Stage.S1,
                    error=reason,
                    audit_of=audit,
                )
                for t, _, fallback, audit in group
            )
    # Audits check the cascade; they are not chunks it sent to the full model.
    metrics.CHUNKS_FULL_MODEL.inc(sum(1 for w in work if w[3] is None))
    return out


def read_through(encoder: Encoder, read: FullRead) -> list[StopChecked]:
    """Whether a full read of a stopped document gives the stop's label: its chunks in
    order, only until no answer for the rest could change that label
    (:meth:`~kascade.operators.aggregation.Strategy.decided`, exact), so a document the
    stop was right on costs about half a full read. A failed call costs the audit only:
    no verdict, never a raise."""
    strategy = STRATEGIES[read.strategy]
    weights = np.asarray([float(max(t.n_tokens, 1)) for t in read.tasks])
    doc = read.tasks[0].doc
    probs: list[np.ndarray] = []
    try:
        with (
            metrics.STAGE_SECONDS.labels("read_stopped").time(),
            inflight.inside(doc.source, "read_stopped"),
        ):
            for t in read.tasks:
                known = len(probs)
                if probs and strategy.decided(
                    np.stack(probs), weights[:known], list(weights[known:])
                ):
                    break
                logits = _one(encoder, t, read.hidden.get(t.index))
                probs.append(softmax(logits.astype(np.float64)))
    except Exception:  # the live test's audit is lost, never the worker
        metrics.CHUNK_FAILURES.inc()
        return []
    label, _ = strategy.combine(np.stack(probs), weights[: len(probs)])
    return [StopChecked(doc, label == read.label)]


@operator
def classify(
    step_id: str,
    up: Stream[Work],
    model: Loaded,
    settings: EncoderSettings,
    engine: Engine,
    graphs: Graphs = "full",
) -> Stream[ChunkResult]:
    """The full model on each chunk, on whichever worker the chunk landed, run by
    ``engine`` (resolved once by the driver from ``settings``)."""

    def run_batch(items: list[Work]) -> list[ChunkResult]:
        encoder = worker_encoder(model, settings.threads, graphs, engine)
        return _classify_all(encoder, items, settings.micro_batch)

    return op.flat_map_batch("full_model", up, run_batch)


@operator
def read_stopped(
    step_id: str,
    up: Stream[FullRead],
    model: Loaded,
    settings: EncoderSettings,
    engine: Engine,
    graphs: Graphs = "full",
) -> Stream[StopChecked]:
    """Each stopped document the live test drew, read to its end (as far as its label
    needs) on whichever worker it landed (:func:`read_through`)."""

    def run(read: FullRead) -> list[StopChecked]:
        return read_through(worker_encoder(model, settings.threads, graphs, engine), read)

    return op.flat_map("read_through", up, run)
