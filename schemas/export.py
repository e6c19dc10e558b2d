"""Writes the JSON Schemas of the Kafka records into ``schemas/json``.

Run ``python -m kascade.schemas.export`` after changing a record; ``--check`` exits non-zero
when a committed file is stale (the test suite does the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from kascade.schemas.dead_letters import DeadLetter
from kascade.schemas.files import write_text_atomically
from kascade.schemas.records import InputDocument, OutputRecord

SCHEMA_DIR = Path(__file__).parent / "json"
CONTRACTS: dict[str, type[BaseModel]] = {
    "input.schema.json": InputDocument,
    "output.schema.json": OutputRecord,
    "deadletter.schema.json": DeadLetter,
}


def render(model: type[BaseModel]) -> str:
    """The schema text for ``model``, as committed (stable key order, trailing newline)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    schema.update(model.model_json_schema(mode="validation"))
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load(name: str) -> dict:
    """A committed schema, parsed."""
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kascade.schemas.export", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = []
    for name, model in CONTRACTS.items():
        path = SCHEMA_DIR / name
        text = render(model)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            write_text_atomically(path, text)
    if args.check and stale:
        print(
            f"stale schemas: {', '.join(stale)}; run python -m kascade.schemas.export",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
