"""The verdict source: S0 then S1 on one chunk, and a document's verdicts so far.

S0 reads the mean of the embedding layer's output (a Gather and a LayerNorm:
microseconds); S1 reads the mean hidden state after ``cascade_layer`` (the prefix graph).
A stage settles a chunk when its head's top probability reaches the stage's calibrated
threshold; otherwise the chunk stays uncertain, with S1's estimate and the prefix's
output kept so the full model's suffix computes nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kascade.operators import metrics
from kascade.operators.audits import audit_pick
from kascade.operators.calibration import Cascade, on_topic_of, pooled
from kascade.operators.encoder import Encoder
from kascade.operators.items import ChunkTask, DocMeta, Origin
from kascade.operators.pieces import TextTokens
from kascade.operators.reading import Seen
from kascade.schemas import Stage


@dataclass(frozen=True)
class Verdict:
    """What the cheap stages concluded about one chunk."""

    stage: Stage  # S0, S1 (settled) or UNCERTAIN
    probs: np.ndarray | None  # None: the cheap stages failed on this chunk
    hidden: np.ndarray | None = None  # prefix output, kept for escalation
    on_topic: float = 1.0  # the document stop's on-topic head, where it has one

    def settled_probs(self) -> np.ndarray:
        """The answer of a settled verdict (settling needs one: a failed chunk stays
        uncertain)."""
        if self.probs is None:
            raise ValueError(f"a verdict of stage {self.stage} without probabilities")
        return self.probs

    def seen(self, n_tokens: int) -> Seen:
        """What the document stop reads of this verdict."""
        return Seen(self.stage != Stage.UNCERTAIN, self.probs, n_tokens, self.on_topic)


@dataclass
class CascadeState:
    """One document: its text, tokenized as far as it is read, the chunks made of it, and
    the cheap verdicts of those read so far (in order: chunk ``i`` is read only after
    chunks ``0..i-1``)."""

    meta: DocMeta
    tasks: dict[int, ChunkTask] = field(default_factory=dict)
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    decided: bool = False  # labeled, escalated or dead-lettered: reading is over
    suspended: bool = False  # a chunk was read while the live test suspended the stages
    text: TextTokens | None = None
    origin: Origin | None = None  # the input record, for its dead letters

    @property
    def read(self) -> int:
        return len(self.verdicts)


CheapStages = Callable[[ChunkTask], Verdict]


def cheap_stages(encoder: Encoder, cascade: Cascade, audit_fraction: float) -> CheapStages:
    """S0 then S1 on one chunk, with the real graphs and heads."""

    def run(task: ChunkTask) -> Verdict:
        t0, t1 = cascade.thresholds(task.doc.lang, task.doc.total_chunks)
        ids = task.ids.reshape(1, -1)
        mask = np.ones_like(ids)
        with metrics.STAGE_SECONDS.labels(Stage.S0).time():
            emb = encoder.embeddings(ids, mask)
            features = pooled(emb)
            p0 = cascade.s0.probs(features)
            on_topic = 1.0 if cascade.on_topic is None else on_topic_of(cascade.on_topic, features)
        if p0.max() >= t0:
            return Verdict(Stage.S0, p0, on_topic=on_topic)
        with metrics.STAGE_SECONDS.labels(Stage.S1).time():
            hidden = encoder.prefix(emb, mask)
            p1 = cascade.s1.probs(pooled(hidden))
        if p1.max() >= t1:
            keep = audit_pick(task.doc.id, task.index, audit_fraction)
            return Verdict(Stage.S1, p1, hidden if keep else None, on_topic)
        return Verdict(Stage.UNCERTAIN, p1, hidden, on_topic)

    return run
