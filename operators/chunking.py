"""Token chunks of a document: fixed-size windows with overlap, special tokens on each.

The window arithmetic is the pure function :func:`windows`; :func:`chunk_text` applies
it to a ``tokenizers`` encoding and keeps each chunk's character offsets.

>>> windows(10, size=4, overlap=1)
[(0, 4), (3, 7), (6, 10)]
>>> windows(0, size=4, overlap=1)
[]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream, operator
from tokenizers import Tokenizer

from kascade.operators import inflight, metrics
from kascade.operators.items import ChunkTask, DocMeta
from kascade.operators.streams import by_class
from kascade.operators.validate import Received, failure
from kascade.schemas import DeadLetter, DeadLetterReason
from kascade.schemas.settings import ChunkSettings


def windows(n: int, *, size: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` windows of at most ``size`` over ``n`` items, ``overlap`` shared.

    Every item is covered; consecutive windows share exactly ``overlap`` items; the last
    window ends at ``n`` and may be shorter.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    if not 0 <= overlap < size:
        raise ValueError("overlap must be in [0, size)")
    if n <= 0:
        return []
    step = size - overlap
    out = []
    start = 0
    while True:
        end = min(start + size, n)
        out.append((start, end))
        if end == n:
            return out
        start += step


@dataclass(frozen=True)
class Chunk:
    """One window of a document, ready for the model."""

    index: int
    ids: np.ndarray  # int64 token ids, special tokens included
    start_char: int
    end_char: int
    end_token: int  # the text's tokens (no special tokens) up to the end of this chunk
    text_tokens: int  # tokens of the whole text
    text_chunks: int  # chunks of the whole text (more than returned when cut at the limit)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class SpecialTokens:
    """The ids a tokenizer's template puts before and after a single sequence."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SpecialTokens:
        # Encode a probe and read where the template put its special tokens; works for
        # BERT ([CLS] x [SEP]), RoBERTa/XLM-R (<s> x </s>) and ModernBERT alike.
        enc = tokenizer.encode("a", add_special_tokens=True)
        mask = enc.special_tokens_mask
        content = [i for i, m in enumerate(mask) if not m]
        if not content:
            return cls(tuple(enc.ids), ())
        return cls(tuple(enc.ids[: content[0]]), tuple(enc.ids[content[-1] + 1 :]))

    def __len__(self) -> int:
        return len(self.prefix) + len(self.suffix)


class ChunkLimitExceeded(ValueError):
    """A document needs more chunks than the configured per-document limit."""


def chunk_text(
    text: str,
    tokenizer: Tokenizer,
    *,
    max_tokens: int,
    overlap: int,
    max_chunks: int,
    specials: SpecialTokens | None = None,
    cut_at_limit: bool = False,
) -> list[Chunk]:
    """Chunks of ``text`` of at most ``max_tokens`` ids each (special tokens included).

    Empty or whitespace-only text has no chunks. A document needing more than
    ``max_chunks`` chunks raises :class:`ChunkLimitExceeded` (so it can be dead-lettered
    with its reason rather than silently truncated), or with ``cut_at_limit`` gives its
    first ``max_chunks`` (for a reader that may stop before the limit).
    """
    specials = specials or SpecialTokens.of(tokenizer)
    room = max_tokens - len(specials)
    if room < 1:
        raise ValueError(f"max_tokens {max_tokens} leaves no room next to special tokens")
    if not text.strip():
        return []
    enc = tokenizer.encode(text, add_special_tokens=False)
    spans = windows(len(enc.ids), size=room, overlap=min(overlap, room - 1))
    if len(spans) > max_chunks and not cut_at_limit:
        raise ChunkLimitExceeded(
            f"{len(enc.ids)} tokens make {len(spans)} chunks; the limit is {max_chunks}"
        )
    ids = np.asarray(enc.ids, dtype=np.int64)
    offsets = enc.offsets  # a new list of every token's offsets on each access: read once
    prefix = np.asarray(specials.prefix, dtype=np.int64)
    suffix = np.asarray(specials.suffix, dtype=np.int64)
    return [
        Chunk(
            index=i,
            ids=np.concatenate([prefix, ids[a:b], suffix]),
            start_char=offsets[a][0],
            end_char=offsets[b - 1][1],
            end_token=b,
            text_tokens=len(enc.ids),
            text_chunks=len(spans),
        )
        for i, (a, b) in enumerate(spans[:max_chunks])
    ]


def _over_limit(
    r: Received, meta: DocMeta, read: int, max_chunks: int, stage: str
) -> DeadLetter | None:
    """The too_long dead letter a document cut at the limit carries, sent if reading its
    first ``read`` chunks does not stop."""
    if not meta.text_chunks or meta.text_chunks <= read:
        return None
    return r.dead_letter(
        DeadLetterReason.TOO_LONG,
        f"{meta.text_tokens} tokens make {meta.text_chunks} chunks; the limit is"
        f" {max_chunks}, and reading its first {read} did not make the label certain",
        stage,
    )


def split(
    r: Received,
    tokenizer: Tokenizer,
    specials: SpecialTokens,
    settings: ChunkSettings,
    *,
    stage: str,
    cut_at_limit: bool = False,
) -> list[ChunkTask | DocMeta | DeadLetter]:
    """A document's chunks, its metadata alone (no tokens), or a dead letter; never raises.

    With ``cut_at_limit`` a text longer than ``settings.max_chunks`` chunks is cut there,
    its first chunk carrying the too_long dead letter that is sent if reading does not
    stop before the limit.
    """
    metrics.DOCS_IN.inc()
    with metrics.STAGE_SECONDS.labels("chunk").time(), inflight.inside(r.position, stage):
        try:
            chunks = chunk_text(
                r.doc.text,
                tokenizer,
                max_tokens=settings.max_tokens,
                overlap=settings.overlap,
                max_chunks=settings.max_chunks,
                specials=specials,
                cut_at_limit=cut_at_limit,
            )
        except ChunkLimitExceeded as e:
            return [r.dead_letter(DeadLetterReason.TOO_LONG, str(e), stage)]
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            # A tokenizer that rejects a string rejects one record; a panic in its Rust
            # code reaches Python as pyo3's PanicException, a BaseException.
            return [r.dead_letter(DeadLetterReason.PROCESSING, failure(e), stage)]
    meta = DocMeta(
        id=r.doc.id,
        total_chunks=len(chunks),
        lang=r.doc.lang,
        metadata=r.doc.metadata,
        timestamp_ms=r.timestamp_ms,
        source=r.position,
        text_tokens=chunks[0].text_tokens if chunks else 0,
        text_chunks=chunks[0].text_chunks if chunks else 0,
    )
    over = _over_limit(r, meta, len(chunks), settings.max_chunks, stage)
    first = dataclasses.replace(meta, envelope=r.envelope, over_limit=over)
    if not chunks:
        return [first]
    metrics.CHUNKS_IN.inc(len(chunks))
    return [
        ChunkTask(first if c.index == 0 else meta, c.index, c.ids, c.n_tokens, c.end_token)
        for c in chunks
    ]


@dataclass(frozen=True)
class ChunkOut:
    """Chunks to classify, documents without tokens, and documents that were too long."""

    chunks: Stream[ChunkTask]
    empty: Stream[DocMeta]
    dead: Stream[DeadLetter]


@operator
def chunk(
    step_id: str,
    up: Stream[Received],
    tokenizer: Tokenizer,
    settings: ChunkSettings,
    cut_at_limit: bool = False,
) -> ChunkOut:
    """Split each document into :class:`ChunkTask` items with the run's ``tokenizer``
    (the model's, loaded once per process with it)."""
    specials = SpecialTokens.of(tokenizer)

    def split_one(r: Received) -> list[ChunkTask | DocMeta | DeadLetter]:
        return split(r, tokenizer, specials, settings, stage=step_id, cut_at_limit=cut_at_limit)

    items = op.flat_map("split", up, split_one)
    chunks, rest = by_class("is_chunk", items, ChunkTask)
    empty, dead = by_class("is_empty", rest, DocMeta)
    return ChunkOut(chunks=chunks, empty=empty, dead=dead)
