"""The import graph: the command line over two halves (streaming runtime, offline
toolchain) over the shared records; the runtime never reaches the toolchain or torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
TOOLCHAIN_LIBRARIES = {"torch", "transformers", "sklearn", "scipy", "onnx", "onnxscript"}


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
