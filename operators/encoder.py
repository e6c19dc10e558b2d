"""The quantized model's graphs, loaded once per worker process by the run's engine.

This module imports no Bytewax, so a process that only classifies (the toolchain's
memory probe, a benchmark) carries nothing else; the flow's operator is
:mod:`operators.full_model`.

A model directory (see :mod:`schemas.manifest`) holds the full graph and three stage
graphs cut from it. :func:`load_model_dir` verifies the manifest and loads the tokenizer;
:class:`Encoder` loads the graphs with an engine (:mod:`operators.backends`) and
classifies one chunk per call without padding (measured fastest on CPU);
``logits_batch`` pads for the comparisons the benchmarks make.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from kascade.operators.backends import Graph, load_graph
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import (
    EMBED_GRAPH,
    FULL_GRAPH,
    PREFIX_GRAPH,
    SUFFIX_GRAPH,
    TOKENIZER,
    ManifestMismatch,
    ModelManifest,
    read_manifest,
)

Graphs = Literal["full", "stages"]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A ``tokenizer.json`` with its saved truncation and padding switched off.

    Checkpoints often ship ``tokenizer.json`` with truncation at 128 or 512 tokens;
    left on, a long document would silently become one truncated chunk.
    """
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own untyped errors
        raise ManifestMismatch(
            f"{path}: not a tokenizer ({str(e).splitlines()[0][:200]})"
        ) from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits.

    >>> softmax(np.array([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


# eq=False: one Loaded is one load (hashed by identity), so a process's encoders can be
# cached per model without comparing tokenizers.
@dataclass(frozen=True, eq=False)
class Loaded:
    """A verified model directory."""

    directory: Path
    manifest: ModelManifest
    manifest_sha256: str
    tokenizer: Tokenizer

    def encode(self, text: str) -> np.ndarray:
        """Token ids with special tokens, truncated to the model's maximum length."""
        ids = self.tokenizer.encode(text).ids
        limit = self.manifest.max_length
        if len(ids) > limit:
            ids = ids[: limit - 1] + ids[-1:]  # keep the closing special token
        return np.asarray(ids, dtype=np.int64)


def load_model_dir(directory: Path | str, *, verify: bool = True) -> Loaded:
    """Manifest (hashes checked), and the tokenizer of a model directory."""
    directory = Path(directory)
    manifest, digest = read_manifest(directory, verify=verify)
    tokenizer = load_tokenizer(directory / TOKENIZER)
    return Loaded(directory, manifest, digest, tokenizer)


class Encoder:
    """Classifies token-id sequences with the model directory's ONNX graphs.

    ``graphs="full"`` loads only the full graph; ``"stages"`` loads the embed, prefix
    and suffix graphs, which the cascade runs piecewise. ``engine`` defaults to ONNX
    Runtime in FP32 arithmetic (the graph's own precision).
    """

    def __init__(
        self,
        model: Loaded,
        *,
        threads: int = 1,
        graphs: Graphs = "full",
        engine: Engine | None = None,
    ) -> None:
        self.model = model
        self.graphs = graphs
        self.engine = engine or Engine()
        d = model.directory
        if graphs == "full":
            self._full = load_graph(d / FULL_GRAPH, threads, self.engine)
        else:
            self._embed = load_graph(d / EMBED_GRAPH, threads, self.engine)
            self._prefix = load_graph(d / PREFIX_GRAPH, threads, self.engine)
            self._suffix = load_graph(d / SUFFIX_GRAPH, threads, self.engine)

    @property
    def labels(self) -> list[str]:
        return self.model.manifest.labels

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits of one sequence (no padding): shape ``(num_labels,)``."""
        ids2 = ids.reshape(1, -1)
        mask = np.ones_like(ids2)
        if self.graphs == "full":
            return self._full.run({"input_ids": ids2, "attention_mask": mask}, "logits")[0]
        emb = self.embeddings(ids2, mask)
        hidden = self.prefix(emb, mask)
        return self.suffix(hidden, mask)[0]

    def logits_batch(self, seqs: list[np.ndarray]) -> np.ndarray:
        """Logits of several sequences in one padded call: shape ``(n, num_labels)``."""
        width = max(len(s) for s in seqs)
        pad = self.model.manifest.pad_token_id
        ids = np.full((len(seqs), width), pad, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        if self.graphs == "full":
            return self._full.run({"input_ids": ids, "attention_mask": mask}, "logits")
        return self.suffix(self.prefix(self.embeddings(ids, mask), mask), mask)

    def embeddings(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        mask = np.ones_like(ids) if mask is None else mask
        return _run(self._embed, {"input_ids": ids, "attention_mask": mask})

    def prefix(self, embeddings: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return _run(self._prefix, {"embeddings": embeddings, "attention_mask": mask})

    def suffix(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return _run(self._suffix, {"hidden": hidden, "attention_mask": mask})


def _run(graph: Graph, available: dict[str, np.ndarray]) -> np.ndarray:
    # A stage graph declares only the inputs it reads (see toolchain.graphs.cut_stages).
    return graph.run({name: available[name] for name in graph.inputs})
