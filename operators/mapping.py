"""An event of any shape as the document kascade classifies: the text, id, language and
metadata taken from the field paths in :class:`~kascade.schemas.events.InputSettings`.

A pure function of the decoded event and the Kafka key; what does not fit is a
:class:`Unmapped` naming the path, which the validate step turns into a dead letter.

>>> m = InputSettings(format="json", text=["title", "content.paragraphs"], id="@key")
>>> doc = to_document({"title": "Storm", "content": {"paragraphs": ["Wind.", "Rain."]}},
...     key=b"n-17", mapping=m)
>>> doc.id, doc.text
('n-17', 'Storm\\n\\nWind.\\n\\nRain.')
>>> to_document({"title": 3}, key=b"k", mapping=m).detail
'title: expected a string or a list of strings, found int'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kascade.schemas import InputDocument
from kascade.schemas.events import FieldPath, InputSettings

_MISSING = object()


@dataclass(frozen=True)
class Unmapped:
    """Why an event does not give a document: the path and what was wrong there."""

    path: str
    problem: str

    @property
    def detail(self) -> str:
        return f"{self.path}: {self.problem}"


def lookup(event: Any, path: FieldPath) -> Any:
    """The value at ``path`` in ``event``, or ``_MISSING``.

    >>> lookup({"a": [{"b": 1}]}, FieldPath("a.0.b"))
    1
    """
    value = event
    for part in path.parts:
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _texts(event: Any, path: FieldPath) -> list[str] | Unmapped:
    value = lookup(event, path)
    if value is _MISSING or value is None:
        return Unmapped(path.text, "missing")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return Unmapped(path.text, f"expected a string or a list of strings, found {_kind(value)}")


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list holding " + ", ".join(sorted({type(v).__name__ for v in value}))
    return type(value).__name__


def _scalar_text(event: Any, path: FieldPath, *, required: bool) -> str | Unmapped | None:
    value = lookup(event, path)
    if value is _MISSING or value is None:
        return Unmapped(path.text, "missing") if required else None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return Unmapped(path.text, f"expected a string, found {_kind(value)}")
    return str(value)  # integer ids are common in other people's events


def _key_id(key: bytes | None) -> str | Unmapped:
    if not key:
        return Unmapped("key", "the record has no Kafka key to be its id")
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return Unmapped("key", "the Kafka key is not UTF-8")


def to_document(
    event: Any, *, key: bytes | None, mapping: InputSettings
) -> InputDocument | Unmapped:
    """The document in ``event`` (a decoded JSON, Avro or JSON Schema value, or a string
    for format text), or why there is none."""
    id_path = mapping.id_path
    if mapping.format == "text":
        doc_id = _key_id(key)
        return doc_id if isinstance(doc_id, Unmapped) else _checked(mapping, doc_id, event)
    if not isinstance(event, dict):
        return Unmapped("record", f"expected an object, found {_kind(event)}")
    parts: list[str] = []
    for path in mapping.text_paths:
        found = _texts(event, path)
        if isinstance(found, Unmapped):
            return found
        parts.extend(found)
    found_id = _key_id(key) if id_path is None else _scalar_text(event, id_path, required=True)
    if isinstance(found_id, Unmapped):
        return found_id
    lang: str | None = None
    if mapping.lang_path is not None:
        found_lang = _scalar_text(event, mapping.lang_path, required=False)
        if isinstance(found_lang, Unmapped):
            return found_lang
        lang = found_lang
    metadata = {
        p.text: v for p in mapping.metadata_paths if (v := lookup(event, p)) is not _MISSING
    }
    assert found_id is not None  # required=True answers a text or Unmapped
    return _checked(mapping, found_id, mapping.separator.join(parts), lang, metadata or None)


def _checked(
    mapping: InputSettings,
    doc_id: str,
    text: str,
    lang: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> InputDocument | Unmapped:
    """The document, held to kascade's own input contract (id length, lang tag); a
    violation names the path the value came from."""
    try:
        return InputDocument(id=doc_id, text=text, lang=lang, metadata=metadata)
    except ValidationError as e:
        err = e.errors(include_url=False, include_input=False)[0]
        field = str(err["loc"][0]) if err["loc"] else "record"
        source = {
            "id": "key" if mapping.id_path is None else mapping.id,
            "text": "+".join(mapping.text) if mapping.format != "text" else "value",
            "lang": mapping.lang or "lang",
        }.get(field, field)
        return Unmapped(source, err["msg"])
