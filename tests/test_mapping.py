"""Reading other people's events: the text, id, language and metadata come from field
paths; what does not fit names the path, and settings that cannot work fail at start."""

from __future__ import annotations

from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kascade.operators.formats import Reader, Unreadable, carried
from kascade.operators.mapping import Unmapped, to_document
from kascade.schemas import ChunkCounts, DeadLetterReason, Enrichment, InputDocument, ModelIdentity
from kascade.schemas.avro import avro_schema
from kascade.schemas.events import InputSettings, RegistrySettings
from kascade.schemas.settings import Settings, load_settings

TICKETS = InputSettings(
    format="json", text=["subject", "body"], id="ticket.id", lang="locale", metadata=["queue"]
)


def test_a_ticket_is_read_from_its_own_fields() -> None:
    event = {
        "ticket": {"id": 4711},
        "subject": "Printer",
        "body": "It is on fire.",
        "locale": "de-AT",
        "queue": "hardware",
    }
    doc = to_document(event, key=None, mapping=TICKETS)
    assert doc == InputDocument(
        id="4711", text="Printer\n\nIt is on fire.", lang="de-AT", metadata={"queue": "hardware"}
    )


def test_a_list_of_paragraphs_is_joined_with_the_separator() -> None:
    m = InputSettings(format="json", text=["title", "content.paragraphs"], separator=" | ")
    doc = to_document(
        {"id": "n1", "title": "T", "content": {"paragraphs": ["a", "b"]}}, key=None, mapping=m
    )
    assert isinstance(doc, InputDocument) and doc.text == "T | a | b"


def test_a_number_in_a_path_indexes_a_list() -> None:
    m = InputSettings(format="json", text=["messages.1.text"])
    doc = to_document(
        {"id": "c", "messages": [{"text": "hi"}, {"text": "bye"}]}, key=None, mapping=m
    )
    assert isinstance(doc, InputDocument) and doc.text == "bye"


def test_the_kafka_key_can_be_the_id() -> None:
    m = InputSettings(format="json", text=["msg"], id="@key")
    doc = to_document({"msg": "hola"}, key=b"chat-9", mapping=m)
    assert isinstance(doc, InputDocument) and doc.id == "chat-9"


@pytest.mark.parametrize(
    ("event", "key", "detail"),
    [
        ({"ticket": {"id": 1}, "body": "b"}, None, "subject: missing"),
        (
            {"ticket": {"id": 1}, "subject": "s", "body": {"x": 1}},
            None,
            "body: expected a string or a list of strings, found dict",
        ),
        (
            {"ticket": {"id": 1}, "subject": "s", "body": ["a", 2]},
            None,
            "body: expected a string or a list of strings, found a list holding int, str",
        ),
        ({"subject": "s", "body": "b"}, None, "ticket.id: missing"),
        (
            {"ticket": {"id": True}, "subject": "s", "body": "b"},
            None,
            "ticket.id: expected a string, found bool",
        ),
        (
            {"ticket": {"id": "i" * 600}, "subject": "s", "body": "b"},
            None,
            "ticket.id: String should have at most 512 characters",
        ),
        (
            {"ticket": {"id": 1}, "subject": "s", "body": "b", "locale": ["de"]},
            None,
            "locale: expected a string, found a list holding str",
        ),
        (["not", "an", "object"], None, "record: expected an object, found a list holding str"),
    ],
)
def test_an_event_that_does_not_fit_names_the_path(event, key, detail: str) -> None:
    out = to_document(event, key=key, mapping=TICKETS)
    assert isinstance(out, Unmapped) and out.detail == detail


@pytest.mark.parametrize(
    ("key", "detail"),
    [
        (None, "key: the record has no Kafka key to be its id"),
        (b"\xff", "key: the Kafka key is not UTF-8"),
    ],
)
def test_a_missing_or_binary_key_cannot_be_the_id(key, detail: str) -> None:
    out = to_document("text", key=key, mapping=InputSettings(format="text"))
    assert isinstance(out, Unmapped) and out.detail == detail


def test_plain_text_values_are_read_with_the_key_as_id() -> None:
    read = Reader(InputSettings(format="text"), RegistrySettings()).read(
        "Sóc a Barcelona".encode(), key=b"k1", topic="t", headers=()
    )
    assert read.doc == InputDocument(id="k1", text="Sóc a Barcelona")


def test_an_unmapped_json_event_is_a_schema_dead_letter_naming_the_path() -> None:
    reader = Reader(TICKETS, RegistrySettings())
    with pytest.raises(Unreadable) as e:
        reader.read(b'{"subject": "s", "body": "b"}', key=None, topic="t", headers=())
    assert e.value.reason is DeadLetterReason.SCHEMA
    assert e.value.detail == "input field ticket.id: missing"


def test_the_event_is_kept_only_when_the_output_needs_it() -> None:
    raw = b'{"ticket": {"id": 1}, "subject": "s", "body": "b", "extra": [1]}'
    plain = Reader(TICKETS, RegistrySettings()).read(raw, key=None, topic="t", headers=())
    kept = Reader(TICKETS, RegistrySettings(), keep_event=True).read(
        raw, key=None, topic="t", headers=()
    )
    assert plain.event is None and kept.event["extra"] == [1]


@given(
    event=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["ticket", "id", "subject", "body", "locale", "queue"]),
                inner,
                max_size=4,
            )
        ),
        max_leaves=15,
    )
)
def test_any_event_gives_a_document_or_names_a_path(event) -> None:
    out = to_document(event, key=None, mapping=TICKETS)
    assert isinstance(out, (InputDocument, Unmapped))


def test_carried_headers_drop_kascades_own_from_an_earlier_pass() -> None:
    headers = [("traceparent", b"00-ab"), ("kascade-label", b"old")]
    assert carried(headers, ("kascade-label", b"new")) == [
        ("traceparent", b"00-ab"),
        ("kascade-label", b"new"),
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"input": {"format": "kascade", "text": ["body"]}}, "reads kascade's own record"),
        ({"input": {"format": "text", "id": "id"}}, "its id is the Kafka key"),
        ({"input": {"format": "json", "text": ["a..b"]}}, "is not a field path"),
        ({"input": {"format": "avro"}}, "need registry.url"),
        ({"input": {"format": "text"}, "output": {"shape": "enriched"}}, "needs structured input"),
        (
            {"output": {"format": "avro"}, "registry": {"url": "http://r"}},
            "writes enriched Avro events",
        ),
        (
            {
                "input": {"format": "avro"},
                "output": {"shape": "enriched", "format": "json_schema"},
                "registry": {"url": "http://r"},
            },
            "needs input.format json_schema",
        ),
    ],
)
def test_settings_that_cannot_work_fail_when_built(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**overrides)


def test_the_registry_password_is_never_shown() -> None:
    s = Settings(
        registry={"url": "http://r", "basic_auth_user": "u", "basic_auth_password": "hunter2"}
    )
    assert "hunter2" not in repr(s) and "hunter2" not in s.model_dump_json()
    assert s.registry.client_config()["basic.auth.user.info"] == "u:hunter2"


def test_the_enrichment_has_an_avro_schema_that_writes_it() -> None:
    schema = fastavro.parse_schema(avro_schema(Enrichment, namespace="dev.kascade"))
    enrichment = Enrichment(
        label=None,
        score=0.0,
        scores={"a": 0.25},
        model=ModelIdentity(name="m", variant="v", manifest_sha256="0" * 64),
        degraded=True,
        reasons=["r"],
        cascade="on",
        chunks=ChunkCounts(total=2, full_model=1, failed=1),
    )
    value = enrichment.model_dump(mode="json")
    assert fastavro.validate(value, schema)
    assert [f["name"] for f in schema["fields"]] == list(Enrichment.model_fields)


def test_the_readmes_avro_example_is_a_valid_configuration(tmp_path, monkeypatch) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("```toml\n# tickets.toml", 1)[1].split("```", 1)[0]
    config = tmp_path / "tickets.toml"
    config.write_text("# tickets.toml" + block)
    monkeypatch.setenv("KASCADE_REGISTRY__BASIC_AUTH_PASSWORD", "s3cret")
    s = load_settings(config)
    assert (s.input.format, s.output.shape, s.output.format) == ("avro", "enriched", "avro")
    assert [p.text for p in s.input.text_paths] == ["subject", "body"]
    assert s.input.separator == "\n\n" and s.input.lang == "customer.locale"
    assert s.registry.client_config()["basic.auth.user.info"] == "kascade:s3cret"
