"""Which inference engine runs a model directory's graphs, and at what precision.

The same ONNX files run under ONNX Runtime (integer kernels: fastest for the INT8
presets without matrix units) or OpenVINO (reads the same files; runs an FP32 graph in
bf16 on AMX or AVX512-BF16 hosts). Precision is the arithmetic of the graph's float
parts: ``fp32`` as exported, ``bf16`` on the host's bf16 units. An engine changes the
numbers the cheap stages see, so a calibration names the engine it was made with.

>>> Engine(backend=Backend.OPENVINO, precision=Precision.BF16).name
'openvino/bf16'
>>> Engine.parse("onnxruntime/fp32") == Engine()
True
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Backend(StrEnum):
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"


class Engine(BaseModel):
    """A resolved engine: what actually runs the graphs (never ``auto``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = Backend.ONNXRUNTIME
    precision: Precision = Precision.FP32

    @model_validator(mode="after")
    def _runnable(self) -> Engine:
        if self.backend is Backend.ONNXRUNTIME and self.precision is Precision.BF16:
            # ONNX Runtime's CPU provider has no bf16 kernels for these graphs.
            raise ValueError("bf16 runs on the openvino backend only")
        return self

    @property
    def name(self) -> str:
        return f"{self.backend.value}/{self.precision.value}"

    @classmethod
    def parse(cls, name: str) -> Engine:
        backend, _, precision = name.partition("/")
        return cls(backend=Backend(backend), precision=Precision(precision or "fp32"))


# Every engine kascade can run, ONNX Runtime (the reference arithmetic) first.
ENGINES = (
    Engine(),
    Engine(backend=Backend.OPENVINO, precision=Precision.FP32),
    Engine(backend=Backend.OPENVINO, precision=Precision.BF16),
)


class EngineChoice(BaseModel):
    """Which engine runs the model's graphs, as chosen (auto: as the host suits)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["auto", "onnxruntime", "openvino"] = Field(
        default="auto",
        description="auto: openvino for a graph without integer MatMuls on a host with"
        " bf16 matrix units (AMX, AVX512-BF16), onnxruntime otherwise.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Arithmetic of the graph's float parts. auto: bf16 where the backend"
        " is openvino and the host has bf16 units; bf16 needs the openvino backend.",
    )

    @model_validator(mode="after")
    def _precision_runs(self) -> EngineChoice:
        if self.backend == "onnxruntime" and self.precision == "bf16":
            raise ValueError(
                "--encoder.precision bf16 needs --encoder.backend openvino (or auto):"
                " ONNX Runtime has no bf16 kernels for these graphs"
            )
        return self
