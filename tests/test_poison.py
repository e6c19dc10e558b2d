"""No record stops the job: arbitrary bytes and arbitrary JSON go through every
per-record step (decode, validate, tokenize and chunk, cascade, model call, reduce,
serialize) with the real tokenizer, heads and model, and come out as an output record
or a dead letter that fits what the broker accepts. Nothing raises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from helpers import SMALL_CHUNKS, TINY_PATH, calibration, texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kascade.operators.calibration import Cascade
from kascade.operators.cascade import CascadeLogic
from kascade.operators.chunking import Chunker, meta_of
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.operators.formats import Writer
from kascade.operators.full_model import _classify_all
from kascade.operators.items import ChunkResult, Escalation, Outcome, Outgoing
from kascade.operators.reduce import AssembleLogic, Labeled, Labeling, labeled
from kascade.operators.serialize import dead_letter_value, output_value
from kascade.operators.validate import Received, check
from kascade.operators.verdicts import cheap_stages
from kascade.schemas import Aggregation, CascadeUse, DeadLetter, ModelIdentity, OutputRecord
from kascade.schemas.events import OutputSettings, RegistrySettings
from kascade.toolchain.calibrate import calibrate

LIMIT = 50_000  # a small broker limit, so size handling is exercised too
TM = Aggregation.TOKEN_MEAN
MAX_TEXT = 60_000  # the input limit sits above the output limit: outputs can be too big


@pytest.fixture(scope="module")
def pipeline(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("poison") / "model"
    shutil.copytree(exported["modernbert"], d)
    calibrate(
        d, texts(300), calibration(epsilon=0.1, delta=0.1, chunking=SMALL_CHUNKS), path=TINY_PATH
    )
    model = load_model_dir(d)
    encoder = Encoder(model, graphs="stages")
    cascade = Cascade.load(d, model.manifest_sha256)
    labeling = Labeling(
        labels=model.manifest.labels,
        aggregation=Aggregation.TOKEN_MEAN,
        model=ModelIdentity(name="m", variant="v", manifest_sha256=model.manifest_sha256),
        cascade=CascadeUse.ON,
    )
    chunker = Chunker.of(model.tokenizer, SMALL_CHUNKS.max_tokens, SMALL_CHUNKS.overlap)
    writer = Writer(OutputSettings(), RegistrySettings(), "out")

    def run(value: bytes | None, key: bytes | None = b"k") -> list[Outgoing]:
        msg = KafkaSourceMessage(key=key, value=value, topic="in", partition=0, offset=7)
        first = check(msg, max_bytes=MAX_TEXT, stage="validate")
        if isinstance(first, DeadLetter):
            return [dead_letter_value(first, max_bytes=LIMIT)]
        assert isinstance(first, Received)
        records: list[Labeled] = []
        decided: list = []
        if not first.doc.text.strip():  # as the flow's is_blank step
            records.append(labeled(meta_of(first), [], labeling, 0))
        else:
            stages = cheap_stages(encoder, cascade, 0.5)
            logic = CascadeLogic(stages, chunker, SMALL_CHUNKS.max_chunks, TM, 0.5)
            decided = logic.on_item(first)[0]
        out: list = [x for x in decided if isinstance(x, DeadLetter)]
        escalated = [x for x in decided if isinstance(x, Escalation)]
        # As the flow's assemble step: the chunk results and the cascade's outcome.
        parts = [x for x in decided if isinstance(x, ChunkResult | Outcome)]
        parts += [r for r in _classify_all(encoder, escalated, 1) if r.audit_of is None]
        assemble = AssembleLogic(labeling, now_ms=lambda: 0, with_outcome=True)
        for part in parts:
            records += assemble.on_item(part)[0]
        assert len(records) == (1 if not out else 0)
        for rec in records:
            sent = output_value(rec, writer, max_bytes=LIMIT, stage="serialize")
            out.append(
                dead_letter_value(sent, max_bytes=LIMIT) if isinstance(sent, DeadLetter) else sent
            )
        return [
            dead_letter_value(x, max_bytes=LIMIT) if isinstance(x, DeadLetter) else x for x in out
        ]

    return run


def _sendable(pairs: list[Outgoing]) -> None:
    assert len(pairs) == 1
    value = pairs[0].value
    assert len(value) <= LIMIT
    parsed = json.loads(value)
    if "reason" in parsed:
        DeadLetter.model_validate(parsed)
    else:
        OutputRecord.model_validate(parsed)


_json = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(st.characters()),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
# Any code point, surrogates included (JSON escapes them; Python then holds them).
_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=3000))
def test_arbitrary_bytes_become_a_dead_letter_or_a_label(pipeline, raw: bytes) -> None:
    _sendable(pipeline(raw))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc_id=_any_text, text=_any_text, lang=_any_text | st.none(), metadata=_json)
def test_arbitrary_json_documents_become_a_dead_letter_or_a_label(
    pipeline, doc_id: str, text: str, lang: str | None, metadata
) -> None:
    doc = {"id": doc_id, "text": text, "lang": lang, "metadata": metadata}
    _sendable(pipeline(json.dumps(doc).encode()))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_json)
def test_arbitrary_json_values_become_a_dead_letter_or_a_label(pipeline, value) -> None:
    _sendable(pipeline(json.dumps(value).encode()))


@pytest.mark.parametrize(
    ("raw", "outcome"),
    [
        pytest.param(b'{"id": "s", "text": "a \\ud800 b"}', "not_utf8", id="lone-surrogate-text"),
        pytest.param(b'{"id": "s\\udfff", "text": "fine"}', "not_utf8", id="lone-surrogate-id"),
        pytest.param(
            b'{"id": "m", "text": "t", "metadata": {"k": "\\ud800"}}', "not_utf8", id="in-metadata"
        ),
        pytest.param(b'{"id": "p", "text": "\\ud83d\\ude00 ok"}', "label", id="surrogate-pair"),
        pytest.param(b"[" * 20_000 + b"]" * 20_000, "not_json", id="deep-nesting"),
        pytest.param(
            b'{"id": "n", "text": "t", "metadata": {"n": ' + b"9" * 5000 + b"}}",
            "not_json",
            id="huge-integer",
        ),
        pytest.param(b'{"id": "f", "text": "t", "metadata": {"x": 1e999}}', "label", id="inf"),
        pytest.param(
            json.dumps({"id": "w", "text": "x" * 30_000}).encode(), "label", id="long-token"
        ),
        pytest.param(
            json.dumps({"id": "big", "text": "t", "metadata": {"pad": "y" * 49_500}}).encode(),
            "oversize",
            id="output-larger-than-the-broker-takes",
        ),
        pytest.param(b"\xff" * 55_000, "not_utf8", id="dead-letter-larger-than-the-broker-takes"),
        pytest.param(json.dumps({"id": "i" * 600, "text": "t"}).encode(), "schema", id="long-id"),
    ],
)
def test_each_known_poison_record_is_handled(pipeline, raw: bytes, outcome: str) -> None:
    pairs = pipeline(raw)
    _sendable(pairs)
    parsed = json.loads(pairs[0].value)
    assert parsed.get("reason", "label") == outcome, parsed.get("detail")


def test_a_dead_letter_too_large_for_the_broker_keeps_its_source_size_and_hash(pipeline) -> None:
    raw = b"\xff" * 45_000  # not UTF-8, and larger than LIMIT once base64-encoded
    (pair,) = pipeline(raw)
    dead = DeadLetter.model_validate_json(pair.value)
    assert dead.reason.value == "not_utf8" and dead.original_truncated
    assert dead.original_size == len(raw)
    assert dead.source is not None and dead.source.offset == 7
    assert raw.startswith(dead.original())
