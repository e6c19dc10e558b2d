"""Engines: which one a run picks, that each computes what FP32 ONNX Runtime computes, and
that a cascade is served only by the engine it was calibrated with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import SMALL_CHUNKS, calibration, texts
from pydantic import ValidationError
from tiny_models import CORPUS

from kascade.dataflow.flow import prepare
from kascade.errors import UsageError
from kascade.operators import backends
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas import CascadeUse
from kascade.schemas.cascade import CASCADE_FILE, CascadeMismatch
from kascade.schemas.engine import Backend, Engine, Precision
from kascade.schemas.manifest import ModelManifest
from kascade.schemas.settings import EncoderSettings, Settings

ORT = Engine()
OV_FP32 = Engine(backend=Backend.OPENVINO, precision=Precision.FP32)
OV_BF16 = Engine(backend=Backend.OPENVINO, precision=Precision.BF16)
AMX = frozenset({"BF16", "FP32", "INT8"})
NO_BF16 = frozenset({"FP32", "INT8"})


def manifest(matmul: str = "fp32") -> ModelManifest:
    return ModelManifest(
        source="x", architecture="bert", variant="v", labels=["a", "b"], max_length=512,
        opset=18, num_layers=4, hidden_size=32, cascade_layer=2, files={},
        quantization={} if matmul == "fp32" else {"matmul": matmul},
    )  # fmt: skip


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Pretend the host's OpenVINO reports ``capabilities`` (empty: not installed)."""

    def set_to(capabilities: frozenset[str], matrix_units: bool | None = None) -> None:
        monkeypatch.setattr(backends, "host_capabilities", lambda: capabilities)
        amx = "BF16" in capabilities if matrix_units is None else matrix_units
        monkeypatch.setattr(backends, "bf16_matrix_units", lambda: amx)
        if not capabilities:

            def missing() -> None:
                raise UsageError("the openvino backend needs the openvino package")

            monkeypatch.setattr(backends, "_openvino_core", missing)
        else:
            monkeypatch.setattr(backends, "_openvino_core", lambda: object())

    return set_to


def test_auto_runs_a_float_graph_in_bf16_on_openvino_where_the_host_has_bf16_units(
    host,  # type: ignore[no-untyped-def]
) -> None:
    host(AMX)
    assert backends.resolve(EncoderSettings(), manifest()) == OV_BF16


def test_auto_leaves_an_int8_graph_to_onnxruntime_whose_integer_kernels_are_faster(
    host,  # type: ignore[no-untyped-def]
) -> None:
    host(AMX)
    assert backends.resolve(EncoderSettings(), manifest("dynamic")) == ORT


def test_auto_is_onnxruntime_without_bf16_units_or_without_openvino(
    host,  # type: ignore[no-untyped-def]
) -> None:
    for capabilities in (NO_BF16, frozenset()):
        host(capabilities)
        assert backends.resolve(EncoderSettings(), manifest()) == ORT


def test_auto_leaves_bf16_alone_where_the_host_has_avx512_bf16_but_no_amx(
    host,  # type: ignore[no-untyped-def]
) -> None:
    # Measured there (docs/BENCHMARKS.md section 28): OpenVINO's bf16 ran slower than
    # ONNX Runtime's INT8 and FP32 and than its own FP32.
    host(AMX, matrix_units=False)
    assert backends.resolve(EncoderSettings(), manifest()) == ORT
    assert backends.resolve(EncoderSettings(backend="openvino"), manifest()) == OV_FP32
    # Asked for by name, bf16 runs: the host has the instructions.
    assert backends.resolve(EncoderSettings(precision="bf16"), manifest()) == OV_BF16


def test_auto_keeps_the_engine_the_cascade_was_calibrated_with_where_it_runs(
    host,  # type: ignore[no-untyped-def]
) -> None:
    host(AMX)
    assert backends.resolve(EncoderSettings(), manifest(), certified=ORT) == ORT
    host(NO_BF16)  # calibrated on an AMX host, run on one without: the host decides
    assert backends.resolve(EncoderSettings(), manifest(), certified=OV_BF16) == ORT


def test_an_explicit_engine_the_host_cannot_run_is_a_usage_error_not_a_substitute(
    host,  # type: ignore[no-untyped-def]
) -> None:
    host(NO_BF16)
    with pytest.raises(UsageError, match="no bf16 units"):
        backends.resolve(EncoderSettings(precision="bf16"), manifest())
    host(frozenset())
    with pytest.raises(UsageError, match="needs the openvino package"):
        backends.resolve(EncoderSettings(backend="openvino"), manifest())


def test_bf16_on_onnxruntime_is_refused_when_the_settings_are_made() -> None:
    with pytest.raises(ValidationError, match=r"needs --encoder\.backend openvino"):
        EncoderSettings(backend="onnxruntime", precision="bf16")
    with pytest.raises(ValidationError, match="openvino backend only"):
        Engine(backend=Backend.ONNXRUNTIME, precision=Precision.BF16)


def test_an_engine_name_reads_back_as_the_same_engine() -> None:
    for engine in (ORT, OV_FP32, OV_BF16):
        assert Engine.parse(engine.name) == engine


def _needs(engine: Engine) -> None:
    if not backends.runs_here(engine):
        pytest.skip(f"{engine.name} does not run on this host (OpenVINO or bf16 units missing)")


def _sequences(model_dir: Path) -> list[np.ndarray]:
    loaded = load_model_dir(model_dir)
    # below and above the tiny ModernBERT's 32-token local window
    return [loaded.encode(" ".join(CORPUS[: 1 + i])) for i in range(0, 12, 3)]


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
def test_openvino_in_fp32_computes_what_onnxruntime_computes_full_graph_and_stage_chain(
    arch: str, exported: dict[str, Path]
) -> None:
    _needs(OV_FP32)
    loaded = load_model_dir(exported[arch])
    reference = Encoder(loaded)
    full = Encoder(loaded, engine=OV_FP32)
    stages = Encoder(loaded, graphs="stages", engine=OV_FP32)
    seqs = _sequences(exported[arch])
    for ids in seqs:
        want = reference.logits(ids)
        np.testing.assert_allclose(full.logits(ids), want, atol=1e-4)
        np.testing.assert_allclose(stages.logits(ids), want, atol=1e-4)
    np.testing.assert_allclose(full.logits_batch(seqs), reference.logits_batch(seqs), atol=1e-4)


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
def test_openvino_in_bf16_stays_within_bf16_rounding_of_fp32(
    arch: str, exported: dict[str, Path]
) -> None:
    _needs(OV_BF16)
    loaded = load_model_dir(exported[arch])
    reference, bf16 = Encoder(loaded), Encoder(loaded, engine=OV_BF16)
    for ids in _sequences(exported[arch]):
        want, got = reference.logits(ids), bf16.logits(ids)
        assert not np.array_equal(got, want)  # bf16 really ran
        np.testing.assert_allclose(got, want, atol=0.05 * max(1.0, float(np.abs(want).max())))


def test_a_cascade_is_refused_under_another_engine_and_names_both(
    calibrated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "m"
    shutil.copytree(calibrated, d)
    spec = json.loads((d / CASCADE_FILE).read_text())
    assert spec["engine"] == {"backend": "onnxruntime", "precision": "fp32"}
    spec["engine"] = {"backend": "openvino", "precision": "fp32"}
    (d / CASCADE_FILE).write_text(json.dumps(spec))
    monkeypatch.setattr(backends, "host_capabilities", lambda: NO_BF16)
    run = {"model_dir": d, "chunking": SMALL_CHUNKS.model_dump(), "cascade": {"mode": "on"}}
    with pytest.raises(CascadeMismatch, match="certified with the openvino/fp32 engine; this run"):
        prepare(Settings(**run, encoder={"backend": "onnxruntime"}))
    fallback = prepare(
        Settings(
            **run | {"cascade": {"mode": "on", "if_uncertified": "full_model"}},
            encoder={"backend": "onnxruntime"},
        )
    )
    assert (fallback.cascade, fallback.engine) == (CascadeUse.UNCERTIFIED, ORT)


def test_a_cascade_from_before_engines_were_named_reads_as_onnxruntime_fp32(
    calibrated: Path, tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(calibrated, d)
    spec = json.loads((d / CASCADE_FILE).read_text())
    del spec["engine"]
    spec["version"] = 3
    (d / CASCADE_FILE).write_text(json.dumps(spec))
    got = prepare(Settings(model_dir=d, chunking=SMALL_CHUNKS.model_dump(), cascade={"mode": "on"}))
    assert (got.cascade, got.engine) == (CascadeUse.ON, ORT)


def test_calibrating_with_an_engine_records_it_and_a_run_under_auto_takes_it_up(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    _needs(OV_FP32)
    from kascade.toolchain.calibrate import calibrate

    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    spec = calibrate(
        d,
        texts(300),
        calibration(OV_FP32, epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS, processes=1),
        path=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
    )
    assert spec.engine == OV_FP32
    got = prepare(Settings(model_dir=d, chunking=SMALL_CHUNKS.model_dump(), cascade={"mode": "on"}))
    assert (got.cascade, got.engine) == (CascadeUse.ON, OV_FP32)


def test_auto_takes_the_engine_the_quantization_search_chose_for_the_variant(
    host,  # type: ignore[no-untyped-def]
) -> None:
    host(AMX)
    # a float graph whose search found ONNX Runtime within the budget and bf16 outside it
    chosen = manifest().model_copy(update={"measured": {"engine": "onnxruntime/fp32"}})
    assert backends.resolve(EncoderSettings(), chosen) == ORT
    assert backends.resolve(EncoderSettings(precision="bf16"), chosen) == OV_BF16
    broken = manifest().model_copy(update={"measured": {"engine": "tensorrt/fp8"}})
    with pytest.raises(UsageError, match="unknown engine 'tensorrt/fp8'"):
        backends.resolve(EncoderSettings(), broken)
