"""ONNX graph surgery shared by export and quantize: cutting the stage graphs, storing
their weights once, writing a model directory atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnx.external_data_helper import set_external_data
from onnx.utils import Extractor

from kascade.errors import UsageError
from kascade.schemas.files import current_umask
from kascade.schemas.manifest import (
    EMBED_GRAPH,
    FULL_GRAPH,
    LABELS,
    PREFIX_GRAPH,
    STAGE_GRAPHS,
    SUFFIX_GRAPH,
    WEIGHTS,
    ModelManifest,
    sha256_file,
    write_manifest,
)
from kascade.toolchain import ToolchainError

# Names of the full graph's inputs and outputs; the stage graphs are cut at them.
INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("logits", "embeddings", "hidden")


def cut_stages(directory: Path) -> None:
    """Write embed/prefix/suffix graphs cut from ``directory/model.onnx`` at its outputs."""
    model = onnx.load(str(directory / FULL_GRAPH))
    outputs = [o.name for o in model.graph.output]
    if outputs != list(OUTPUTS):
        raise ToolchainError(f"{directory / FULL_GRAPH} has outputs {outputs}, expected {OUTPUTS}")
    extractor = Extractor(model)
    cuts = {
        EMBED_GRAPH: (["input_ids"], ["embeddings"]),
        PREFIX_GRAPH: (["embeddings", "attention_mask"], ["hidden"]),
        SUFFIX_GRAPH: (["hidden", "attention_mask"], ["logits"]),
    }
    for name, (ins, outs) in cuts.items():
        stage = extractor.extract_model(ins, outs)
        # The exporter reads dynamic sizes from whichever input carries them (BERT's
        # embeddings take the sequence length from attention_mask): such a stage also
        # takes that full-graph input, and the runtime feeds what a stage declares.
        needed = _undeclared(stage)
        if needed - set(INPUTS):
            raise ToolchainError(f"cutting {name}: the graph also needs {sorted(needed)}")
        if needed:
            stage = extractor.extract_model(ins + sorted(needed), outs)
        onnx.save(stage, str(directory / name))


# Tensors below this size stay inside their graph: shapes and scalars, not weights.
_EXTERNAL_MIN_BYTES = 1024
# Page-aligned tensors can be memory-mapped by ONNX Runtime.
_ALIGN = 4096


def share_weights(directory: Path) -> None:
    """Move the large tensors of every graph in ``directory`` into one ``weights.bin``,
    each stored once, and point the graphs at it.

    The stage graphs are cut from the full graph, so a tensor they share has the same
    name and bytes in each; a name with different bytes in two graphs is refused.
    """
    names = [FULL_GRAPH, *STAGE_GRAPHS]
    models = {n: onnx.load(str(directory / n)) for n in names}
    placed: dict[str, tuple[int, int, bytes]] = {}
    with open(directory / WEIGHTS, "wb") as blob:
        for name, model in models.items():
            for tensor in model.graph.initializer:
                raw = tensor.raw_data
                if len(raw) < _EXTERNAL_MIN_BYTES:
                    continue
                digest = hashlib.sha256(raw).digest()
                if tensor.name not in placed:
                    blob.write(b"\0" * (-blob.tell() % _ALIGN))
                    placed[tensor.name] = (blob.tell(), len(raw), digest)
                    blob.write(raw)
                offset, length, known = placed[tensor.name]
                if known != digest:
                    raise ToolchainError(
                        f"{name}: tensor {tensor.name} differs from the full graph's"
                    )
                set_external_data(tensor, location=WEIGHTS, offset=offset, length=length)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
    for name, model in models.items():
        onnx.save(model, str(directory / name))


def _undeclared(graph_model: onnx.ModelProto) -> set[str]:
    g = graph_model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    for node in g.node:
        known.update(node.output)
    return {name for node in g.node for name in node.input if name not in known}


def hash_files(directory: Path) -> dict[str, str]:
    """sha256 of every regular file in ``directory`` except the manifest itself."""
    return {
        p.name: sha256_file(p)
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")
    }


def write_labels(directory: Path, labels: list[str]) -> None:
    (directory / LABELS).write_text(json.dumps(labels, ensure_ascii=False, indent=2) + "\n")


def finish(directory: Path, manifest: ModelManifest) -> ModelManifest:
    """Hash the directory's files into the manifest and write it; returns what was written."""
    manifest = manifest.model_copy(update={"files": hash_files(directory)})
    write_manifest(directory, manifest)
    return manifest


def refuse_existing(out: Path) -> None:
    if out.exists():
        raise UsageError(f"output directory {out} already exists; choose another or remove it")


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A temporary sibling of ``out`` that becomes ``out`` only if the block succeeds."""
    refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; the result should not be
    try:
        yield tmp
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
