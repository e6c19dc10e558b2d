"""Evaluate and train: the numbers are the ones a hand count gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import kascade_cli
from tiny_models import CORPUS, LABELS

from kascade.errors import UsageError
from kascade.schemas.manifest import read_manifest
from kascade.toolchain.data import Examples, read_examples
from kascade.toolchain.evaluate import evaluate, macro_f1
from kascade.toolchain.measure import run, tokenize
from kascade.toolchain.quantize import PRESETS, quantize_dir


def test_macro_f1_matches_a_hand_count() -> None:
    # a: tp=2 fp=1 fn=0 -> F1 0.8; b: tp=1 fp=0 fn=1 -> F1 2/3.
    assert macro_f1(["a", "a", "b", "b"], ["a", "a", "a", "b"], ["a", "b"]) == pytest.approx(
        (0.8 + 2 / 3) / 2
    )


def test_evaluate_reports_accuracy_agreement_and_deltas_against_the_reference(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    ref_dir = exported["bert"]
    labels = read_manifest(ref_dir)[0].labels
    texts = CORPUS * 2
    preds = run(ref_dir, tokenize(ref_dir, texts)).predictions
    # Truth agrees with the reference model on exactly the first half.
    half = len(texts) // 2
    truth = [labels[p] for p in preds[:half]] + [
        labels[(p + 1) % len(labels)] for p in preds[half:]
    ]
    q = tmp_path / "int8"
    quantize_dir(ref_dir, q, PRESETS["int8-int4emb"])
    rows = evaluate([q], Examples(texts, truth), reference=ref_dir, memory=True)
    ref_row, q_row = rows
    assert ref_row.variant == "fp32" and q_row.variant == "int8-int4emb"
    assert ref_row.accuracy == pytest.approx(0.5)
    assert ref_row.agreement == 1.0 and ref_row.f1_delta == 0.0 and ref_row.speedup == 1.0
    q_preds = run(q, tokenize(ref_dir, texts)).predictions
    assert q_row.agreement == pytest.approx((q_preds == preds).mean())
    assert q_row.f1_delta == pytest.approx(q_row.macro_f1 - ref_row.macro_f1)
    assert q_row.size_mb < ref_row.size_mb
    assert 20 < q_row.peak_rss_mb < ref_row.peak_rss_mb + 50
    assert q_row.ms_per_chunk > 0


def test_evaluate_runs_each_model_under_each_engine_against_the_onnxruntime_reference(
    exported: dict[str, Path],
) -> None:
    from kascade.operators import backends
    from kascade.schemas.engine import ENGINES

    here = tuple(e for e in ENGINES if backends.runs_here(e))
    if len(here) == 1:
        pytest.skip("only ONNX Runtime runs on this host (OpenVINO missing)")
    ref_dir = exported["bert"]
    rows = evaluate([], Examples(CORPUS, None), reference=ref_dir, memory=False, engines=here)
    assert [r.engine for r in rows] == [e.name for e in here]
    by = {r.engine: r for r in rows}
    assert by["onnxruntime/fp32"].agreement == 1.0
    # the same graph under OpenVINO in FP32: the same labels on every text
    assert by["openvino/fp32"].agreement == 1.0


def test_evaluate_rejects_labels_the_model_does_not_know(exported: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match="not known to the model: weather"):
        evaluate([], Examples(["x"], ["weather"]), reference=exported["bert"], memory=False)


def test_an_unknown_label_column_is_named_with_the_columns_that_exist(tmp_path: Path) -> None:
    f = tmp_path / "d.tsv"
    f.write_text("text\tcategory\nhello\tsports\n")
    with pytest.raises(UsageError, match="no column 'label'; its columns are text, category"):
        read_examples(f, label_column="label")


def test_training_writes_a_checkpoint_that_exports(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from tiny_models import tiny_bert

    from kascade.toolchain.export import export_checkpoint
    from kascade.toolchain.provenance import examples_sha256
    from kascade.toolchain.train import TrainConfig, train

    base = tiny_bert(tmp_path / "base", head=False)
    texts = CORPUS * 3
    labels = [LABELS[i % 3] for i in range(len(texts))]
    result = train(
        str(base),
        tmp_path / "ft",
        Examples(texts, labels),
        Examples(CORPUS, labels[:13]),
        TrainConfig(epochs=2, batch_size=8, max_length=32),
    )
    assert result["labels"] == sorted(set(labels))
    assert [h["epoch"] for h in result["history"]] == [1, 2]
    assert all(0.0 <= h["dev_macro_f1"] <= 1.0 for h in result["history"])
    manifest = export_checkpoint(
        str(tmp_path / "ft"), tmp_path / "onnx", cascade_layer=1, max_length=64
    )
    assert manifest.labels == sorted(set(labels))
    # The manifest says how to make the model again, not just which directory it came from.
    made = manifest.provenance
    assert made is not None
    assert made.base.name == str(base.resolve()) and made.base.version.startswith("sha256:")
    assert made.training_examples == len(texts)
    assert made.training_data_sha256 == examples_sha256(Examples(texts, labels))
    assert made.dev_data_sha256 == examples_sha256(Examples(CORPUS, labels[:13]))
    assert made.recipe["epochs"] == 2 and made.recipe["max_length"] == 32
    assert made.tools["torch"] != "not installed"


def test_kascade_train_prints_its_epochs_and_nothing_a_user_cannot_act_on(tmp_path: Path) -> None:
    from tiny_models import tiny_bert

    base = tiny_bert(tmp_path / "base", head=False)
    data = tmp_path / "train.tsv"
    rows = [f"{t}\t{LABELS[i % 3]}" for i, t in enumerate(CORPUS * 2)]
    data.write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    r = kascade_cli(
        "train",
        "--model",
        str(base),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "ft"),
        "--epochs",
        "1",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no load reports, progress bars or framework warnings
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("epoch 1: train loss ")
    assert lines[1:] == [f"wrote {tmp_path / 'ft'} (3 labels)"]
