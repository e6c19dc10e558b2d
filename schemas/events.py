"""How kascade reads and writes events shaped by someone else: where the text and id are
in an input event, what the output looks like, and the Schema Registry behind both.

Defaults keep kascade's own contract (``schemas/json``): input records are validated as
:class:`~kascade.schemas.records.InputDocument`, output is the label record.

>>> m = InputSettings(format="json", text=["subject", "body"], id="ticket.id")
>>> [p.parts for p in m.text_paths], m.id_path.parts
([('subject',), ('body',)], ('ticket', 'id'))
>>> InputSettings(format="text").id
'@key'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import CliSuppress

KEY = "@key"  # the document id is the Kafka key (UTF-8)
InputFormat = Literal["kascade", "json", "text", "avro", "json_schema"]
OutputFormat = Literal["json", "avro", "json_schema"]
REGISTRY_FORMATS = ("avro", "json_schema")
_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")


@dataclass(frozen=True)
class FieldPath:
    """A dotted path into an event: ``content.paragraphs``, ``items.0.text`` (a number
    indexes a list)."""

    text: str

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.text.split("."))


def _path(text: str, setting: str) -> FieldPath:
    if not _PATH.match(text):
        raise ValueError(
            f"{setting}: {text!r} is not a field path (dotted names, e.g. content.title)"
        )
    return FieldPath(text)


class InputSettings(BaseModel):
    """What an input record is and where its text, id, language and metadata are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: InputFormat = Field(
        default="kascade",
        description="kascade: kascade's own JSON record; json: any JSON object, mapped by"
        " the paths below; text: the value is the UTF-8 text, the key its id; avro,"
        " json_schema: Confluent wire format, decoded with the writer schema from the"
        " registry.",
    )
    text: list[str] = Field(
        default=["text"],
        min_length=1,
        description="Field paths of the text, joined with separator; a path may hold a"
        " list of strings.",
    )
    separator: str = Field(default="\n\n", description="Between the texts of several paths.")
    id: str = Field(
        default="id",
        description=f'Field path of the document id, or "{KEY}" for the Kafka key (the'
        " default for format text).",
    )
    lang: str | None = Field(default=None, description="Field path of a BCP-47 language tag.")
    metadata: list[str] = Field(
        default_factory=list,
        description="Field paths passed through to the output's metadata, by path.",
    )

    @model_validator(mode="before")
    @classmethod
    def _text_is_keyed(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format") == "text" and data.get("id") is None:
            return data | {"id": KEY}
        return data

    @model_validator(mode="after")
    def _mapping_fits_the_format(self) -> InputSettings:
        if self.format == "kascade" and (
            self.text != ["text"] or self.id != "id" or self.lang or self.metadata
        ):
            raise ValueError(
                "input.format kascade reads kascade's own record (id, text, lang, metadata);"
                " to map other fields set input.format to json, avro or json_schema"
            )
        if self.format == "text" and (self.id != KEY or self.lang or self.metadata):
            raise ValueError(
                f'input.format text has no fields: its id is the Kafka key (input.id "{KEY}")'
            )
        for p in self.text:
            _path(p, "input.text")
        for p in self.metadata:
            _path(p, "input.metadata")
        if self.id != KEY:
            _path(self.id, "input.id")
        if self.lang is not None:
            _path(self.lang, "input.lang")
        return self

    @property
    def text_paths(self) -> list[FieldPath]:
        return [FieldPath(p) for p in self.text]

    @property
    def id_path(self) -> FieldPath | None:
        """Where the id is; ``None`` when it is the Kafka key."""
        return None if self.id == KEY else FieldPath(self.id)

    @property
    def lang_path(self) -> FieldPath | None:
        return None if self.lang is None else FieldPath(self.lang)

    @property
    def metadata_paths(self) -> list[FieldPath]:
        return [FieldPath(p) for p in self.metadata]


class OutputSettings(BaseModel):
    """What kascade writes for each document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: Literal["label", "enriched"] = Field(
        default="label",
        description="label: kascade's label record; enriched: the input event with a"
        " kascade object (label, scores, model, degraded) added under output.field.",
    )
    field: str = Field(
        default="kascade",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Top-level field of an enriched event that holds kascade's result.",
    )
    format: OutputFormat = Field(
        default="json",
        description="json: plain JSON; avro, json_schema: Confluent wire format with the"
        " schema kascade registers.",
    )


SubjectStrategy = Literal["topic", "record", "topic_record"]


class RegistrySettings(BaseModel):
    """A Confluent-compatible Schema Registry (Confluent, Apicurio /apis/ccompat/v7, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(
        default=None, description="Base URL, e.g. http://registry:8081 (none: no registry)."
    )
    basic_auth_user: str | None = Field(
        default=None,
        description="User for HTTP basic auth (its password: KASCADE_REGISTRY__BASIC_AUTH_PASSWORD"
        " or the config file, never a flag).",
    )
    # Not a flag: a secret in argv is visible to every user of the host (ps).
    basic_auth_password: CliSuppress[SecretStr | None] = None
    ssl_ca_location: str | None = Field(
        default=None, description="PEM file of the CA that signed the registry's certificate."
    )
    subject_name_strategy: SubjectStrategy = Field(
        default="topic",
        description="Subject of the output schema: topic: <topic>-value; record: the"
        " record's full name; topic_record: <topic>-<record name>.",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="Per request.")
    outage_tolerance_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="How long the running job retries an unreachable registry before it"
        " exits non-zero saying so.",
    )

    @property
    def shown_url(self) -> str | None:
        """The URL as messages show it: without a user and password in it.

        >>> RegistrySettings(url="https://alice:pw@registry:8081/apis").shown_url
        'https://***@registry:8081/apis'
        """
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        if "@" not in parts.netloc:
            return self.url
        return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))

    def client_config(self) -> dict[str, object]:
        """confluent-kafka's SchemaRegistryClient configuration (the only place the
        password is revealed)."""
        assert self.url is not None
        config: dict[str, object] = {"url": self.url, "timeout": self.timeout_s}
        # kascade retries outages itself, bounded by outage_tolerance_s.
        config["max.retries"] = 0
        if self.basic_auth_user is not None:
            password = self.basic_auth_password
            secret = "" if password is None else password.get_secret_value()
            config["basic.auth.user.info"] = f"{self.basic_auth_user}:{secret}"
        if self.ssl_ca_location is not None:
            config["ssl.ca.location"] = self.ssl_ca_location
        return config


def check_formats(inp: InputSettings, out: OutputSettings, registry: RegistrySettings) -> None:
    """Cross-section rules, raised as ``ValueError`` when the settings are built."""
    uses_registry = inp.format in REGISTRY_FORMATS or out.format in REGISTRY_FORMATS
    if uses_registry and registry.url is None:
        raise ValueError("input.format/output.format avro and json_schema need registry.url")
    if out.shape == "enriched" and inp.format == "text":
        raise ValueError("output.shape enriched needs structured input; text input has no event")
    if out.format == "avro" and not (out.shape == "enriched" and inp.format == "avro"):
        raise ValueError(
            "output.format avro writes enriched Avro events (input.format avro,"
            " output.shape enriched): the label record's free-form metadata has no Avro type"
        )
    if out.format == "json_schema" and out.shape == "enriched" and inp.format != "json_schema":
        raise ValueError(
            "output.format json_schema with output.shape enriched extends the input's schema:"
            " it needs input.format json_schema"
        )
