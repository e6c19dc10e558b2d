"""What calibration reads of each chunk: the pooled features the cheap heads see and the
full model's answer, from the real stage graphs a run executes."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kascade.errors import UsageError
from kascade.operators.calibration import pooled
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, softmax
from kascade.schemas.engine import Engine
from kascade.toolchain import passes


@dataclass(frozen=True)
class Features:
    embeddings: np.ndarray  # n x H, mean-pooled embedding-layer output
    hidden: np.ndarray  # n x H, mean-pooled output of the cascade layer
    target: np.ndarray  # n, the full model's label index
    tokens: np.ndarray  # n, chunk lengths
    source: np.ndarray  # n, index of the text each chunk came from
    full: np.ndarray  # n x labels, the full model's probabilities
    ends: np.ndarray  # n, the text's tokens up to the end of each chunk
    text_tokens: np.ndarray  # n, tokens of the chunk's whole text

    @staticmethod
    def joined(parts: list[tuple[int, Features | None]]) -> Features:
        """One set from per-block sets, each with the index of its block's first text."""
        kept = [(start, f) for start, f in parts if f is not None]
        if not kept:
            raise UsageError("the calibration texts make no chunk: every one is blank")

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(f, name) for _, f in kept])

        return Features(
            cat("embeddings"),
            cat("hidden"),
            cat("target"),
            cat("tokens"),
            np.concatenate([f.source + start for start, f in kept]),
            cat("full"),
            cat("ends"),
            cat("text_tokens"),
        )


def extract(
    model_dir: Path,
    texts: list[str],
    *,
    max_tokens: int,
    overlap: int,
    processes: int | None = None,
    engine: Engine | None = None,
) -> Features:
    """Pooled features and the full model's answer for every chunk of ``texts``, on up
    to ``processes`` worker processes (default: every core), run by ``engine``."""
    work = functools.partial(extract_block, max_tokens=max_tokens, overlap=overlap)
    parts = passes.over_texts(
        model_dir, work, texts, processes=processes, what="chunks", engine=engine
    )
    starts = itertools.accumulate((len(b) for b in passes.blocks_of(texts)), initial=0)
    return Features.joined(list(zip(starts, parts, strict=False)))


def extract_block(
    enc: Encoder, texts: list[str], *, max_tokens: int, overlap: int
) -> Features | None:
    """:func:`extract` on one process; None when the texts make no chunk."""
    f0, f1, full, n, src, ends, whole = [], [], [], [], [], [], []
    for i, text in enumerate(texts):
        for c in chunk_text(
            text, enc.model.tokenizer, max_tokens=max_tokens, overlap=overlap, max_chunks=10_000
        ):
            ids = c.ids[None, :]
            mask = np.ones_like(ids)
            emb = enc.embeddings(ids, mask)
            hidden = enc.prefix(emb, mask)
            f0.append(pooled(emb))
            f1.append(pooled(hidden))
            full.append(softmax(enc.suffix(hidden, mask)[0].astype(np.float64)))
            n.append(c.n_tokens)
            src.append(i)
            ends.append(c.end_token)
            whole.append(c.text_tokens)
    if not full:
        return None
    probs = np.stack(full)
    return Features(
        np.stack(f0),
        np.stack(f1),
        probs.argmax(axis=1),
        np.asarray(n),
        np.asarray(src),
        probs,
        np.asarray(ends),
        np.asarray(whole),
    )
