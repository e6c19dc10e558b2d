"""Quantization presets, validation of what they write, and an accuracy-budgeted search.

Measured on this machine's kind (AVX2, no VNNI), no fixed recipe is safe for every
model: dynamic INT8 cost one fine-tuned encoder 0.024 macro-F1 while INT4 embeddings
alone cost 0.003. So presets are named and validated, and ``search`` measures candidates
on the user's own text and keeps the fastest that meets the budget, leaving the most
sensitive MatMuls in FP32 when that is what it takes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import onnx

from kascade.schemas.manifest import (
    FULL_GRAPH,
    LABELS,
    STAGE_GRAPHS,
    TOKENIZER,
    ModelManifest,
    read_manifest,
)
from kascade.toolchain import ToolchainError
from kascade.toolchain.graphs import cut_stages, finish, share_weights, staged_directory

log = logging.getLogger(__name__)

MatMulMode = Literal["fp32", "dynamic", "nbits"]
QUANTIZED_MATMUL_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}


@dataclass(frozen=True)
class Recipe:
    """How to quantize: the embedding tables, the weight MatMuls, and what stays FP32."""

    name: str
    int4_embeddings: bool = False
    matmul: MatMulMode = "fp32"
    weight_type: Literal["qint8", "quint8"] = "qint8"
    per_channel: bool = False
    # Without reduce_range, QInt8 weights overflow the AVX2 (non-VNNI) u8s8 kernel's
    # 16-bit accumulators and flip ~6% of decisions; QUInt8 (u8u8) does not need it.
    reduce_range: bool = False
    nbits: int = 8
    block_size: int = 32
    keep_fp32: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.matmul == "dynamic" and self.weight_type == "qint8" and not self.reduce_range:
            raise ValueError(f"{self.name}: QInt8 needs reduce_range on AVX2 CPUs")
        if self.nbits not in (4, 8):
            raise ValueError(f"{self.name}: nbits must be 4 or 8")

    def embeddings_only(self) -> Recipe:
        """The same embedding treatment with every MatMul in FP32: the best this recipe
        can reach by keeping MatMuls in FP32."""
        return PRESETS["int4emb"] if self.int4_embeddings else PRESETS["fp32"]

    def keeping(self, nodes: list[str]) -> Recipe:
        """This recipe with ``nodes`` (MatMul names) left in FP32."""
        return replace(self, name=f"{self.name}+fp32x{len(nodes)}", keep_fp32=tuple(nodes))

    def settings(self) -> dict:
        return asdict(self) | {"keep_fp32": list(self.keep_fp32)}


PRESETS: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("fp32"),
        Recipe("int4emb", int4_embeddings=True),
        Recipe("int8", matmul="dynamic", reduce_range=True),
        Recipe("int8pc", matmul="dynamic", per_channel=True, reduce_range=True),
        Recipe("uint8pc", matmul="dynamic", weight_type="quint8", per_channel=True),
        Recipe("int8-int4emb", int4_embeddings=True, matmul="dynamic", reduce_range=True),
        Recipe(
            "int8pc-int4emb",
            int4_embeddings=True,
            matmul="dynamic",
            per_channel=True,
            reduce_range=True,
        ),
        Recipe("uint8-int4emb", int4_embeddings=True, matmul="dynamic", weight_type="quint8"),
        Recipe(
            "uint8pc-int4emb",
            int4_embeddings=True,
            matmul="dynamic",
            weight_type="quint8",
            per_channel=True,
        ),
        Recipe("w8-int4emb", int4_embeddings=True, matmul="nbits", nbits=8),
        Recipe("int4", int4_embeddings=True, matmul="nbits", nbits=4),
    )
}


def weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of MatMul nodes whose second input is a constant weight (what gets quantized)."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in consts]


def quantize_graph(src: Path, dst: Path, recipe: Recipe) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    with tempfile.TemporaryDirectory(prefix="kascade-q-") as work:
        # One self-contained file: the quantizers write intermediate models to other
        # folders, where ``src``'s external weights would no longer be found.
        current = Path(work) / "fp32.onnx"
        onnx.save(onnx.load(str(src)), str(current))
        if recipe.int4_embeddings:
            config = DefaultWeightOnlyQuantConfig(
                block_size=recipe.block_size,
                is_symmetric=True,
                op_types_to_quantize=("Gather",),
                quant_axes=(("Gather", 1),),
            )
            q = MatMulNBitsQuantizer(onnx.load(str(current)), algo_config=config)
            q.process()
            current = Path(work) / "int4emb.onnx"
            q.model.save_model_to_file(str(current), use_external_data_format=False)
        if recipe.matmul == "dynamic":
            out = Path(work) / "dynamic.onnx"
            kept = set(recipe.keep_fp32)
            # Only weight MatMuls: quantizing attention's activation x activation
            # products (softmax probabilities to 8 bits) costs accuracy for little speed.
            targets = [n for n in weight_matmuls(onnx.load(str(current))) if n not in kept]
            quantize_dynamic(
                str(current),
                str(out),
                op_types_to_quantize=["MatMul"],
                weight_type=QuantType.QInt8 if recipe.weight_type == "qint8" else QuantType.QUInt8,
                per_channel=recipe.per_channel,
                reduce_range=recipe.reduce_range,
                nodes_to_quantize=targets,
                # After the INT4 Gather pass, shape inference cannot type some tensors.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            current = out
        elif recipe.matmul == "nbits":
            config = DefaultWeightOnlyQuantConfig(
                block_size=recipe.block_size,
                is_symmetric=True,
                op_types_to_quantize=("MatMul",),
                bits=recipe.nbits,
            )
            q = MatMulNBitsQuantizer(
                onnx.load(str(current)),
                nodes_to_exclude=list(recipe.keep_fp32),
                algo_config=config,
            )
            q.process()
            current = Path(work) / "nbits.onnx"
            q.model.save_model_to_file(str(current), use_external_data_format=False)
        shutil.copyfile(current, dst)


def check_quantized(path: Path, recipe: Recipe, matmuls_before: list[str]) -> dict[str, int]:
    """Op counts of a written graph; raises if the recipe's intended weights are not quantized.

    ``matmuls_before`` are the FP32 graph's weight MatMuls: afterwards exactly the ones
    the recipe keeps may still be FP32 (the quantizer also splits Gemm heads into
    MatMul + Add, which are not counted).
    """
    model = onnx.load(str(path))
    ops = Counter(n.op_type for n in model.graph.node)
    left = set(weight_matmuls(model)) & set(matmuls_before)
    problems = []
    if recipe.int4_embeddings and ops["GatherBlockQuantized"] == 0:
        problems.append("no GatherBlockQuantized: the embedding table is not INT4")
    if recipe.matmul == "dynamic" and not sum(ops[o] for o in QUANTIZED_MATMUL_OPS):
        problems.append("no integer MatMul: weights are not INT8")
    if recipe.matmul == "nbits" and ops["MatMulNBits"] == 0:
        problems.append("no MatMulNBits: weights are not block-quantized")
    expected = set(matmuls_before) if recipe.matmul == "fp32" else set(recipe.keep_fp32)
    if left != expected:
        problems.append(f"{len(left)} FP32 weight MatMuls left, expected {len(expected)}")
    if problems:
        raise ToolchainError(f"{path.name} ({recipe.name}): {'; '.join(problems)}")
    return {
        "gather_int4": ops["GatherBlockQuantized"],
        "matmul_int8": sum(ops[o] for o in QUANTIZED_MATMUL_OPS),
        "matmul_nbits": ops["MatMulNBits"],
        "matmul_fp32": len(left),
    }


def quantize_dir(
    src: Path, out: Path, recipe: Recipe, *, measured: dict | None = None
) -> ModelManifest:
    """Write ``out``: ``src``'s FP32 model directory quantized with ``recipe``, validated."""
    parent, parent_sha = read_manifest(src)
    if parent.variant != "fp32":
        raise ToolchainError(f"{src} is already quantized ({parent.variant}); start from fp32")
    with staged_directory(out) as tmp:
        before = weight_matmuls(onnx.load(str(src / FULL_GRAPH)))
        quantize_graph(src / FULL_GRAPH, tmp / FULL_GRAPH, recipe)
        counts = check_quantized(tmp / FULL_GRAPH, recipe, before)
        cut_stages(tmp)
        share_weights(tmp)
        for name in (TOKENIZER, LABELS):
            shutil.copyfile(src / name, tmp / name)
        manifest = parent.model_copy(
            update={
                "variant": recipe.name,
                "quantization": recipe.settings() | {"op_counts": counts},
                "measured": measured or {},
                "parent_sha256": parent_sha,
            }
        )
        manifest = finish(tmp, manifest)
        _smoke_test(tmp)
    return manifest


def _smoke_test(directory: Path) -> None:
    """Every graph loads and the full graph and stage chain classify a sequence alike."""
    import numpy as np

    from kascade.operators.encoder import Encoder, load_model_dir

    loaded = load_model_dir(directory)
    ids = loaded.tokenizer.encode("a short sentence to check the quantized model").ids
    seq = np.asarray(ids, dtype=np.int64)
    full = Encoder(loaded, graphs="full").logits(seq)
    chain = Encoder(loaded, graphs="stages").logits(seq)
    if not np.all(np.isfinite(full)) or full.argmax() != chain.argmax():
        raise ToolchainError(f"{directory.name}: quantized graphs disagree or give NaN")
    assert all((directory / g).is_file() for g in STAGE_GRAPHS)
