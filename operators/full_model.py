"""The full model as a Bytewax operator: each worker process holds one encoder and
classifies whichever chunks land on it, one per call or in length-sorted micro-batches.
"""

from __future__ import annotations

import functools
from pathlib import Path

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator

from operators import metrics
from operators.encoder import Encoder, Graphs, load_model_dir, softmax
from operators.items import ChunkResult, ChunkTask
from schemas.settings import EncoderSettings


@functools.lru_cache(maxsize=2)
def worker_encoder(model_dir: str, threads: int, graphs: Graphs = "full") -> Encoder:
    """One encoder per worker process and model, created on first use.

    The flow builder verifies the manifest before anything runs, so workers skip the
    second hash pass over the graphs.
    """
    return Encoder(load_model_dir(model_dir, verify=False), threads=threads, graphs=graphs)


def _classify_all(encoder: Encoder, tasks: list[ChunkTask], micro_batch: int) -> list[ChunkResult]:
    if micro_batch > 1:
        # Length-sorted so each padded batch wastes as little as possible.
        tasks = sorted(tasks, key=lambda t: t.n_tokens)
    out: list[ChunkResult] = []
    for start in range(0, len(tasks), micro_batch):
        group = tasks[start : start + micro_batch]
        try:
            with metrics.STAGE_SECONDS.labels("full_model").time():
                if len(group) == 1:
                    logits = encoder.logits(group[0].ids)[None, :]
                else:
                    logits = encoder.logits_batch([t.ids for t in group])
            probs = softmax(logits.astype(np.float64))
            out.extend(
                ChunkResult(t.doc, t.index, t.n_tokens, p, stage="full")
                for t, p in zip(group, probs, strict=True)
            )
        except Exception as e:  # a failed call is data: the document is marked degraded
            metrics.CHUNK_FAILURES.inc(len(group))
            reason = f"full model failed: {type(e).__name__}: {e}"[:500]
            out.extend(
                ChunkResult(t.doc, t.index, t.n_tokens, None, stage="full", error=reason)
                for t in group
            )
    metrics.CHUNKS_FULL_MODEL.inc(len(tasks))
    return out


@operator
def classify(
    step_id: str, up: Stream[ChunkTask], model_dir: Path, settings: EncoderSettings
) -> Stream[ChunkResult]:
    """The full model on each chunk, on whichever worker the chunk landed."""

    def run_batch(tasks: list[ChunkTask]) -> list[ChunkResult]:
        encoder = worker_encoder(str(model_dir), settings.threads)
        return _classify_all(encoder, tasks, settings.micro_batch)

    return op.flat_map_batch("full_model", up, run_batch)
