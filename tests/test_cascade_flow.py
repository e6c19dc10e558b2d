"""Calibrating a real (tiny) model and running the cascade through the real broker."""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
from bytewax.testing import run_main
from helpers import SMALL_CHUNKS, calibration, documents, kascade_cli, outputs, send, texts

from kascade.dataflow.flow import build_flow, prepare
from kascade.errors import UsageError
from kascade.operators.calibration import Cascade
from kascade.schemas import CascadeUse
from kascade.schemas.cascade import CASCADE_FILE, CascadeMismatch, CascadeSpec
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.manifest import MANIFEST, TOKENIZER, read_manifest
from kascade.schemas.settings import Settings
from kascade.toolchain.calibrate import CalibrationTooSmall, calibrate


def test_calibration_writes_heads_and_a_certified_point_bound_to_the_model(
    calibrated: Path,
) -> None:
    spec = CascadeSpec.model_validate(json.loads((calibrated / CASCADE_FILE).read_text()))
    _, digest = read_manifest(calibrated)
    assert spec.model_manifest_sha256 == digest
    point = spec.operating_points[spec.default_operating_point]
    assert (point.epsilon, point.delta) == (0.1, 0.1)
    assert point.calibration_disagreements <= point.epsilon * point.calibration_accepted
    assert 0 < point.expected_share_s0 + point.expected_share_s1 <= 1
    assert spec.report.chunks == 300
    assert spec.report.by_language == {}  # the texts named no language
    assert Cascade.load(calibrated, digest).point == point


def test_calibration_refuses_a_language_list_that_does_not_match_the_texts(
    exported: dict[str, Path],
) -> None:
    with pytest.raises(UsageError, match="2 languages for 3 calibration texts"):
        calibrate(exported["modernbert"], texts(3), languages=["de", "ja"])


def test_a_cascade_calibrated_for_another_model_is_refused(calibrated: Path) -> None:
    with pytest.raises(CascadeMismatch, match="calibrated for another model"):
        Cascade.load(calibrated, "0" * 64)


def test_too_little_calibration_text_is_refused_with_the_numbers(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(exported["bert"], d)
    with pytest.raises(CalibrationTooSmall, match="needs at least 299 accepted chunks"):
        calibrate(d, texts(100), calibration(epsilon=0.01, delta=0.05, chunking=SMALL_CHUNKS))
    assert not (d / CASCADE_FILE).exists()
    f = tmp_path / "few.txt"
    f.write_text("\n".join(texts(50)))
    r = kascade_cli("calibrate", "--model", str(d), "--texts", str(f), timeout=300)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "calibration chunks" in r.stderr


def _cascade_on(kafka_settings: KafkaSettings, model_dir: Path) -> Settings:
    """A run with the calibration's chunking and the cascade on, auditing half."""
    return Settings(
        kafka=kafka_settings,
        model_dir=model_dir,
        chunking={"max_tokens": 64, "overlap": 8},
        cascade={"mode": "on", "audit_fraction": 0.5},
    )


@pytest.mark.kafka
def test_the_cascade_settles_chunks_and_every_document_still_gets_one_label(
    kafka_settings: KafkaSettings, calibrated: Path
) -> None:
    docs = documents(40)
    send(kafka_settings, docs)
    settings = _cascade_on(kafka_settings, calibrated)
    run_main(build_flow(settings))
    out = outputs(kafka_settings)
    assert sorted(r.id for r in out) == sorted(d.id for d in docs)
    for r in out:
        c = r.chunks
        assert c.settled_s0 + c.settled_s1 + c.full_model + c.skipped == c.total > 0
        assert r.label is not None and not r.degraded
    assert sum(r.chunks.settled_s0 + r.chunks.settled_s1 for r in out) > 0


def test_asking_for_the_cascade_without_a_calibration_is_a_one_line_error(
    exported: dict[str, Path],
) -> None:
    r = kascade_cli("run", "--model-dir", str(exported["bert"]), "--cascade", "on")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"kascade: {exported['bert']} has no cascade.json; run kascade calibrate"
    ]


def test_a_run_with_other_chunking_refuses_the_cascade_in_one_line(calibrated: Path) -> None:
    r = kascade_cli("run", "--model-dir", str(calibrated), "--chunk-tokens", "96", "--overlap", "8")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kascade: the cascade was certified on 64-token chunks with overlap 8; this run makes"
        " 96-token chunks with overlap 8: run with the certified settings, run kascade"
        " calibrate again, or set cascade.if_uncertified=full_model to classify every chunk"
        " with the full model"
    ]


def test_calibration_records_the_chunking_and_tokenizer_it_was_certified_on(
    calibrated: Path,
) -> None:
    spec = CascadeSpec.model_validate_json((calibrated / CASCADE_FILE).read_text())
    manifest, _ = read_manifest(calibrated)
    assert (spec.chunking.max_tokens, spec.chunking.overlap) == (64, 8)
    assert spec.chunking.tokenizer_sha256 == manifest.files["tokenizer.json"]


@pytest.mark.kafka
def test_asked_to_go_on_without_an_uncertified_cascade_every_record_says_so(
    kafka_settings: KafkaSettings, calibrated: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = documents(6)
    send(kafka_settings, docs)
    settings = Settings(
        kafka=kafka_settings,
        model_dir=calibrated,
        chunking={"max_tokens": 96, "overlap": 8},
        cascade={"if_uncertified": "full_model"},
    )
    run_main(build_flow(settings))
    out = outputs(kafka_settings)
    assert sorted(r.id for r in out) == sorted(d.id for d in docs)
    assert {r.cascade for r in out} == {CascadeUse.UNCERTIFIED}
    assert all(r.chunks.full_model == r.chunks.total for r in out)
    assert "every chunk goes to the full model" in caplog.text


@pytest.mark.kafka
def test_a_worker_builds_from_the_prepared_run_without_opening_the_model_files_again(
    kafka_settings: KafkaSettings, calibrated: Path, tmp_path: Path
) -> None:
    """The run plan is resolved once: with the manifest, tokenizer and cascade.json gone
    after ``prepare`` (the graphs stay: each process opens those), a worker's flow built
    from the pickled plan, as the supervisor sends it, labels every document and names
    the calibration that settled its chunks."""
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    docs = documents(12)
    send(kafka_settings, docs)
    settings = _cascade_on(kafka_settings, model)
    build = pickle.loads(pickle.dumps(functools.partial(build_flow, prepared=prepare(settings))))
    in_force = hashlib.sha256((model / CASCADE_FILE).read_bytes()).hexdigest()
    for name in (MANIFEST, TOKENIZER, CASCADE_FILE):
        (model / name).unlink()
    run_main(build(settings))
    out = outputs(kafka_settings)
    assert sorted(r.id for r in out) == sorted(d.id for d in docs)
    assert {r.model.cascade_sha256 for r in out} == {in_force}
    assert not any(r.degraded for r in out)
    assert sum(r.chunks.settled_s0 + r.chunks.settled_s1 for r in out) > 0
