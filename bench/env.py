"""The environment a benchmark ran in: CPU, vector extensions, library versions.

python -m bench.env            # prints JSON
"""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path

from kascade.operators.backends import cpu_flags
from kascade.schemas.files import write_text_atomically

VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")
# Matrix units: where bf16 (and int8 through OpenVINO) beat ONNX Runtime's INT8 kernels.
MATRIX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")
PACKAGES = (
    "onnxruntime",
    "openvino",
    "numpy",
    "tokenizers",
    "bytewax",
    "confluent-kafka",
    "torch",
    "transformers",
)


def environment() -> dict:
    cpu, flags = platform.processor(), cpu_flags()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "vector_flags": [f for f in VECTOR_FLAGS if f in flags],
        "matrix_units": [f for f in MATRIX_FLAGS if f in flags],
        "python": platform.python_version(),
        "packages": versions,
    }


def report_splits(path: Path | None, summary: dict, rows: list[dict]) -> None:
    """Print a split benchmark's summary and, given ``path``, write it with every split
    and the environment it ran in (atomically)."""
    print(json.dumps(summary))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        report = {"environment": environment(), "summary": summary, "splits": rows}
        write_text_atomically(path, json.dumps(report, indent=1))


if __name__ == "__main__":
    print(json.dumps(environment(), indent=2))
