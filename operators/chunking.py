"""Token chunks of a document: fixed-size windows with overlap, special tokens on each.

The window arithmetic is the pure function :func:`windows`; a :class:`Chunker` applies it
to a text's tokens (:mod:`~kascade.operators.pieces`: tokenized only as far as a reader
asks) and keeps each chunk's character offsets; :func:`chunk_text` makes them all.

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
from kascade.operators.pieces import TextTokens, piecewise
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
    text_tokens: int  # tokens of the whole text (0: not tokenized to its end yet)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def task(self, doc: DocMeta) -> ChunkTask:
        """This chunk on its way to be classified, as a chunk of ``doc``."""
        return ChunkTask(doc, self.index, self.ids, self.n_tokens, self.end_token)


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


@dataclass(frozen=True)
class Chunker:
    """The run's chunking: one tokenizer, its special tokens, the chunk settings.

    Chunk ``k`` of a text covers its tokens ``[k * step, k * step + room)`` (``room``:
    ``max_tokens`` less the special tokens; ``step``: ``room`` less the overlap), the last
    chunk ending with the text; :func:`windows` is the same arithmetic over a known
    length. :meth:`chunk` makes one chunk, tokenizing the text only as far as it and the
    knowledge of whether another follows need.
    """

    tokenizer: Tokenizer
    max_tokens: int
    overlap: int
    specials: SpecialTokens
    piecewise: bool = True

    @classmethod
    def of(cls, tokenizer: Tokenizer, max_tokens: int, overlap: int) -> Chunker:
        specials = SpecialTokens.of(tokenizer)
        room = max_tokens - len(specials)
        if room < 1:
            raise ValueError(f"max_tokens {max_tokens} leaves no room next to special tokens")
        overlap = min(overlap, room - 1)
        return cls(tokenizer, max_tokens, overlap, specials, piecewise(tokenizer))

    @property
    def room(self) -> int:
        return self.max_tokens - len(self.specials)

    @property
    def step(self) -> int:
        return self.room - self.overlap

    def tokens(self, text: str) -> TextTokens:
        """A text to read; empty or whitespace-only text has no chunks."""
        return TextTokens(text if text.strip() else "")

    def _ensure(self, t: TextTokens, n: int | None) -> None:
        t.ensure(n, self.tokenizer, whole=not self.piecewise)

    def exists(self, t: TextTokens, k: int) -> bool:
        """Whether the text has a chunk ``k``."""
        if k == 0:
            self._ensure(t, 0)
            return bool(t.ids)
        # Chunk k exists where chunk k-1 did not reach the end of the text.
        self._ensure(t, (k - 1) * self.step + self.room)
        return len(t.ids) > (k - 1) * self.step + self.room

    def chunk(self, t: TextTokens, k: int) -> Chunk:
        """Chunk ``k`` (which must exist); its ``text_tokens`` are the whole text's where it
        is tokenized to its end, else 0."""
        a = k * self.step
        self._ensure(t, a + self.room)
        b = min(a + self.room, len(t.ids))
        if b <= a:
            raise IndexError(f"the text has no chunk {k}")
        return Chunk(
            index=k,
            ids=np.asarray([*self.specials.prefix, *t.ids[a:b], *self.specials.suffix], np.int64),
            start_char=t.offsets[a][0],
            end_char=t.offsets[b - 1][1],
            end_token=b,
            text_tokens=len(t.ids) if t.complete else 0,
        )

    def count(self, t: TextTokens) -> int:
        """The text's chunks, tokenizing it to its end."""
        self._ensure(t, None)
        return len(windows(len(t.ids), size=self.room, overlap=self.overlap))

    def all(self, text: str, max_chunks: int) -> list[Chunk]:
        """Every chunk of ``text``: :func:`chunk_text`."""
        t = self.tokens(text)
        n = self.count(t)
        if n > max_chunks:
            raise ChunkLimitExceeded(
                f"{len(t.ids)} tokens make {n} chunks; the limit is {max_chunks}"
            )
        return [self.chunk(t, k) for k in range(n)]


def chunk_text(
    text: str,
    tokenizer: Tokenizer,
    *,
    max_tokens: int,
    overlap: int,
    max_chunks: int,
    specials: SpecialTokens | None = None,
) -> list[Chunk]:
    """Chunks of ``text`` of at most ``max_tokens`` ids each (special tokens included).

    Empty or whitespace-only text has no chunks. A document needing more than
    ``max_chunks`` chunks raises :class:`ChunkLimitExceeded` (so it can be dead-lettered
    with its reason rather than silently truncated).
    """
    chunker = Chunker.of(tokenizer, max_tokens, overlap)
    if specials is not None:
        chunker = dataclasses.replace(chunker, specials=specials)
    return chunker.all(text, max_chunks)


def meta_of(r: Received, total_chunks: int = 0, text_tokens: int = 0) -> DocMeta:
    """The metadata a document's chunks carry, with what is known of its tokens."""
    return DocMeta(
        id=r.doc.id,
        total_chunks=total_chunks,
        lang=r.doc.lang,
        metadata=r.doc.metadata,
        timestamp_ms=r.timestamp_ms,
        source=r.position,
        envelope=r.envelope,
        text_tokens=text_tokens,
        text_chars=len(r.doc.text),
    )


def split(
    r: Received, chunker: Chunker, settings: ChunkSettings, *, stage: str
) -> list[ChunkTask | DocMeta | DeadLetter]:
    """A document's chunks, its metadata alone (no tokens), or a dead letter (a text
    longer than ``settings.max_chunks`` chunks, a tokenizer that rejects it); never raises.
    """
    metrics.DOCS_IN.inc()
    with metrics.STAGE_SECONDS.labels("chunk").time(), inflight.inside(r.position, stage):
        try:
            chunks = chunker.all(r.doc.text, settings.max_chunks)
        except ChunkLimitExceeded as e:
            return [r.dead_letter(DeadLetterReason.TOO_LONG, str(e), stage)]
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            # A tokenizer that rejects a string rejects one record; a panic in its Rust
            # code reaches Python as pyo3's PanicException, a BaseException.
            return [r.dead_letter(DeadLetterReason.PROCESSING, failure(e), stage)]
    first = meta_of(r, len(chunks), chunks[0].text_tokens if chunks else 0)
    if not chunks:
        return [first]
    meta = dataclasses.replace(first, envelope=None)
    metrics.CHUNKS_IN.inc(len(chunks))
    return [c.task(first if c.index == 0 else meta) for c in chunks]


@dataclass(frozen=True)
class ChunkOut:
    """Chunks to classify, documents without tokens, and documents that were too long."""

    chunks: Stream[ChunkTask]
    empty: Stream[DocMeta]
    dead: Stream[DeadLetter]


@operator
def chunk(
    step_id: str, up: Stream[Received], tokenizer: Tokenizer, settings: ChunkSettings
) -> ChunkOut:
    """Split each document into :class:`ChunkTask` items with the run's ``tokenizer``
    (the model's, loaded once per process with it): every chunk, for a flow that reads
    them all (a cascade reads its documents' chunks itself, only as far as it needs)."""
    chunker = Chunker.of(tokenizer, settings.max_tokens, settings.overlap)

    def split_one(r: Received) -> list[ChunkTask | DocMeta | DeadLetter]:
        return split(r, chunker, settings, stage=step_id)

    items = op.flat_map("split", up, split_one)
    chunks, rest = by_class("is_chunk", items, ChunkTask)
    empty, dead = by_class("is_empty", rest, DocMeta)
    return ChunkOut(chunks=chunks, empty=empty, dead=dead)


@dataclass(frozen=True)
class TextOut:
    """Documents with text to read, and the metadata of those without."""

    texts: Stream[Received]
    empty: Stream[DocMeta]


@operator
def with_text(step_id: str, up: Stream[Received]) -> TextOut:
    """Documents with text to read, and the metadata of those without (empty or
    whitespace only: labeled without a chunk), for a reader that chunks them itself."""

    def blank(r: Received) -> DocMeta:
        metrics.DOCS_IN.inc()
        return meta_of(r)

    split_blank = op.branch("is_blank", up, lambda r: not r.doc.text.strip())
    return TextOut(split_blank.falses, op.map("no_text", split_blank.trues, blank))
