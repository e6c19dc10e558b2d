"""Every docstring example in the package runs and says what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kascade

PARTS = ["kascade", "kascade.schemas", "kascade.operators", "kascade.dataflow"]
PARTS += ["kascade.toolchain", "kascade.demo", "bench"]


def _modules() -> list[str]:
    names = set(PARTS)
    for part in PARTS:
        package = importlib.import_module(part)
        for info in pkgutil.iter_modules(package.__path__, prefix=f"{part}."):
            if not info.name.endswith("__main__"):  # running it is what it does
                names.add(info.name)
    return sorted(names)


MODULES = _modules()


def test_the_package_has_modules_to_check() -> None:
    assert len(MODULES) > 30, MODULES
    assert kascade.__version__


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
