"""The full model as a Bytewax operator: each worker process holds one encoder and
classifies whichever chunks land on it, one per call or in length-sorted micro-batches.
"""

from __future__ import annotations

import functools

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator

from kascade.operators import inflight, metrics
from kascade.operators.encoder import Encoder, Graphs, Loaded, softmax
from kascade.operators.items import ChunkResult, ChunkTask, Escalation, StopAudit
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


Unpacked = tuple[ChunkTask, np.ndarray | None, np.ndarray | None, int | None, StopAudit | None]


def _unpack(item: Work) -> Unpacked:
    if isinstance(item, Escalation):
        return item.task, item.hidden, item.fallback, item.audit_of, item.stop_audit
    return item, None, None, None, None


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
                if group[0][1] is not None:
                    hidden = group[0][1]
                    mask = np.ones(hidden.shape[:2], dtype=np.int64)
                    logits = encoder.suffix(hidden, mask)
                elif len(group) == 1:
                    logits = encoder.logits(group[0][0].ids)[None, :]
                else:
                    logits = encoder.logits_batch([w[0].ids for w in group])
            probs = softmax(logits.astype(np.float64))
            out.extend(
                ChunkResult(
                    t.doc, t.index, t.n_tokens, p, Stage.FULL, audit_of=audit, stop_audit=stop
                )
                for (t, _, _, audit, stop), p in zip(group, probs, strict=True)
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
                    stop_audit=stop,
                )
                for t, _, fallback, audit, stop in group
            )
    # Audits check the cascade; they are not chunks it sent to the full model.
    metrics.CHUNKS_FULL_MODEL.inc(sum(1 for w in work if w[3] is None and w[4] is None))
    return out


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
