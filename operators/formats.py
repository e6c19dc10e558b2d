"""Wire formats at both edges: record bytes into documents (with the event they came
from), and labeled documents back into bytes.

Registry formats (Avro, JSON Schema in the Confluent wire format) go through
confluent-kafka's own serializers; nothing here reads or writes the framing itself.

>>> reader = Reader(InputSettings(format="text"), RegistrySettings())
>>> reader.read(b"Lluvia en Lima", key=b"m-1", topic="t", headers=()).doc.id
'm-1'
"""

from __future__ import annotations

import copy
import io
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pydantic_core
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryError,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common.serde import SchemaId
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pydantic import ValidationError

from kascade.operators import registry
from kascade.operators.items import Envelope
from kascade.operators.mapping import to_document
from kascade.schemas import (
    DeadLetterReason,
    Enrichment,
    InputDocument,
    KafkaHeaders,
    OutputRecord,
    SourcePosition,
)
from kascade.schemas.avro import avro_schema
from kascade.schemas.events import InputSettings, OutputSettings, RegistrySettings

NAMESPACE = "dev.kascade"
HEADER_PREFIX = "kascade-"
# On every result (label or dead letter): the input record it is the result of,
# ``topic:partition:offset``; how the exactly-once resume knows what it committed.
ORIGIN_HEADER = f"{HEADER_PREFIX}origin"
_STRATEGIES = {
    "topic": topic_subject_name_strategy,
    "record": record_subject_name_strategy,
    "topic_record": topic_record_subject_name_strategy,
}


class Unreadable(Exception):
    """A record that gives no document: the dead letter's reason and detail."""

    def __init__(self, reason: DeadLetterReason, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Read:
    """A record read: the document, and the event it came from (for enriched output)."""

    doc: InputDocument
    event: Any = None
    schema_id: int | None = None


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(DeadLetterReason.NOT_UTF8, f"not UTF-8: {e}") from None


def _json(text: str) -> Any:
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as e:
        # JSONDecodeError is a ValueError, and so is an integer of more than 4,300 digits;
        # nesting deeper than the interpreter's stack is a RecursionError.
        raise Unreadable(DeadLetterReason.NOT_JSON, f"not JSON: {type(e).__name__}: {e}") from None
    surrogate = lone_surrogate(parsed)
    if surrogate is not None:
        raise Unreadable(DeadLetterReason.NOT_UTF8, surrogate)
    return parsed


def lone_surrogate(parsed: object) -> str | None:
    """Why ``parsed`` holds text that is not Unicode (``None`` if it has none).

    JSON may escape a lone surrogate (``"\\ud800"``); Python then holds a string that
    no UTF-8 encoder, tokenizer or serializer downstream accepts.

    >>> lone_surrogate({"text": "ok \U0001f600"}) is None
    True
    >>> lone_surrogate(json.loads('{"text": "x\\ud800"}'))
    'text holds a lone surrogate (\\\\ud800): not Unicode text'
    """
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        escape = ascii(e.object[e.start : e.end])[1:-1]
        return f"text holds a lone surrogate ({escape}): not Unicode text"
    except (RecursionError, ValueError):
        return "nested too deeply to check"
    return None


def _one_line(e: ValidationError) -> str:
    parts = []
    for err in e.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@dataclass
class Reader:
    """Turns one input record into a :class:`Read`, or raises :class:`Unreadable`."""

    mapping: InputSettings
    registry: RegistrySettings
    keep_event: bool = False
    _deserializer: Any = field(default=None, repr=False)

    def read(
        self, raw: bytes, *, key: bytes | None, topic: str | None, headers: KafkaHeaders
    ) -> Read:
        fmt = self.mapping.format
        schema_id = None
        if fmt == "kascade":
            parsed = _json(_utf8(raw))
            try:
                doc = InputDocument.model_validate(parsed)
            except ValidationError as e:
                raise Unreadable(DeadLetterReason.SCHEMA, _one_line(e)) from None
            return Read(doc, parsed if self.keep_event else None)
        if fmt == "text":
            event: Any = _utf8(raw)
        elif fmt == "json":
            event = _json(_utf8(raw))
        else:
            event, schema_id = self._from_registry(raw, topic, headers)
        mapped = to_document(event, key=key, mapping=self.mapping)
        if not isinstance(mapped, InputDocument):
            raise Unreadable(DeadLetterReason.SCHEMA, f"input field {mapped.detail}")
        return Read(mapped, event if self.keep_event else None, schema_id)

    def _from_registry(
        self, raw: bytes, topic: str | None, headers: KafkaHeaders
    ) -> tuple[Any, int | None]:
        ctx = SerializationContext(topic or "", MessageField.VALUE, list(headers))
        if self._deserializer is None:
            sr = registry.client(self.registry)
            self._deserializer = (
                AvroDeserializer(sr)
                if self.mapping.format == "avro"
                else JSONDeserializer(None, schema_registry_client=sr)
            )
        try:
            event = registry.riding_outages(self.registry, lambda: self._deserializer(raw, ctx))
        except registry.RegistryUnavailable:
            raise
        except SchemaRegistryError as e:
            raise Unreadable(
                DeadLetterReason.NOT_DECODABLE, f"registry: {e.error_message}"
            ) from None
        except Exception as e:
            # Bad framing, or bytes the writer schema does not read (fastavro raises
            # EOFError, ValueError, ...). A value its JSON Schema rejects comes as a
            # SerializationError raised while handling jsonschema's ValidationError.
            reason = (
                DeadLetterReason.SCHEMA
                if isinstance(e.__context__, jsonschema.ValidationError)
                else DeadLetterReason.NOT_DECODABLE
            )
            raise Unreadable(reason, f"{self.mapping.format}: {type(e).__name__}: {e}") from None
        schema_type = "AVRO" if self.mapping.format == "avro" else "JSON"
        schema_id = SchemaId(schema_type)
        schema_id.from_bytes(io.BytesIO(raw))
        return event, schema_id.id


def kascade_headers(record: OutputRecord) -> list[tuple[str, bytes | None]]:
    """What kascade says about a document in headers, so consumers route without parsing.

    >>> from kascade.schemas import ModelIdentity, ChunkCounts
    >>> r = OutputRecord(id="d", label="sports", score=0.9, scores={"sports": 0.9},
    ...     aggregation="token_mean", chunks=ChunkCounts(total=1), latency_ms=0,
    ...     model=ModelIdentity(name="e5", variant="int8pc-int4emb", manifest_sha256="0" * 64))
    >>> dict(kascade_headers(r))["kascade-model"], dict(kascade_headers(r))["kascade-label"]
    (b'e5@int8pc-int4emb', b'sports')
    """
    return [
        (f"{HEADER_PREFIX}label", (record.label or "").encode()),
        (f"{HEADER_PREFIX}model", f"{record.model.name}@{record.model.variant}".encode()),
        (f"{HEADER_PREFIX}degraded", str(record.degraded).lower().encode()),
    ]


def carried(
    headers: KafkaHeaders, *added: tuple[str, bytes | None]
) -> list[tuple[str, bytes | None]]:
    """The input's headers, without kascade's own from an earlier pass, then ``added``."""
    return [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)] + list(added)


def origin_header(origin: SourcePosition | None) -> list[tuple[str, bytes | None]]:
    """The :data:`ORIGIN_HEADER` of a result (none for a record read without a position).

    >>> origin_header(SourcePosition(topic="in", partition=1, offset=7))
    [('kascade-origin', b'in:1:7')]
    """
    return [] if origin is None else [(ORIGIN_HEADER, origin.key.encode())]


@dataclass
class Writer:
    """Turns a labeled document into its output value: the label record or the
    enriched event, as JSON or in the registry's wire format."""

    output: OutputSettings
    registry: RegistrySettings
    topic: str
    _serializers: dict[int | None, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def key(self, record: OutputRecord, envelope: Envelope | None) -> bytes | None:
        """Label records are keyed by document id; enriched events like their input."""
        if self.output.shape == "enriched":
            return None if envelope is None else envelope.key
        return record.id.encode()

    def value(self, record: OutputRecord, envelope: Envelope | None) -> bytes:
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        if self.output.shape == "label":
            if self.output.format == "json":
                return record.model_dump_json().encode()
            serialize = self._serializer(None, lambda: self._label_serializer())
            return registry.riding_outages(
                self.registry, lambda: serialize(record.model_dump(mode="json"), ctx)
            )
        assert envelope is not None and envelope.event is not None
        enrichment = Enrichment.of(record).model_dump(mode="json")
        event = dict(envelope.event) | {self.output.field: enrichment}
        if self.output.format == "json":
            return pydantic_core.to_json(event, bytes_mode="base64")
        serialize = self._serializer(
            envelope.schema_id, lambda: self._enriched_serializer(envelope)
        )
        return registry.riding_outages(self.registry, lambda: serialize(event, ctx))

    def _serializer(self, schema_id: int | None, make: Any) -> Any:
        with self._lock:
            if schema_id not in self._serializers:
                self._serializers[schema_id] = make()
            return self._serializers[schema_id]

    def _conf(self) -> dict[str, Any]:
        return {
            "auto.register.schemas": True,
            "subject.name.strategy": _STRATEGIES[self.registry.subject_name_strategy],
        }

    def _label_serializer(self) -> Any:
        schema = json.dumps(OutputRecord.model_json_schema())
        return JSONSerializer(schema, registry.client(self.registry), conf=self._conf())

    def _enriched_serializer(self, envelope: Envelope) -> Any:
        """A serializer whose schema is the input's writer schema with ``output.field``
        added (optional, so the output subject stays compatible as inputs evolve)."""
        sr = registry.client(self.registry)
        schema_id = envelope.schema_id
        assert schema_id is not None  # an envelope of the registry's wire format has one
        writer = registry.riding_outages(self.registry, lambda: sr.get_schema(schema_id))
        if writer.schema_str is None:
            raise ValueError(f"the registry returned schema {schema_id} without its text")
        parsed = json.loads(writer.schema_str)
        name = self.output.field
        if self.output.format == "avro":
            added = {
                "name": name,
                "type": ["null", avro_schema(Enrichment, namespace=NAMESPACE)],
                "default": None,
                "doc": "Added by kascade: the document's label.",
            }
            if not isinstance(parsed, dict) or parsed.get("type") != "record":
                raise ValueError("enriched Avro output needs input events that are Avro records")
            out = copy.deepcopy(parsed)
            out["fields"] = [f for f in out["fields"] if f["name"] != name] + [added]
            schema = Schema(json.dumps(out), "AVRO", writer.references)
            return AvroSerializer(sr, schema, conf=self._conf())
        template = f"#/properties/{name}/$defs/{{model}}"
        out = copy.deepcopy(parsed)
        out.setdefault("properties", {})[name] = Enrichment.model_json_schema(ref_template=template)
        schema = Schema(json.dumps(out), "JSON", writer.references)
        return JSONSerializer(schema, sr, conf=self._conf())
