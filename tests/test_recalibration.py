"""Which new cascade.json a running job takes up: a certified one, once; a broken one is
refused in one line, once; a run without a cascade takes up none."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from helpers import SMALL_CHUNKS, TINY_PATH, calibration, texts

from kascade.dataflow.flow import prepare
from kascade.dataflow.recalibration import Recalibration
from kascade.schemas.cascade import CASCADE_FILE
from kascade.schemas.settings import Settings
from kascade.toolchain.calibrate import calibrate


def settings_for(model: Path, mode: str = "on") -> Settings:
    return Settings(model_dir=model, chunking=SMALL_CHUNKS, cascade={"mode": mode})


def test_a_new_calibration_is_taken_up_once_and_a_broken_one_refused_once(
    calibrated: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    settings = settings_for(model)
    watch = Recalibration(settings, prepare(settings))
    assert watch.new() is None  # unchanged
    good = (model / CASCADE_FILE).read_text()
    (model / CASCADE_FILE).write_text(good.replace('"labels"', '"labelz"', 1))
    with caplog.at_level(logging.ERROR, logger="kascade.dataflow.recalibration"):
        assert watch.new() is None and watch.new() is None
    (refusal,) = caplog.messages
    assert refusal.startswith(f"refusing the new {model / CASCADE_FILE} (sha256 ")
    assert "stays" in refusal
    calibrate(
        model,
        texts(400),
        calibration(epsilon=0.2, delta=0.1, chunking=SMALL_CHUNKS),
        path=TINY_PATH,
    )
    taken = watch.new()
    assert taken is not None and taken.in_force is not None
    assert taken.in_force.sha256 == watch.in_force and watch.new() is None


def test_a_run_without_a_cascade_takes_none_up(calibrated: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(calibrated, model)
    settings = settings_for(model, mode="off")
    watch = Recalibration(settings, prepare(settings))
    calibrate(
        model,
        texts(400),
        calibration(epsilon=0.2, delta=0.1, chunking=SMALL_CHUNKS),
        path=TINY_PATH,
    )
    assert watch.new() is None
