"""Session-wide tiny checkpoints and their FP32 exports, shared by the toolchain tests."""

from __future__ import annotations

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
