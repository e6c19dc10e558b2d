"""The README, checked against the software it describes: the metrics it lists against
what ``/metrics`` serves, the Layout table against the tree, the demo's documents
against the numbers it gives, the flags it names against the settings."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import prometheus_client
import pytest

from kascade.operators import metrics
from kascade.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PROSE = " ".join(README.split())  # line breaks are layout, not content


def _bullet(start: str) -> str:
    """The README's list item that begins with ``start``, up to the next item."""
    begin = README.index(f"\n- {start}")
    end = README.index("\n- ", begin + 3)
    return README[begin:end]


def test_the_metric_list_is_what_the_metrics_endpoint_serves() -> None:
    assert metrics.DOCS_IN is not None  # kascade's metrics are registered on import
    served = set()
    for family in prometheus_client.REGISTRY.collect():
        if family.name.startswith("kascade_"):
            served.add(family.name + ("_total" if family.type == "counter" else ""))
    listed = set(re.findall(r"`(kascade_\w+)", _bullet("`--metrics-port`")))
    assert listed == served


def test_the_metrics_host_and_its_default_are_stated() -> None:
    item = _bullet("`--metrics-port`")
    assert f"`--metrics-host` (default {Settings().metrics_host}" in item


def _layout() -> dict[str, str]:
    """Folder -> the "what" cell of its row in the Layout table."""
    section = README[README.index("## Layout") :]
    rows = re.findall(r"^\| `(\w+)/` \| [^|]* \| (.*) \|$", section, flags=re.M)
    return dict(rows)


@pytest.mark.parametrize("folder", ["schemas", "operators", "dataflow", "toolchain", "kascade"])
def test_the_layout_table_names_every_module_of_each_folder_and_no_other(folder: str) -> None:
    tree = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / folder).iterdir()
        if not p.is_symlink()  # kascade/'s links to the top-level folders have their rows
        and ((p.suffix == ".py" and not p.stem.startswith("__")) or (p / "__init__.py").is_file())
    }
    named = set(re.findall(r"`(\w+)`", _layout()[folder]))
    assert named == tree


def test_the_demo_documents_are_in_as_many_languages_and_scripts_as_the_readme_says() -> None:
    docs = [json.loads(line) for line in (ROOT / "kascade/demo/documents.jsonl").open()]
    languages = {d["lang"] for d in docs if d.get("lang")}
    # A script is the first word of a letter's Unicode name (LATIN, CYRILLIC, CJK, ...).
    scripts = {unicodedata.name(ch).split()[0] for d in docs for ch in d["text"] if ch.isalpha()}
    blank = [d for d in docs if not d["text"].strip()]
    stated = (
        f"The {len(docs)} sample documents are in {len(languages)} languages and"
        f" {len(scripts)} scripts (and {'one' if len(blank) == 1 else len(blank)} is blank"
    )
    assert stated in PROSE
