"""The calibration in force: the cascade's heads and operating point, loaded from a model
directory's ``cascade.json`` once (by the driver's run plan) and checked against the model.

A :class:`Cascade` is what settles chunks; its ``sha256`` is the identity records carry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from kascade.operators.encoder import softmax
from kascade.schemas.cascade import (
    CASCADE_FILE,
    CASCADE_VERSION,
    LENGTHS,
    READABLE_VERSIONS,
    CascadeMismatch,
    CascadeSpec,
    HeadWeights,
    OperatingPoint,
    Stratum,
    length_of,
)
from kascade.schemas.engine import Engine
from kascade.schemas.manifest import ModelManifest
from kascade.schemas.problems import first_problem
from kascade.schemas.settings import ChunkSettings


@dataclass(frozen=True)
class Head:
    """A linear head: probabilities from a pooled feature vector."""

    weight: np.ndarray  # labels x hidden
    bias: np.ndarray

    @classmethod
    def of(cls, w: HeadWeights) -> Head:
        return cls(np.asarray(w.weight, dtype=np.float32), np.asarray(w.bias, dtype=np.float32))

    def probs(self, features: np.ndarray) -> np.ndarray:
        return softmax((features @ self.weight.T + self.bias).astype(np.float64))


def on_topic_of(head: Head, features: np.ndarray) -> float:
    """The on-topic head's probability that a chunk's label is its document's (its second
    class; the first is off-topic)."""
    return float(head.probs(features)[..., 1])


def pooled(states: np.ndarray) -> np.ndarray:
    """Mean over the tokens of one unpadded sequence's states (``1 x T x H`` or ``T x H``)."""
    return states.reshape(-1, states.shape[-1]).mean(axis=0)


def _misfit(spec: CascadeSpec, manifest: ModelManifest) -> str | None:
    """Why ``spec``'s heads cannot read this model's states (``None``: they can)."""
    if spec.labels != manifest.labels:
        return f"its labels {spec.labels} are not the model's {manifest.labels}"
    if spec.cascade_layer != manifest.cascade_layer:
        return f"its layer {spec.cascade_layer} is not the model's {manifest.cascade_layer}"
    want = (len(manifest.labels), manifest.hidden_size)
    for head in (spec.s0, spec.s1):
        if head.shape() != want:
            return f"the {head.feature} head is {head.shape()}, the model needs {want}"
    stop = spec.document_stop
    on_topic = None if stop is None else stop.on_topic
    if on_topic is not None and on_topic.shape() != (2, manifest.hidden_size):
        return f"the on-topic head is {on_topic.shape()}, not (2, {manifest.hidden_size})"
    return None


@dataclass(frozen=True)
class Cascade:
    """Loaded heads and the operating point in force."""

    spec: CascadeSpec
    s0: Head
    s1: Head
    point: OperatingPoint
    on_topic: Head | None = None  # the document stop's, when its rule asks it
    sha256: str | None = None  # of the cascade.json it was loaded from: its identity

    @classmethod
    def load(
        cls,
        model_dir: Path,
        manifest_sha256: str,
        operating_point: str | None = None,
        manifest: ModelManifest | None = None,
    ) -> Cascade:
        """The heads and operating point of ``model_dir/cascade.json``, checked against
        the model (its labels, layer and sizes too, given its ``manifest``); raises
        :class:`CascadeMismatch` with one line saying what to do."""
        path = Path(model_dir) / CASCADE_FILE
        if not path.is_file():
            raise CascadeMismatch(f"{model_dir} has no {CASCADE_FILE}; run kascade calibrate")
        text = path.read_bytes()
        try:
            raw = json.loads(text)
            if raw.get("version") not in READABLE_VERSIONS:
                raise CascadeMismatch(
                    f"{path} has format version {raw.get('version')}, this kascade reads"
                    f" {CASCADE_VERSION}; run kascade calibrate again"
                )
            spec = CascadeSpec.model_validate(raw)
        except ValidationError as e:
            raise CascadeMismatch(f"{path}: {first_problem(e)}") from None
        except (ValueError, AttributeError) as e:  # not JSON, or not an object
            raise CascadeMismatch(f"{path} is not a valid {CASCADE_FILE}: {e}") from None
        if spec.model_manifest_sha256 != manifest_sha256:
            raise CascadeMismatch(f"{path} was calibrated for another model (manifest differs)")
        if manifest is not None:
            problem = _misfit(spec, manifest)
            if problem is not None:
                raise CascadeMismatch(f"{path}: {problem}; run kascade calibrate again")
        name = operating_point or spec.default_operating_point
        if name not in spec.operating_points:
            raise CascadeMismatch(
                f"no operating point {name!r} in {path}; have {', '.join(spec.operating_points)}"
            )
        stop = spec.document_stop
        on_topic = None if stop is None or stop.on_topic is None else Head.of(stop.on_topic)
        point = spec.operating_points[name]
        digest = hashlib.sha256(text).hexdigest()
        return cls(spec, Head.of(spec.s0), Head.of(spec.s1), point, on_topic, digest)

    def stratum(self, lang: str | None, chunks: int) -> Stratum | None:
        """The stratum of a chunk of a ``chunks``-chunk document in ``lang`` (``None``:
        one certificate for every chunk)."""
        return self.point.stratum(lang, chunks)

    def thresholds(self, lang: str | None, chunks: int) -> tuple[float, float]:
        """S0's and S1's thresholds for such a chunk."""
        s = self.stratum(lang, chunks)
        at = self.point if s is None else s
        return at.threshold_s0, at.threshold_s1

    def scope_of(self, lang: str | None, chunks: int) -> str | None:
        """What the live test judges such a chunk in, and a suspension covers: its
        language (``None``: only the overall test), with its length where its stratum was
        certified for that length alone (so a drift in short documents leaves the long
        ones their cascade).

        A test per language is finer than a certificate over several: stricter, never
        looser.
        """
        s = self.stratum(lang, chunks)
        if s is None or len(s.lengths) == len(LENGTHS):
            return lang
        length = length_of(chunks)
        return length if lang is None else f"{lang}/{length}"

    def certified_for(
        self, chunking: ChunkSettings, tokenizer_sha256: str, engine: Engine
    ) -> str | None:
        """Why this calibration does not hold for chunks made this way and classified by
        ``engine`` (``None``: it does).

        The guarantee is a statement about the chunks it was measured on, as the engine
        it was measured with computes them; other sizes, overlaps, tokenizations or
        arithmetic are another distribution.
        """
        if self.spec.engine != engine:
            return (
                f"the cascade was certified with the {self.spec.engine.name} engine; this run"
                f" uses {engine.name} (--encoder.backend, --encoder.precision)"
            )
        c = self.spec.chunking
        if c.tokenizer_sha256 != tokenizer_sha256:
            return "the cascade was certified with another tokenizer"
        if (c.max_tokens, c.overlap) != (chunking.max_tokens, chunking.overlap):
            return (
                f"the cascade was certified on {c.describe()}; this run makes"
                f" {chunking.max_tokens}-token chunks with overlap {chunking.overlap}"
            )
        return None
