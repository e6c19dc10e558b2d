"""The benchmark harness in quick mode: it runs end to end on tiny models (a smoke test of
the harness, not of timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SMALL_CHUNKS, TINY_PATH, calibration, documents, texts

from bench import latency, plots
from bench.cascade import evaluate as cascade_evaluate
from bench.env import environment
from bench.flow import overhead
from kascade.schemas import Aggregation


def test_the_environment_records_cpu_and_library_versions() -> None:
    env = environment()
    assert env["cores"] >= 1 and env["packages"]["onnxruntime"]


def test_latency_rows_have_every_length_and_a_baseline_speedup_of_one(
    exported: dict[str, Path],
) -> None:
    rows = latency.measure(
        [exported["bert"], exported["modernbert"]], [16, 64], rounds=1, calls=2, threads=1
    )
    assert rows[0]["speedup_16"] == 1.0
    assert all(r["ms_64"] > 0 and r["peak_rss_mb_256"] > 0 for r in rows)


def test_stage_costs_are_reported_per_model_with_its_cascade_layer(
    exported: dict[str, Path],
) -> None:
    rows = latency.stages([exported["bert"], exported["modernbert"]], 32, rounds=1, calls=2)
    assert [r["directory"] for r in rows] == [str(exported["bert"]), str(exported["modernbert"])]
    for r in rows:
        assert r["cascade_layer"] >= 1
        assert all(ms > 0 for ms in r["ms"].values())
        assert 0 < r["s1_share_of_full"] < r["escalated_share_of_full"]


@pytest.mark.kafka
def test_the_overhead_benchmark_runs_the_real_flow(
    kafka_bootstrap: str, exported: dict[str, Path]
) -> None:
    result = overhead(exported["bert"], documents(6), kafka_bootstrap, chunk_tokens=64)
    assert result["documents"] == 6 and result["flow"]["cpu_s"] > 0


def test_the_cascade_benchmark_compares_against_the_full_model(
    tmp_path: Path, exported: dict[str, Path]
) -> None:
    import shutil

    from kascade.toolchain.calibrate import calibrate

    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    calibrate(
        d, texts(200), calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS), path=TINY_PATH
    )
    files = ("holdout", "holdout-deu_Latn")
    docs = [(f"{files[i % 2]}/sports/{i}", t, "sports") for i, t in enumerate(texts(20))]
    result = cascade_evaluate(d, docs, max_tokens=64, strategy=Aggregation.TOKEN_MEAN)
    assert result["documents"] == 20
    assert sum(result["share"].values()) == pytest.approx(1.0)
    assert 0.0 <= result["document_agreement"] <= 1.0
    by_lang = result["by_language"]
    assert sorted(by_lang) == ["deu_Latn", "eng_Latn"]
    assert sum(c["chunks"] for c in by_lang.values()) == result["chunks"]


def test_plots_are_written_from_result_files(tmp_path: Path) -> None:
    lat = {
        "rows": [
            {"variant": "fp32", "file_mb": 10.0, "ms_128": 2.0, "ms_256": 4.0},
            {"variant": "int8", "file_mb": 3.0, "ms_128": 1.0, "ms_256": 2.0},
        ]
    }
    path = plots.quantization(lat, tmp_path)
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    rows = [{"workers": 1, "chunks_per_s": 10.0}, {"workers": 2, "chunks_per_s": 19.0}]
    assert plots.scaling({"x": rows}, tmp_path).is_file()
    json.dumps(lat)


def test_the_coverage_pool_keeps_a_sentence_and_its_translations_in_one_group(
    tmp_path: Path,
) -> None:
    from bench.coverage import pool

    for lang, words in (("eng_Latn", ["rain", "sun"]), ("fra_Latn", ["pluie", "soleil"])):
        (tmp_path / lang).mkdir()
        rows = [
            f"{i}\tscience\tA long enough sentence about the {w} today."
            for i, w in enumerate(words)
        ]
        (tmp_path / lang / "train.tsv").write_text(
            "index_id\tcategory\ttext\n" + "\n".join(rows) + "\n"
        )
        (tmp_path / lang / "dev.tsv").write_text("index_id\tcategory\ttext\n")
    texts, langs, groups = pool(tmp_path, per_language=2, seed=0)
    assert sorted(langs) == ["eng_Latn", "eng_Latn", "fra_Latn", "fra_Latn"]
    by_group: dict[int, set[str]] = {}
    for text, g in zip(texts, groups, strict=True):
        by_group.setdefault(g, set()).add(text.split()[-2])
    assert sorted(map(sorted, by_group.values())) == [["pluie", "rain"], ["soleil", "sun"]]
