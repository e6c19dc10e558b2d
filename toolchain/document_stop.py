"""Certifying the document stop on unlabeled multi-chunk documents.

Each calibration document is replayed as a run reads it: its chunks in order through
the cheap stages at the certified chunk thresholds, the stop rule asked after each
(:func:`kascade.operators.reading.first_stop`). Its reference is the label the full
model gives reading every chunk, combined by the run's aggregation. The rules of
:data:`~kascade.operators.reading.STOP_PATH` are tested in order with the same exact
binomial tests as the chunk thresholds: with probability at least ``1 - delta``, of the
documents the certified rule stops early, at most ``epsilon`` get another label than the
full read (for documents drawn like these; openings and lengths included).

A binomial test counts independent draws. Related documents (the translations of one
text, copies of one template, pages of one site) stop or read on together and are right
or wrong together, so counting each as a draw overstates the evidence: on SIB-200
documents in 20 languages the stop certified on 126 documents (about 14 texts' worth)
failed on held-out text in 2 of 8 splits (docs/BENCHMARKS.md section 25). So the test
counts one document per group of related documents (:attr:`Document.group`), drawn by
seeded lot before anything is read; a document without a group is its own draw.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kascade.operators.aggregation import STRATEGIES
from kascade.operators.calibration import Cascade
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, softmax
from kascade.operators.items import ChunkTask, DocMeta
from kascade.operators.reading import STOP_PATH, Seen, first_stop, stop_label
from kascade.operators.verdicts import cheap_stages
from kascade.schemas import Aggregation
from kascade.schemas.cascade import DocumentStop, StopRule
from kascade.schemas.settings import ChunkSettings
from kascade.toolchain.certify import (
    CalibrationTooSmall,
    certify_sequence,
    min_accepted,
    upper_bound,
)
from kascade.toolchain.features import Features


@dataclass(frozen=True)
class Document:
    """One calibration document as the stop sees it, and the full read's answer."""

    seen: list[Seen]  # cheap verdicts of its chunks, in reading order
    full_label: int  # the full model reading every chunk
    ends: list[int]  # the text's tokens up to the end of each chunk
    text_tokens: int
    group: Hashable | None = None  # shared by related documents; None: unrelated to any


class CalibrationText(NamedTuple):
    """A calibration document as given: its text, language (which picks its stratum's
    thresholds) and group of related documents (one draw for the stop's test)."""

    text: str
    lang: str | None = None
    group: Hashable | None = None


def full_read_labels(f: Features, aggregation: Aggregation) -> np.ndarray:
    """For every chunk, the label of its whole document read by the full model."""
    out = np.empty(len(f.source), dtype=np.int64)
    for d in np.unique(f.source):
        rows = np.flatnonzero(f.source == d)
        weights = np.maximum(f.tokens[rows], 1).astype(np.float64)
        out[rows] = STRATEGIES[aggregation].combine(f.full[rows], weights)[0]
    return out


def on_topic_targets(f: Features, aggregation: Aggregation) -> np.ndarray:
    """What the on-topic head learns, from unlabeled documents: 1 where a chunk's
    full-model label is its document's full-read label (0 for an opening that is not
    about the document's topic, or a digression)."""
    return (f.target == full_read_labels(f, aggregation)).astype(np.int64)


def read_documents(
    enc: Encoder,
    texts: Sequence[CalibrationText],
    *,
    chunking: ChunkSettings,
    cascade: Cascade,
    aggregation: Aggregation,
) -> list[Document]:
    """Each text as the stop sees it, through the runtime's own cheap stages at the
    cascade's operating point, and the full read's label. The full model runs on a
    document's chunks in order only until no answer for the rest could change that label
    (:meth:`Strategy.decided`, exact), which halves calibration on long single-topic text.
    """
    strategy = STRATEGIES[aggregation]
    cheap = cheap_stages(enc, cascade, audit_fraction=0.0)
    docs = []
    for n, (text, lang, group) in enumerate(texts):
        chunks = chunk_text(
            text,
            enc.model.tokenizer,
            max_tokens=chunking.max_tokens,
            overlap=chunking.overlap,
            max_chunks=10_000,
        )
        if not chunks:
            continue
        meta = DocMeta(f"calibration-{n}", len(chunks), lang, None, None)
        weights = [float(max(c.n_tokens, 1)) for c in chunks]
        seen: list[Seen] = []
        full: list[np.ndarray] = []
        for c in chunks:
            verdict = cheap(ChunkTask(meta, c.index, c.ids, c.n_tokens, c.end_token))
            seen.append(verdict.seen(c.n_tokens))
            known = len(full)  # the full model ran on chunks 0..known-1
            if full and strategy.decided(
                np.stack(full), np.asarray(weights[:known]), weights[known:]
            ):
                continue
            ids = c.ids[None, :]
            mask = np.ones_like(ids)
            hidden = verdict.hidden  # kept for uncertain chunks; S0 and S1 may not keep it
            if hidden is None:
                hidden = enc.prefix(enc.embeddings(ids, mask), mask)
            full.append(softmax(enc.suffix(hidden, mask)[0].astype(np.float64)))
        label, _ = strategy.combine(np.stack(full), np.asarray(weights[: len(full)]))
        docs.append(
            Document(
                seen=seen,
                full_label=label,
                ends=[c.end_token for c in chunks],
                text_tokens=chunks[0].text_tokens,
                group=group,
            )
        )
    return docs


@dataclass(frozen=True)
class Replay:
    """One rule read over the calibration documents."""

    stopped: int  # documents it stopped before their last chunk
    disagreements: int  # of those, labeled otherwise than the full read
    chunks_read: int
    chunks: int
    tokens_read: int
    tokens: int


def replay(rule: StopRule, docs: list[Document], aggregation: Aggregation) -> Replay:
    """Reads every document as a run with ``rule`` would.

    >>> from kascade.schemas.cascade import StopRule
    >>> a = Seen(True, np.array([0.9, 0.1]), 10)
    >>> doc = Document([a, a, a], full_label=1, ends=[8, 16, 24], text_tokens=24)
    >>> replay(StopRule(min_chunks=2, min_lead=0.5), [doc], Aggregation.TOKEN_MEAN)
    Replay(stopped=1, disagreements=1, chunks_read=2, chunks=3, tokens_read=16, tokens=24)
    """
    stopped = wrong = chunks_read = chunks = tokens_read = tokens = 0
    for d in docs:
        n = first_stop(rule, d.seen, aggregation)
        chunks += len(d.seen)
        tokens += d.text_tokens
        if n is None:
            chunks_read += len(d.seen)
            tokens_read += d.text_tokens
            continue
        stopped += 1
        wrong += stop_label(rule, d.seen[:n], aggregation) != d.full_label
        chunks_read += n
        tokens_read += d.ends[n - 1]
    return Replay(stopped, wrong, chunks_read, chunks, tokens_read, tokens)


def draws(docs: Sequence[Document], seed: int) -> list[Document]:
    """One document of each group of related documents, by seeded lot (which depends on
    the groups only, never on how a document reads), and every document without a group.

    >>> a, b = (Document([], label, [1], 1, group="text-7") for label in (0, 1))
    >>> lone = Document([], 2, [1], 1)
    >>> [d.full_label for d in draws([a, lone, b, lone], seed=0)]
    [1, 2, 2]
    """
    rng = random.Random(seed)
    members: dict[Hashable, list[Document]] = {}
    for n, d in enumerate(docs):
        members.setdefault(("document", n) if d.group is None else ("group", d.group), []).append(d)
    return [ds[rng.randrange(len(ds))] for ds in members.values()]


def certify_stop(
    docs: list[Document],
    *,
    aggregation: Aggregation,
    epsilon: float,
    delta: float,
    path: tuple[StopRule, ...] = STOP_PATH,
    seed: int = 0,
) -> DocumentStop:
    """The most economical rule of ``path`` that certifies, tested on one document per
    group of related documents (:func:`draws`); raises :class:`CalibrationTooSmall`
    saying how many it would need. What the rule reads is reported over every document."""
    need = min_accepted(epsilon, delta)
    tested = draws(docs, seed)
    replays = {rule: replay(rule, tested, aggregation) for rule in path}
    found = certify_sequence(
        list(path),
        lambda rule: (replays[rule].stopped, replays[rule].disagreements),
        epsilon,
        delta,
    )
    if found is None:
        most = max(r.stopped for r in replays.values())
        related = (
            f" ({len(docs)} documents in {len(tested)} groups of related documents, each"
            " group one draw)"
            if len(tested) < len(docs)
            else ""
        )
        raise CalibrationTooSmall(
            f"no document stop could be certified for epsilon={epsilon:g} at delta={delta:g}"
            f" on {len(tested)} independent documents{related}: it needs >= {need} documents"
            " stopped early with no disagreement with the full read (the most any rule"
            f" stopped was {most}); give more documents like the stream's, or a larger"
            " epsilon"
        )
    rule, stopped, wrong = found
    r = replay(rule, docs, aggregation)
    return DocumentStop(
        rule=rule,
        aggregation=aggregation,
        epsilon=epsilon,
        delta=delta,
        documents=len(docs),
        draws=len(tested),
        stopped=stopped,
        disagreements=wrong,
        upper_bound_at_delta=upper_bound(wrong, stopped, delta),
        chunks_read_share=r.chunks_read / max(r.chunks, 1),
        tokens_read_share=r.tokens_read / max(r.tokens, 1),
    )
