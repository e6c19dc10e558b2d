"""One ONNX graph file loaded by an inference engine, and the choice of engine.

:class:`Encoder` (see :mod:`operators.encoder`) sees only :class:`Graph`: the names of
the inputs a graph reads and ``run``. ONNX Runtime is always installed; OpenVINO is
imported only when chosen, so a host without it runs everything else.

Measured on an Intel Xeon with AMX (docs/BENCHMARKS.md): the FP32 graph under OpenVINO
in bf16 classifies a 256-token chunk about twice as fast per thread as the INT8 graph
under ONNX Runtime, while OpenVINO runs the INT8 (MatMulInteger) graph at half ONNX
Runtime's speed. On an Intel Xeon with AVX512-BF16 but no AMX, OpenVINO's bf16 ran the
FP32 graph at half ONNX Runtime's INT8 speed and below its own FP32: the vector bf16
instructions do not pay, the matrix units do. Hence ``auto``: OpenVINO in bf16 for a
graph whose MatMuls are float on a host with AMX, ONNX Runtime otherwise.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from kascade.errors import UsageError
from kascade.schemas.engine import ENGINES, Backend, Engine, EngineChoice, Precision
from kascade.schemas.manifest import ModelManifest


class Graph(Protocol):
    """A loaded graph: which inputs it reads, and one call."""

    inputs: tuple[str, ...]

    def run(self, feed: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        """The named output (default: the first) for ``feed``."""
        ...


class OrtGraph:
    """An ONNX Runtime CPU session with an explicit thread count."""

    def __init__(self, path: Path, threads: int) -> None:
        self.session = ort_session(path, threads)
        self.inputs = tuple(i.name for i in self.session.get_inputs())

    def run(self, feed: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        return self.session.run(None if output is None else [output], feed)[0]


def ort_session(path: Path, threads: int) -> ort.InferenceSession:
    """A CPU session with an explicit thread count, so workers x threads <= cores."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning threads burn the core a sibling worker process needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OpenVinoGraph:
    """An OpenVINO CPU model compiled for one-at-a-time calls of any sequence length."""

    def __init__(self, path: Path, threads: int, precision: Precision) -> None:
        core = _openvino_core()
        config: dict[str, Any] = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            # Pinning would put every worker process's thread on the same first cores.
            "ENABLE_CPU_PINNING": False,
            "INFERENCE_PRECISION_HINT": "bf16" if precision is Precision.BF16 else "f32",
        }
        # read_model follows the graph's external-data references to weights.bin itself.
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.inputs = tuple(p.get_any_name() for p in self.compiled.inputs)

    def run(self, feed: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        # share_outputs=False (the default) copies: the next call reuses the buffers.
        result = self.request.infer(feed)
        port = self.compiled.output(0) if output is None else self.compiled.output(output)
        return np.asarray(result[port])


def load_graph(path: Path, threads: int, engine: Engine) -> Graph:
    if engine.backend is Backend.OPENVINO:
        return OpenVinoGraph(path, threads, engine.precision)
    return OrtGraph(path, threads)


@functools.cache
def _openvino_core() -> Any:
    try:
        import openvino
    except ImportError as e:
        raise UsageError(
            f"the openvino backend needs the openvino package ({e}); pip install openvino,"
            " or run with --encoder.backend onnxruntime"
        ) from None
    return openvino.Core()


@functools.cache
def host_capabilities() -> frozenset[str]:
    """What OpenVINO's CPU plugin can use here (``BF16`` where the host has AMX or
    AVX512-BF16); empty where OpenVINO is not installed."""
    try:
        return frozenset(_openvino_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    except UsageError:
        return frozenset()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (``avx512_bf16``, ``amx_bf16``...);
    empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_matrix_units() -> bool:
    """Whether the CPU has bf16 matrix units (AMX), where bf16 beats INT8."""
    return "amx_bf16" in cpu_flags()


def integer_matmuls(manifest: ModelManifest) -> bool:
    """Whether the graphs' weight MatMuls were quantized to integers."""
    return manifest.quantization.get("matmul", "fp32") != "fp32"


def runs_here(engine: Engine) -> bool:
    """Whether this host can run ``engine``."""
    if engine.backend is Backend.ONNXRUNTIME:
        return True
    capabilities = host_capabilities()
    return bool(capabilities) and (engine.precision is Precision.FP32 or "BF16" in capabilities)


def engines_here() -> tuple[Engine, ...]:
    """Every engine kascade has (:data:`ENGINES`) that this host runs, in that order."""
    return tuple(e for e in ENGINES if runs_here(e))


def searched(manifest: ModelManifest) -> Engine | None:
    """The engine ``kascade quantize --min-agreement/--max-f1-drop`` chose the variant
    with (``None``: a preset, no search)."""
    name = manifest.measured.get("engine")
    if name is None:
        return None
    try:
        return Engine.parse(str(name))
    except ValueError:
        raise UsageError(
            f"the model manifest names an unknown engine {str(name)[:40]!r} under measured"
        ) from None


def resolve(
    settings: EngineChoice, manifest: ModelManifest, certified: Engine | None = None
) -> Engine:
    """The engine a run uses: the settings' choice, with ``auto`` decided by the graph
    and the host (see the module docstring); but where the cascade was ``certified``
    with an engine this host runs, that one, and otherwise the engine ``kascade
    quantize``'s search chose the model's variant with, where this host runs it. An
    explicit choice the host cannot honour is a usage error, never a silent substitute."""
    if settings.backend == "auto" and settings.precision == "auto":
        for known in (certified, searched(manifest)):
            if known is not None and runs_here(known):
                return known
    bf16_host = "BF16" in host_capabilities()
    bf16_pays = bf16_host and bf16_matrix_units()  # AVX512-BF16 alone runs bf16 slower
    backend = settings.backend
    if backend == "auto":
        float_graph = not integer_matmuls(manifest)
        wants_bf16 = settings.precision in ("auto", "bf16")
        backend = "openvino" if float_graph and bf16_pays and wants_bf16 else "onnxruntime"
        if settings.precision == "bf16":
            backend = "openvino"
    precision = settings.precision
    if precision == "auto":
        precision = "bf16" if backend == "openvino" and bf16_pays else "fp32"
    engine = Engine(backend=Backend(backend), precision=Precision(precision))
    if engine.backend is Backend.OPENVINO:
        _openvino_core()  # installed, or a usage error now rather than in a worker
        if engine.precision is Precision.BF16 and not bf16_host:
            raise UsageError(
                "--encoder.precision bf16: this CPU has no bf16 units (AMX or AVX512-BF16)"
                " that OpenVINO can use; use fp32"
            )
    return engine
