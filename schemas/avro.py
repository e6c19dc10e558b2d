"""Avro schemas of kascade's typed records, generated from the pydantic models as the
JSON Schemas are, so the record registered in a Schema Registry is the record written.

py-avro-schema reads raw ``__annotations__`` and cannot resolve the postponed
annotations these modules use, so the (small) mapping is done here from the fields
pydantic has already resolved.

>>> from kascade.schemas.records import ModelIdentity
>>> schema = avro_schema(ModelIdentity, namespace="dev.kascade")
>>> schema["name"], [f["type"] for f in schema["fields"]]
('ModelIdentity', ['string', 'string', 'string', ['null', 'string']])
"""

from __future__ import annotations

import types
from enum import Enum
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

_PRIMITIVES = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes"}


def avro_schema(model: type[BaseModel], *, namespace: str) -> dict[str, Any]:
    """The Avro record schema of ``model`` (fields in declaration order)."""
    return _record(model, namespace, set())


def _record(model: type[BaseModel], namespace: str, named: set[str]) -> Any:
    if model.__name__ in named:
        return f"{namespace}.{model.__name__}"  # a named type is defined once, then referenced
    named.add(model.__name__)
    fields = []
    for name, info in model.model_fields.items():
        field: dict[str, Any] = {"name": name, "type": _type(info.annotation, namespace, named)}
        if info.description:
            field["doc"] = info.description
        fields.append(field)
    return {"type": "record", "name": model.__name__, "namespace": namespace, "fields": fields}


def _type(annotation: Any, namespace: str, named: set[str]) -> Any:
    origin = get_origin(annotation)
    if origin is Annotated:  # a constrained type (NonNegativeInt): Avro keeps the base type
        return _type(get_args(annotation)[0], namespace, named)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"only optional unions map to Avro here, not {annotation}")
        return ["null", _type(members[0], namespace, named)]
    if origin is list:
        return {"type": "array", "items": _type(get_args(annotation)[0], namespace, named)}
    if origin is dict:
        key, value = get_args(annotation)
        if key is not str:
            raise TypeError(f"Avro maps have string keys, not {key}")
        return {"type": "map", "values": _type(value, namespace, named)}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _record(annotation, namespace, named)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if annotation.__name__ in named:
            return f"{namespace}.{annotation.__name__}"
        named.add(annotation.__name__)
        symbols = [str(m.value) for m in annotation]
        return {
            "type": "enum",
            "name": annotation.__name__,
            "namespace": namespace,
            "symbols": symbols,
        }
    for python, avro in _PRIMITIVES.items():
        if annotation is python:
            return avro
    raise TypeError(f"no Avro type for {annotation!r}")
