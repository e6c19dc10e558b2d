"""What calibration reads of each chunk: the pooled features the cheap heads see and the
full model's answer, from the real stage graphs a run executes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from kascade.operators.cascade import pooled
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, softmax


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


def extract(enc: Encoder, texts: list[str], *, max_tokens: int, overlap: int) -> Features:
    """Pooled features and the full model's answer for every chunk of ``texts``."""
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
