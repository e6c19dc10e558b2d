"""Export: HF checkpoint -> ONNX directory whose logits match PyTorch, with a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import kascade_cli

from kascade.errors import UsageError
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.manifest import ManifestMismatch, read_manifest
from kascade.toolchain.checkpoint import load_classifier
from kascade.toolchain.export import PARITY_TOLERANCE, export_checkpoint, parity

ARCHS = ["modernbert", "bert"]


@pytest.mark.parametrize("arch", ARCHS)
def test_export_matches_pytorch_below_and_above_the_local_window_and_padded(
    arch: str, exported: dict[str, Path]
) -> None:
    manifest, _ = read_manifest(exported[arch])
    assert manifest.parity is not None
    assert manifest.parity.max_abs_logit_diff <= PARITY_TOLERANCE
    assert manifest.parity.stage_chain_max_abs_diff <= PARITY_TOLERANCE
    assert manifest.parity.padded_batch
    # The tiny ModernBERT's local window is 32 tokens; parity must look past it.
    assert min(manifest.parity.lengths) < 32 < max(manifest.parity.lengths)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_stage_chain_classifies_text_exactly_like_the_full_graph(
    arch: str, exported: dict[str, Path]
) -> None:
    loaded = load_model_dir(exported[arch])
    full, stages = Encoder(loaded, graphs="full"), Encoder(loaded, graphs="stages")
    for text in ["the team won the cup", "doctors recommend exercise " * 20]:
        ids = loaded.encode(text)
        np.testing.assert_allclose(full.logits(ids), stages.logits(ids), atol=1e-5)


def test_the_parity_check_catches_a_graph_that_differs_from_the_model(
    checkpoints: dict[str, Path], exported: dict[str, Path]
) -> None:
    import torch

    model = load_classifier(str(checkpoints["modernbert"]))
    with torch.no_grad():
        model.classifier.bias += 0.01
    assert parity(model, exported["modernbert"], max_length=512).max_abs_logit_diff > 5e-3


def test_the_manifest_hashes_every_file_and_tampering_is_detected(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported["bert"], copy)
    manifest, digest = read_manifest(copy)
    assert set(manifest.files) == {
        "model.onnx",
        "embed.onnx",
        "prefix.onnx",
        "suffix.onnx",
        "weights.bin",
        "tokenizer.json",
        "labels.json",
    }
    assert len(digest) == 64
    assert json.loads((copy / "labels.json").read_text()) == manifest.labels
    with open(copy / "suffix.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestMismatch, match=r"suffix\.onnx does not match"):
        read_manifest(copy)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_every_weight_is_stored_once_and_the_graphs_share_it(
    exported: dict[str, Path], arch: str
) -> None:
    import onnx
    from onnx.external_data_helper import uses_external_data

    d = exported[arch]
    where: dict[str, tuple[str, str]] = {}
    for graph in ("model.onnx", "embed.onnx", "prefix.onnx", "suffix.onnx"):
        model = onnx.load(str(d / graph), load_external_data=False)
        for t in model.graph.initializer:
            if not uses_external_data(t):
                assert len(t.raw_data) < 1024, f"{graph}: {t.name} is stored inline"
                continue
            info = {e.key: e.value for e in t.external_data}
            assert info["location"] == "weights.bin"
            # The same tensor in two graphs points at the same bytes.
            assert where.setdefault(t.name, (info["offset"], info["length"])) == (
                info["offset"],
                info["length"],
            )
    stored = sum(int(length) for _, length in where.values())
    # Each tensor once (plus page alignment): not once per graph that reads it.
    assert stored <= (d / "weights.bin").stat().st_size < stored + 4096 * (len(where) + 1)


def test_the_export_command_says_what_it_wrote_and_nothing_a_user_cannot_act_on(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = kascade_cli("export", "--model", str(checkpoints["bert"]), "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: bert, ")
    assert r.stderr == ""  # no exporter warnings (torchvision, dynamic axis names)


def test_export_refuses_an_existing_output_directory(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "exists"
    out.mkdir()
    with pytest.raises(UsageError, match="already exists"):
        export_checkpoint(str(checkpoints["bert"]), out, cascade_layer=2, max_length=None)


def test_a_failed_export_leaves_nothing_half_written(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "never"
    with pytest.raises(UsageError, match=r"cascade-layer"):
        export_checkpoint(str(checkpoints["bert"]), out, cascade_layer=9, max_length=None)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_without_a_classification_head_is_a_one_line_error(tmp_path: Path) -> None:
    from tiny_models import tiny_bert

    base = tiny_bert(tmp_path / "base", head=False)
    r = kascade_cli("export", "--model", str(base), "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"kascade: {base} has no sequence-classification head; fine-tune it with kascade train"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "checkpoint not found"),
        (lambda d: d.mkdir(), "is not a Hugging Face checkpoint (no config.json)"),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "gpt2"}')),
            "unsupported architecture 'gpt2'",
        ),
    ],
    ids=["missing", "no_config", "unsupported"],
)
def test_bad_checkpoints_get_a_one_line_error_naming_the_problem(
    tmp_path: Path, setup, message: str
) -> None:
    ckpt = tmp_path / "ckpt"
    setup(ckpt)
    r = kascade_cli("export", "--model", str(ckpt), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
