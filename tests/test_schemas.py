"""The committed JSON Schemas and the typed records are one contract."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kascade.schemas import ChunkCounts, DeadLetter, InputDocument, ModelIdentity, OutputRecord
from kascade.schemas.export import CONTRACTS, load, main, render


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_committed_schema_files_are_generated_from_the_records(name: str) -> None:
    assert load(name) == json.loads(render(CONTRACTS[name]))


def test_the_export_check_reports_no_stale_schema() -> None:
    assert main(["--check"]) == 0


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_every_committed_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(load(name))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
input_like = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=3) | st.integers() | st.none(),
        "text": st.text(max_size=10) | st.integers() | st.none(),
        "lang": st.text(max_size=4) | st.none() | st.integers(),
        "metadata": json_values,
        "extra": json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(candidate=input_like)
def test_pydantic_and_the_json_schema_accept_the_same_input_records(candidate: dict) -> None:
    by_schema = jsonschema.Draft202012Validator(load("input.schema.json")).is_valid(candidate)
    try:
        InputDocument.model_validate_json(json.dumps(candidate))
        by_model = True
    except ValidationError:
        by_model = False
    assert by_model == by_schema


def _output() -> OutputRecord:
    return OutputRecord(
        id="d1",
        label="sports",
        score=0.8,
        scores={"sports": 0.8, "health": 0.2},
        aggregation="token_mean",
        chunks=ChunkCounts(total=3, settled_s0=1, full_model=2),
        model=ModelIdentity(name="m", variant="int8-int4emb", manifest_sha256="0" * 64),
        latency_ms=12.5,
    )


def test_an_output_record_serializes_to_json_the_schema_accepts() -> None:
    jsonschema.validate(json.loads(_output().model_dump_json()), load("output.schema.json"))


def test_the_output_schema_rejects_a_score_above_one() -> None:
    bad = json.loads(_output().model_dump_json()) | {"score": 1.5}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, load("output.schema.json"))


def test_a_dead_letter_keeps_the_original_bytes_and_matches_its_schema() -> None:
    raw = b"\xff\x00not json"
    d = DeadLetter(
        reason="not_utf8",
        detail="x",
        stage="validate",
        source=None,
        original_b64=DeadLetter.encode(raw),
    )
    jsonschema.validate(json.loads(d.model_dump_json()), load("deadletter.schema.json"))
    assert DeadLetter.model_validate_json(d.model_dump_json()).original() == raw


def test_the_dead_letter_schema_rejects_an_unknown_reason() -> None:
    bad = {"reason": "bored", "detail": "", "stage": "s", "source": None, "original_b64": ""}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, load("deadletter.schema.json"))
