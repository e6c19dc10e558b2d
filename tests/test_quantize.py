"""Quantize: every preset writes a validated directory; the budgeted search keeps its budget."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from tiny_models import CORPUS, LABELS

from kascade.errors import UsageError
from kascade.schemas.manifest import FULL_GRAPH, read_manifest
from kascade.toolchain import ToolchainError
from kascade.toolchain.data import Examples
from kascade.toolchain.measure import run, size_mb, tokenize
from kascade.toolchain.quantize import (
    PRESETS,
    Recipe,
    check_quantized,
    quantize_dir,
    weight_matmuls,
)
from kascade.toolchain.search import Budget, bf16_engines, search

EXPECTED_OPS = {
    "fp32": {"gather_int4": False, "matmul_int8": False, "matmul_nbits": False},
    "int4emb": {"gather_int4": True, "matmul_int8": False, "matmul_nbits": False},
    "int8": {"gather_int4": False, "matmul_int8": True, "matmul_nbits": False},
    "int8pc": {"gather_int4": False, "matmul_int8": True, "matmul_nbits": False},
    "uint8pc": {"gather_int4": False, "matmul_int8": True, "matmul_nbits": False},
    "int8-int4emb": {"gather_int4": True, "matmul_int8": True, "matmul_nbits": False},
    "int8pc-int4emb": {"gather_int4": True, "matmul_int8": True, "matmul_nbits": False},
    "uint8-int4emb": {"gather_int4": True, "matmul_int8": True, "matmul_nbits": False},
    "uint8pc-int4emb": {"gather_int4": True, "matmul_int8": True, "matmul_nbits": False},
    "w8-int4emb": {"gather_int4": True, "matmul_int8": False, "matmul_nbits": True},
    "int4": {"gather_int4": True, "matmul_int8": False, "matmul_nbits": True},
}


def test_every_preset_is_covered_by_this_test() -> None:
    assert set(EXPECTED_OPS) == set(PRESETS)


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_quantizes_the_intended_weights_and_records_it(
    arch: str, preset: str, exported: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / preset
    manifest = quantize_dir(exported[arch], out, PRESETS[preset])
    reread, _ = read_manifest(out)  # hashes verified
    assert reread == manifest
    assert manifest.variant == preset
    assert manifest.parent_sha256 == read_manifest(exported[arch])[1]
    counts = manifest.quantization["op_counts"]
    for op, present in EXPECTED_OPS[preset].items():
        assert (counts[op] > 0) == present, op
    fp32_matmuls = len(weight_matmuls(onnx.load(str(exported[arch] / FULL_GRAPH))))
    assert counts["matmul_fp32"] == (fp32_matmuls if preset in ("fp32", "int4emb") else 0)


def test_quantized_models_are_smaller(exported: dict[str, Path], tmp_path: Path) -> None:
    sizes = {}
    for preset in ("fp32", "int8-int4emb", "int4"):
        quantize_dir(exported["bert"], tmp_path / preset, PRESETS[preset])
        sizes[preset] = size_mb(tmp_path / preset)
    assert sizes["int4"] < sizes["int8-int4emb"] < 0.75 * sizes["fp32"]


def test_validation_rejects_a_graph_whose_weights_were_not_quantized(
    exported: dict[str, Path],
) -> None:
    path = exported["bert"] / FULL_GRAPH
    before = weight_matmuls(onnx.load(str(path)))
    with pytest.raises(ToolchainError, match="no integer MatMul"):
        check_quantized(path, PRESETS["int8"], before)


def test_kept_matmuls_stay_fp32_and_the_rest_are_quantized(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    names = weight_matmuls(onnx.load(str(exported["modernbert"] / FULL_GRAPH)))
    recipe = PRESETS["uint8-int4emb"].keeping(names[:3])
    manifest = quantize_dir(exported["modernbert"], tmp_path / "kept", recipe)
    assert manifest.quantization["op_counts"]["matmul_fp32"] == 3
    assert manifest.quantization["keep_fp32"] == names[:3]
    assert manifest.variant == "uint8-int4emb+fp32x3"


def test_qint8_without_reduce_range_is_refused() -> None:
    with pytest.raises(ValueError, match="reduce_range"):
        Recipe("bad", matmul="dynamic", weight_type="qint8", reduce_range=False)


def test_an_already_quantized_directory_is_not_quantized_again(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    quantize_dir(exported["bert"], tmp_path / "q", PRESETS["int8"])
    with pytest.raises(ToolchainError, match="already quantized"):
        quantize_dir(tmp_path / "q", tmp_path / "qq", PRESETS["int8"])


def _calibration() -> Examples:
    texts = [f"{a} and {b}" for a in CORPUS for b in CORPUS[:6]]
    return Examples(texts=texts, labels=[LABELS[i % len(LABELS)] for i in range(len(texts))])


def test_the_budgeted_search_keeps_a_variant_that_meets_the_budget(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    data = _calibration()
    budget = Budget(min_agreement=0.99)
    result = search(
        exported["modernbert"],
        tmp_path / "chosen",
        data,
        budget,
        candidates=("int8-int4emb", "uint8-int4emb", "int4emb"),
        refine=1,
        sensitivity_sample=16,
    )
    chosen_rows = [
        c for c in result.table if (c.variant, c.engine) == (result.chosen.name, result.engine.name)
    ]
    assert chosen_rows and chosen_rows[0].meets
    assert all(c.meets == (c.agreement >= 0.99) for c in result.table)
    assert result.manifest.measured["chosen"] == result.chosen.name
    assert result.manifest.measured["engine"] == result.engine.name
    # The float-MatMul variants under bf16 too, where the host runs it; nothing else.
    bf16 = {c.variant for c in result.table if c.engine.endswith("/bf16")}
    assert bf16 == ({"fp32", "int4emb"} if bf16_engines() else set())
    # Re-measured from the written directory with the chosen engine, the budget holds.
    seqs = tokenize(exported["modernbert"], data.texts)
    ref = run(exported["modernbert"], seqs).predictions
    got = run(tmp_path / "chosen", seqs, engine=result.engine).predictions
    assert (ref == got).mean() >= 0.99
    faster = [c for c in result.table if c.meets and c.ms_per_chunk < chosen_rows[0].ms_per_chunk]
    assert faster == []


def test_an_f1_budget_needs_labels(exported: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="needs labeled"):
        search(exported["bert"], tmp_path / "x", Examples(["a"], None), Budget(max_f1_drop=0.01))
