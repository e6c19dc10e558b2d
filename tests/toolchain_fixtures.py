"""Session-wide tiny checkpoints and their FP32 exports, shared by the toolchain tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tiny_models import tiny_bert, tiny_modernbert

BUILDERS = {"modernbert": tiny_modernbert, "bert": tiny_bert}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="session")
def exported(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from kascade.toolchain.export import export_checkpoint

    root = tmp_path_factory.mktemp("exported")
    out = {}
    for name, ckpt in checkpoints.items():
        out[name] = root / name
        export_checkpoint(str(ckpt), out[name], cascade_layer=2, max_length=None)
    return out


# The tiny random model's heads are far less confident than a trained model's.
@pytest.fixture(scope="session")
def calibrated(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny ModernBERT export with a cascade calibrated on small chunks."""
    from helpers import SMALL_CHUNKS, TINY_PATH, calibration, texts

    from kascade.toolchain.calibrate import calibrate

    d = tmp_path_factory.mktemp("calibrated") / "model"
    shutil.copytree(exported["modernbert"], d)
    calibrate(
        d, texts(300), calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS), path=TINY_PATH
    )
    return d


@pytest.fixture(scope="session")
def stopping(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model calibrated on documents drawn like the stream's, openings included:
    chunk thresholds on one draw, the document stop on another."""
    from helpers import SMALL_CHUNKS, TINY_PATH, calibration, long_documents

    from kascade.toolchain.calibrate import calibrate

    d = tmp_path_factory.mktemp("stopping") / "model"
    shutil.copytree(exported["modernbert"], d)
    spec = calibrate(
        d,
        [doc.text for doc in long_documents(80, seed=1)],
        calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS, epsilon_doc=0.05),
        path=TINY_PATH,
        documents=[doc.text for doc in long_documents(120, seed=2)],
    )
    assert spec.document_stop is not None
    return d
