"""Long documents through the real broker: reading stops once the certified stop knows the
label, reads on past an opening that is not about the topic, and a text longer than the
chunk limit is labeled when its stop comes before the limit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bytewax.testing import run_main
from helpers import (
    BOILERPLATE,
    SMALL_CHUNKS,
    TINY_PATH,
    calibration,
    kascade_cli,
    long_documents,
    produce,
)

from kascade.dataflow.consume import read_all
from kascade.dataflow.flow import build_flow
from kascade.schemas import DeadLetter, DeadLetterReason, InputDocument, OutputRecord, StopReason
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import Settings
from kascade.toolchain.calibrate import calibrate
from kascade.toolchain.certify import CalibrationTooSmall

OPENING_CHUNKS = 3  # helpers.BOILERPLATE repeated 18 times, in 64-token chunks


def _send(k: KafkaSettings, docs: list[InputDocument]) -> None:
    produce(k, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])


def _labels(k: KafkaSettings) -> dict[str, OutputRecord]:
    out = [OutputRecord.model_validate_json(v) for _, v in read_all(k, k.output_topic)]
    return {r.id: r for r in out}


def _run(k: KafkaSettings, model: Path, **settings) -> None:
    run_main(
        build_flow(
            Settings(
                kafka=k,
                model_dir=model,
                chunking=settings.pop("chunking", SMALL_CHUNKS.model_dump()),
                **settings,
            )
        )
    )


@pytest.mark.kafka
def test_reading_stops_early_on_clear_documents_and_reads_past_a_boilerplate_opening(
    kafka_settings: KafkaSettings, topic_factory, stopping: Path
) -> None:
    docs = long_documents(24, seed=3)
    opening = InputDocument(id="opening-only", text=" ".join([BOILERPLATE] * 18))
    _send(kafka_settings, [*docs, opening])
    _run(kafka_settings, stopping, cascade={"mode": "on", "audit_fraction": 0.0})
    full = kafka_settings.model_copy(update={"output_topic": topic_factory("full")})
    _run(full, stopping, cascade={"mode": "off"})

    stopped, everything = _labels(kafka_settings), _labels(full)
    assert sorted(stopped) == sorted(everything) == sorted([*(d.id for d in docs), opening.id])
    # Where the opening's own label is the document's, stopping inside it is right; where
    # it is not, the stop must not come before the document's own text.
    misleading = [
        d.id
        for d in docs
        if d.metadata["boilerplate"] and everything[d.id].label != everything[opening.id].label
    ]
    assert misleading
    assert list(read_all(kafka_settings, kafka_settings.dead_letter_topic)) == []
    for d in docs:
        r = stopped[d.id]
        reading = r.reading
        assert reading is not None
        c = r.chunks
        assert c.settled_s0 + c.settled_s1 + c.full_model + c.skipped == reading.chunks_read
        assert c.total == reading.chunks_total
        if d.id in misleading:
            assert reading.chunks_read > OPENING_CHUNKS, d.id
        assert reading.chars_total == len(d.text)
        if reading.stopped is StopReason.CERTAIN:
            # Tokenized only as far as it read: the rest of the text is not counted.
            assert c.total is c.unread is reading.tokens_total is None
            assert reading.chars_read is not None and 0 < reading.chars_read < len(d.text)
        else:
            assert reading.tokens_read == reading.tokens_total and c.unread == 0
            assert c.total == reading.chunks_read
        assert everything[d.id].reading.stopped is StopReason.END
    clear = [d.id for d in docs if not d.metadata["boilerplate"]]
    early = [i for i in clear if stopped[i].reading.stopped is StopReason.CERTAIN]
    assert len(early) >= len(clear) // 2
    agree = sum(stopped[i].label == everything[i].label for i in early)
    assert agree >= 0.95 * len(early)  # the certified bound: epsilon_doc = 0.05


@pytest.mark.kafka
def test_a_text_longer_than_the_limit_is_labeled_when_its_stop_comes_first(
    kafka_settings: KafkaSettings, topic_factory, stopping: Path
) -> None:
    """Documents of 14 to 25 chunks, every third opening with boilerplate, read once
    without a limit, then with a limit of as many chunks as the earliest stop needed:
    those whose stop came within it are labeled alike, the others are dead-lettered
    too_long with their bytes."""
    docs = long_documents(12, seed=4, boilerplate_every=3, repeats=(80, 140))
    _send(kafka_settings, docs)
    unlimited = kafka_settings.model_copy(
        update={
            "output_topic": topic_factory("unlimited"),
            "dead_letter_topic": topic_factory("unlimited-dead"),
        }
    )
    # No audits: the two runs must read alike, and the live test of the bound (which may
    # suspend the cheap stages part-way through a run) is not what this test is about.
    quiet = {"mode": "on", "audit_fraction": 0.0}
    no_limit = {"max_tokens": 64, "overlap": 8, "max_chunks": 1000}
    _run(unlimited, stopping, cascade=quiet, chunking=no_limit)
    assert list(read_all(unlimited, unlimited.dead_letter_topic)) == []
    whole = _labels(unlimited)
    assert set(whole) == {d.id for d in docs}
    stops = {i: r.reading.chunks_read for i, r in whole.items() if r.reading.stopped == "certain"}
    limit = min(stops.values())
    within = {i for i, n in stops.items() if n <= limit}
    assert within and within != set(whole)  # both outcomes are in the sample
    limited = {**no_limit, "max_chunks": limit}
    _run(kafka_settings, stopping, cascade=quiet, chunking=limited)

    labeled = _labels(kafka_settings)
    assert set(labeled) == within
    assert all(labeled[i].label == whole[i].label for i in within)
    # Stopped within the limit, so never tokenized to its end: how far past it is not known.
    assert all(labeled[i].reading.chunks_total is None for i in within)
    dead = [
        DeadLetter.model_validate_json(v)
        for _, v in read_all(kafka_settings, kafka_settings.dead_letter_topic)
    ]
    assert {d.reason for d in dead} == {DeadLetterReason.TOO_LONG}
    by_id = {InputDocument.model_validate_json(d.original()).id for d in dead}
    assert by_id == set(whole) - within
    assert all("did not make the label certain" in d.detail for d in dead)


def test_calibration_reads_documents_with_the_full_model_only_until_their_label_is_decided(
    stopping: Path,
) -> None:
    """The lazy full read gives exactly the label of the full model on every chunk."""
    from kascade.operators.calibration import Cascade
    from kascade.operators.encoder import Encoder, load_model_dir
    from kascade.schemas import Aggregation
    from kascade.toolchain.document_stop import (
        CalibrationText,
        full_read_labels,
        read_documents,
    )
    from kascade.toolchain.features import extract_block

    loaded = load_model_dir(stopping)
    cascade = Cascade.load(stopping, loaded.manifest_sha256)
    enc = Encoder(loaded, graphs="stages")
    texts = [d.text for d in long_documents(16, seed=5)]
    docs = read_documents(
        enc,
        [CalibrationText(t) for t in texts],
        chunking=SMALL_CHUNKS,
        cascade=cascade,
        aggregation=Aggregation.TOKEN_MEAN,
    )
    f = extract_block(enc, texts, max_tokens=SMALL_CHUNKS.max_tokens, overlap=SMALL_CHUNKS.overlap)
    every_chunk = full_read_labels(f, Aggregation.TOKEN_MEAN)
    firsts = [int(every_chunk[f.source == i][0]) for i in range(len(texts))]
    assert [d.full_label for d in docs] == firsts
    assert [len(d.seen) for d in docs] == [int((f.source == i).sum()) for i in range(len(texts))]


def test_certified_reading_without_a_certified_stop_is_a_one_line_error(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    calibrate(
        d,
        [doc.text for doc in long_documents(40, seed=1)],
        calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS),
        path=TINY_PATH,
    )
    r = kascade_cli(
        "run",
        "--model-dir",
        str(d),
        "--chunk-tokens",
        "64",
        "--overlap",
        "8",
        "--cascade.reading",
        "certified",
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"kascade: cascade.reading=certified: {d}/cascade.json has no certified document"
        " stop; run kascade calibrate --documents"
    ]


def test_too_few_calibration_documents_are_refused_before_any_work(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(exported["modernbert"], d)
    with pytest.raises(CalibrationTooSmall, match="it needs at least 299 documents"):
        calibrate(d, ["x"], calibration(epsilon_doc=0.01, delta=0.05), documents=["y"] * 298)
    assert not (d / "cascade.json").exists()
