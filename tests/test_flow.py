"""The classifying flow end to end through the real broker.

Every valid document gets exactly one label record; multi-chunk documents reduce to
what the model says about their chunks; bad records land on the dead-letter topic with
their reason and original bytes. Runs on one worker and on a two-worker cluster.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from bytewax.testing import cluster_main, run_main
from helpers import documents, produce
from tiny_models import CORPUS

from kascade.dataflow.consume import read_all
from kascade.dataflow.flow import build_flow
from kascade.operators import backends
from kascade.operators.chunking import chunk_text
from kascade.operators.encoder import Encoder, load_model_dir, softmax
from kascade.operators.reduce import ChunkVerdict, aggregate
from kascade.schemas import Aggregation, DeadLetter, InputDocument, OutputRecord
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import EncoderSettings, Settings

pytestmark = pytest.mark.kafka

MAX_BYTES = 20_000
CHUNKING = {"max_tokens": 64, "overlap": 8, "max_chunks": 20}


def _run_single(flow) -> None:
    run_main(flow)


def _run_two_workers(flow) -> None:
    cluster_main(flow, addresses=[], proc_id=0, worker_count_per_proc=2)


@pytest.fixture(params=[_run_single, _run_two_workers], ids=["one_worker", "two_workers"])
def entry_point(request):
    return request.param


def expected_record(
    model_dir: Path, doc: InputDocument, chunking: dict = CHUNKING
) -> tuple[str | None, int]:
    """The label and chunk count computed directly, without Kafka or Bytewax, by the
    engine a run resolves (on an AMX host with OpenVINO: bf16)."""
    loaded = load_model_dir(model_dir)
    chunks = chunk_text(doc.text, loaded.tokenizer, **chunking)
    encoder = Encoder(loaded, engine=backends.resolve(EncoderSettings(), loaded.manifest))
    verdicts = [
        ChunkVerdict(c.index, c.n_tokens, softmax(encoder.logits(c.ids).astype(np.float64)))
        for c in chunks
    ]
    return aggregate(verdicts, Aggregation.TOKEN_MEAN, loaded.manifest.labels).label, len(chunks)


def test_every_document_gets_one_label_and_bad_records_are_dead_lettered(
    kafka_settings: KafkaSettings, exported: dict[str, Path], entry_point
) -> None:
    model_dir = exported["bert"]
    valid = [*documents(30), InputDocument(id="blank", text=" \n\t ")]
    too_long = InputDocument(id="huge", text=" ".join(CORPUS) * 25)
    invalid = {
        b"not json at all": "not_json",
        b'{"id": "x", "text": "caf\xe9"}': "not_utf8",
        b'{"id": "x"}': "schema",
        b'{"id": "x", "text": 5}': "schema",
        json.dumps({"id": "big", "text": "a" * MAX_BYTES}).encode(): "oversize",
        b"": "empty",
        too_long.model_dump_json().encode(): "too_long",
    }
    records = [(d.id.encode(), d.model_dump_json().encode()) for d in valid]
    records += [(b"bad", raw) for raw in invalid]
    produce(kafka_settings, records)

    settings = Settings(
        kafka=kafka_settings, max_text_bytes=MAX_BYTES, model_dir=model_dir, chunking=CHUNKING
    )
    entry_point(build_flow(settings))

    out = [
        OutputRecord.model_validate_json(v)
        for _, v in read_all(kafka_settings, kafka_settings.output_topic)
    ]
    assert Counter(r.id for r in out) == Counter(d.id for d in valid)
    by_id = {r.id: r for r in out}
    for doc in valid:
        label, n_chunks = expected_record(model_dir, doc)
        rec = by_id[doc.id]
        assert (rec.label, rec.chunks.total, rec.chunks.full_model) == (label, n_chunks, n_chunks)
        assert rec.metadata == doc.metadata and not rec.degraded
    assert max(r.chunks.total for r in out) > 3  # some documents really were multi-chunk
    assert by_id["blank"].label is None and by_id["blank"].chunks.total == 0

    dead = [
        DeadLetter.model_validate_json(v)
        for _, v in read_all(kafka_settings, kafka_settings.dead_letter_topic)
    ]
    assert {d.original(): d.reason.value for d in dead} == invalid
    assert len(dead) == len(invalid)
    assert all(d.source is not None and d.source.topic == kafka_settings.input_topic for d in dead)
    assert all(d.original_key() == b"bad" for d in dead)


def test_output_records_are_keyed_by_document_id_and_match_the_schema(
    kafka_settings: KafkaSettings, exported: dict[str, Path]
) -> None:
    import jsonschema

    from kascade.schemas.export import load

    produce(kafka_settings, [(None, d.model_dump_json().encode()) for d in documents(5)])
    run_main(build_flow(Settings(kafka=kafka_settings, model_dir=exported["modernbert"])))
    out = read_all(kafka_settings, kafka_settings.output_topic)
    assert len(out) == 5
    for key, value in out:
        record = json.loads(value)
        jsonschema.validate(record, load("output.schema.json"))
        assert key == record["id"].encode()
        assert record["model"]["variant"] == "fp32"
        # Exported from a checkpoint in a local directory: named by it, not by its path.
        assert "/" not in record["model"]["name"], record["model"]["name"]
