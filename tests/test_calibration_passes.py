"""Calibration's full-model passes on every core: the same ``cascade.json``, byte for
byte, whatever the number of worker processes."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import SMALL_CHUNKS, TINY_PATH, calibration, long_documents

from kascade.schemas.cascade import CASCADE_FILE
from kascade.toolchain.calibrate import calibrate
from kascade.toolchain.passes import blocks_of


def test_calibration_on_two_processes_writes_the_same_cascade_byte_for_byte(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    written = []
    for processes in (1, 2):
        d = tmp_path / f"p{processes}"
        shutil.copytree(exported["modernbert"], d)
        calibrate(
            d,
            [doc.text for doc in long_documents(60, seed=1)] + ["   "] * 9,
            calibration(
                epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS, epsilon_doc=0.05, processes=processes
            ),
            path=TINY_PATH,
            documents=[doc.text for doc in long_documents(120, seed=2)],
        )
        written.append((d / CASCADE_FILE).read_bytes())
    assert written[0] == written[1]
    assert b'"document_stop": {' in written[0] or b'"document_stop":{' in written[0]


def test_texts_go_out_in_consecutive_blocks_that_cover_them_in_order() -> None:
    items = [str(i) for i in range(21)]
    blocks = blocks_of(items)
    assert [x for b in blocks for x in b] == items and all(blocks)
