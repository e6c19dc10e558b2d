"""The model directory's manifest: what the toolchain wrote and what the runtime checks.

A model directory holds ONNX graphs, the one ``weights.bin`` they all read their
tensors from, ``tokenizer.json``, ``labels.json`` and ``manifest.json``. The manifest
records the sha256 of every file, the source checkpoint, the labels and how the graphs
were made; the runtime refuses a directory whose files do not match it.

>>> m = ModelManifest(source="x", architecture="bert", variant="fp32", labels=["a", "b"],
...     max_length=512, opset=18, num_layers=6, hidden_size=384, cascade_layer=2, files={})
>>> m.label_index("b")
1
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kascade.errors import KascadeError, UsageError
from kascade.schemas.files import write_text_atomically
from kascade.schemas.problems import first_problem

MANIFEST = "manifest.json"
FORMAT_VERSION = 1

# Graph files of a model directory. The full graph returns the two cascade boundaries as
# extra outputs; the three stage graphs are cut from it, so running them in a chain
# computes exactly what the full graph computes, and escalating a chunk from the early
# layer reuses the prefix instead of recomputing it.
FULL_GRAPH = "model.onnx"
EMBED_GRAPH = "embed.onnx"  # input_ids -> embeddings
PREFIX_GRAPH = "prefix.onnx"  # embeddings, attention_mask -> hidden (after cascade_layer)
SUFFIX_GRAPH = "suffix.onnx"  # hidden, attention_mask -> logits
STAGE_GRAPHS = (EMBED_GRAPH, PREFIX_GRAPH, SUFFIX_GRAPH)
# Every graph keeps its large tensors in this one file (ONNX external data), each
# stored once: the full graph and the stage graphs point at the same bytes.
WEIGHTS = "weights.bin"
TOKENIZER = "tokenizer.json"
LABELS = "labels.json"
# What every model directory holds, whatever made it.
REQUIRED_FILES = (FULL_GRAPH, *STAGE_GRAPHS, TOKENIZER)


class ManifestMismatch(KascadeError):
    """A model directory's files are not the ones its manifest describes."""


class Parity(BaseModel):
    """Export parity against PyTorch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_abs_logit_diff: float
    lengths: list[int]
    padded_batch: bool
    stage_chain_max_abs_diff: float


# Beside a checkpoint: where its weights came from (a base the toolchain converted) and,
# once ``kascade train`` fine-tuned it, how (:class:`Provenance`).
BASE_FILE = "kascade-base.json"
PROVENANCE_FILE = "kascade-provenance.json"


class BaseModelRef(BaseModel):
    """A pretrained model, named so that someone else can fetch the same weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Hub id, package, or local directory.")
    version: str = Field(description="Hub commit, package version and file hash, or digest.")


class Provenance(BaseModel):
    """How a fine-tuned checkpoint was made: enough to make it again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: BaseModelRef
    training_data_sha256: str = Field(description="sha256 of the (text, label) pairs.")
    training_examples: int = Field(ge=0)
    dev_data_sha256: str | None = None
    recipe: dict[str, Any] = Field(description="The training settings (kascade train).")
    tools: dict[str, str] = Field(description="Versions of kascade, torch, transformers.")


class ModelManifest(BaseModel):
    """Everything needed to trust and reproduce a model directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    source: str = Field(description="Checkpoint directory or hub id exported from.")
    architecture: str = Field(description="Hugging Face model_type, e.g. modernbert, bert.")
    variant: str = Field(description="Quantization preset that produced the graphs.")
    labels: list[str] = Field(min_length=1)
    max_length: int = Field(gt=0, description="Longest sequence the model was built for.")
    opset: int
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    cascade_layer: int = Field(ge=0, description="Layer after which prefix.onnx stops.")
    pad_token_id: int = 0
    files: dict[str, str] = Field(description="File name -> sha256 hex digest.")
    parity: Parity | None = None
    quantization: dict[str, Any] = Field(default_factory=dict)
    measured: dict[str, Any] = Field(
        default_factory=dict, description="Agreement, F1 and speed measured when made."
    )
    parent_sha256: str | None = Field(
        default=None, description="Manifest digest of the directory this one was derived from."
    )
    provenance: Provenance | None = Field(
        default=None, description="How the checkpoint was trained, where kascade trained it."
    )

    @field_validator("labels")
    @classmethod
    def _labels_unique(cls, labels: list[str]) -> list[str]:
        if len(set(labels)) != len(labels):
            raise ValueError("labels must be unique")
        return labels

    @field_validator("files")
    @classmethod
    def _files_inside(cls, files: dict[str, str]) -> dict[str, str]:
        for name, digest in files.items():
            path = PurePosixPath(name)
            if not name or "\\" in name or path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{name!r} is not a file inside the model directory")
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{name}: {digest!r} is not a sha256 hex digest")
        return files

    @model_validator(mode="after")
    def _layer_inside(self) -> ModelManifest:
        if not 0 < self.cascade_layer < self.num_layers:
            raise ValueError(
                f"cascade_layer {self.cascade_layer} is not a layer inside the model's"
                f" {self.num_layers}"
            )
        return self

    def label_index(self, label: str) -> int:
        return self.labels.index(label)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, manifest: ModelManifest) -> str:
    """Write ``manifest.json`` atomically; returns its sha256 (the model's identity)."""
    text = manifest.model_dump_json(indent=2) + "\n"
    write_text_atomically(Path(directory) / MANIFEST, text)
    return hashlib.sha256(text.encode()).hexdigest()


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (ValueError, OSError):
        return None


def read_manifest(directory: Path, *, verify: bool = True) -> tuple[ModelManifest, str]:
    """The manifest and its sha256; with ``verify``, every listed file's hash is checked."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise UsageError(f"{directory} is not a kascade model directory (no {MANIFEST})")
    raw = path.read_bytes()
    try:
        manifest = ModelManifest.model_validate_json(raw)
    except ValidationError as e:
        raise ManifestMismatch(f"{path}: {first_problem(e)}") from None
    missing = [name for name in REQUIRED_FILES if name not in manifest.files]
    if missing:
        raise ManifestMismatch(f"{path}: lists no {', '.join(missing)}")
    if manifest.format_version != FORMAT_VERSION:
        raise ManifestMismatch(
            f"{path}: format_version {manifest.format_version}, expected {FORMAT_VERSION}"
        )
    if verify:
        for name, digest in manifest.files.items():
            f = Path(directory) / name
            if not f.is_file():
                raise ManifestMismatch(f"{directory}: {name} is listed in the manifest but missing")
            if sha256_file(f) != digest:
                raise ManifestMismatch(f"{directory}: {name} does not match its manifest sha256")
        labels_file = Path(directory) / LABELS
        if labels_file.is_file() and _json_or_none(labels_file) != manifest.labels:
            raise ManifestMismatch(f"{directory}: {LABELS} disagrees with the manifest's labels")
    return manifest, hashlib.sha256(raw).hexdigest()
