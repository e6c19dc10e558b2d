"""The full-model operator's core: single calls, padded micro-batches, failures as data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_models import CORPUS

from kascade.errors import UsageError
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.operators.full_model import _classify_all
from kascade.operators.items import ChunkTask, DocMeta

META = DocMeta(id="d", total_chunks=0, lang=None, metadata=None, timestamp_ms=None)


def tasks(model_dir: Path) -> list[ChunkTask]:
    loaded = load_model_dir(model_dir)
    out = []
    for i in range(9):
        ids = loaded.encode(" ".join(CORPUS[: 1 + i]))
        out.append(ChunkTask(META, i, ids, len(ids)))
    return out


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
def test_length_sorted_micro_batches_give_the_single_call_probabilities(
    arch: str, exported: dict[str, Path]
) -> None:
    encoder = Encoder(load_model_dir(exported[arch]))
    single = {r.index: r.probs for r in _classify_all(encoder, tasks(exported[arch]), 1)}
    batched = {r.index: r.probs for r in _classify_all(encoder, tasks(exported[arch]), 4)}
    assert set(single) == set(batched) == set(range(9))
    for i in range(9):
        np.testing.assert_allclose(batched[i], single[i], atol=1e-5)
        assert single[i].sum() == pytest.approx(1.0)


class _Broken:
    def logits(self, ids: np.ndarray) -> np.ndarray:
        raise RuntimeError("onnxruntime: out of memory")


def test_a_failing_model_call_becomes_an_error_result_not_an_exception(
    exported: dict[str, Path],
) -> None:
    results = _classify_all(_Broken(), tasks(exported["bert"])[:2], 1)  # type: ignore[arg-type]
    assert [r.probs for r in results] == [None, None]
    assert all(r.error and "out of memory" in r.error for r in results)


def test_a_model_directory_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a kascade model directory"):
        load_model_dir(tmp_path)
