"""Accuracy-budgeted quantization: the fastest variant that stays within the budget.

Candidates are measured on the user's calibration text against the FP32 export: argmax
agreement (labels optional) or macro-F1 drop (with labels), and median ms per chunk on
one thread. When the fastest recipes miss the budget, their MatMuls are ranked by how
much quantizing each one alone moves the logits, and the most sensitive are kept in
FP32, a few more at a time, until the budget holds or the variant is no faster than
one that already meets it.

Variants whose MatMuls stay float (``fp32``, ``int4emb``) are also measured under
OpenVINO in bf16 where the host has bf16 units: on AMX hosts that beats every INT8
recipe under ONNX Runtime (docs/BENCHMARKS.md), so the winner is a variant and an
engine, and ``kascade run``'s ``auto`` picks the same engine for it.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from kascade.errors import UsageError
from kascade.operators import backends
from kascade.schemas.engine import Engine, Precision
from kascade.schemas.manifest import FULL_GRAPH, ModelManifest, read_manifest
from kascade.toolchain.data import Examples
from kascade.toolchain.evaluate import macro_f1, score
from kascade.toolchain.graphs import refuse_existing
from kascade.toolchain.measure import Run, run, run_graph, size_mb, tokenize
from kascade.toolchain.quantize import PRESETS, Recipe, quantize_dir, quantize_graph, weight_matmuls

log = logging.getLogger(__name__)

# w8-int4emb (weight-only 8-bit) is left out by default: measured 2.4x slower than FP32
# on AVX2 without VNNI.
DEFAULT_CANDIDATES = (
    "int8-int4emb",
    "int8pc-int4emb",
    "uint8pc-int4emb",
    "int4",
    "int4emb",
    "int8",
    "int8pc",
    "uint8pc",
)
KEEP_STEPS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class Budget:
    """The accuracy a quantized variant must keep, relative to FP32."""

    min_agreement: float | None = None
    max_f1_drop: float | None = None

    def __post_init__(self) -> None:
        if (self.min_agreement is None) == (self.max_f1_drop is None):
            raise ValueError("give exactly one of min_agreement and max_f1_drop")

    def met(self, row: Candidate) -> bool:
        if self.min_agreement is not None:
            return row.agreement >= self.min_agreement
        assert row.f1_delta is not None and self.max_f1_drop is not None
        return -row.f1_delta <= self.max_f1_drop

    def describe(self) -> str:
        if self.min_agreement is not None:
            return f"argmax agreement with FP32 >= {self.min_agreement:g}"
        return f"macro-F1 drop vs FP32 <= {self.max_f1_drop:g}"


@dataclass(frozen=True)
class Candidate:
    variant: str
    engine: str
    agreement: float
    f1_delta: float | None
    macro_f1: float | None
    ms_per_chunk: float
    speedup: float
    size_mb: float
    meets: bool

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SearchResult:
    chosen: Recipe
    engine: Engine
    table: list[Candidate]
    manifest: ModelManifest


class _Bench:
    """Measures recipes on fixed sequences against the FP32 reference run."""

    def __init__(self, fp32: Path, data: Examples, budget: Budget, work: Path) -> None:
        self.fp32 = fp32
        self.budget = budget
        self.work = work
        self.labels = read_manifest(fp32)[0].labels
        self.truth = data.labels
        self.seqs = tokenize(fp32, data.texts)
        self.ref = run(fp32, self.seqs)
        self.ref_f1 = (
            None
            if self.truth is None
            else macro_f1(self.truth, [self.labels[i] for i in self.ref.predictions], self.labels)
        )
        self.recipes: dict[str, Recipe] = {}

    def row(self, name: str, engine: Engine, result: Run, size: float) -> Candidate:
        s = score(result, self.ref, self.labels, self.truth, self.ref_f1)
        partial = Candidate(
            variant=name,
            engine=engine.name,
            agreement=s["agreement"],
            f1_delta=s["f1_delta"],
            macro_f1=s["macro_f1"],
            ms_per_chunk=s["ms_per_chunk"],
            speedup=s["speedup"],
            size_mb=size,
            meets=False,
        )
        return Candidate(**(asdict(partial) | {"meets": self.budget.met(partial)}))

    def measure(self, recipe: Recipe, engine: Engine | None = None) -> Candidate:
        engine = engine or Engine()
        self.recipes[recipe.name] = recipe
        if recipe.name == "fp32":
            result = self.ref if engine == Engine() else self._run(self.fp32 / FULL_GRAPH, engine)
            return self.row("fp32", engine, result, size_mb(self.fp32))
        path = self.work / f"{recipe.name}.onnx"
        if not path.exists():
            quantize_graph(self.fp32 / FULL_GRAPH, path, recipe)
        return self.row(recipe.name, engine, self._run(path, engine), path.stat().st_size / 1e6)

    def _run(self, path: Path, engine: Engine) -> Run:
        return run_graph(path, self.seqs, engine=engine)

    def sensitivity(self, base: Recipe, sample: int) -> list[str]:
        """Weight MatMuls, most sensitive first: mean |logit change| when quantized alone."""
        names = weight_matmuls(onnx.load(str(self.fp32 / FULL_GRAPH)))
        seqs, ref = self.seqs[:sample], self.ref.logits[:sample]
        plain = Recipe(
            "probe",
            matmul=base.matmul,
            weight_type=base.weight_type,
            per_channel=base.per_channel,
            reduce_range=base.reduce_range,
            nbits=base.nbits,
        )
        change = {}
        for name in tqdm(names, desc=f"sensitivity ({base.name})", leave=False):
            one = plain.keeping([n for n in names if n != name])
            path = self.work / "probe.onnx"
            quantize_graph(self.fp32 / FULL_GRAPH, path, one)
            change[name] = float(np.abs(run_graph(path, seqs, warmup=0).logits - ref).mean())
        return sorted(names, key=lambda n: change[n], reverse=True)


def search(
    fp32: Path,
    out: Path,
    data: Examples,
    budget: Budget,
    *,
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES,
    refine: int = 2,
    sensitivity_sample: int = 64,
) -> SearchResult:
    """Measure ``candidates``, refine the fastest failing ones, write the winner to ``out``.

    A failing recipe is refined only when its embeddings-only counterpart (``int4emb``
    or ``fp32``) meets the budget: otherwise no number of FP32 MatMuls can rescue it.
    """
    refuse_existing(out)
    if budget.max_f1_drop is not None and data.labels is None:
        raise UsageError("--max-f1-drop needs labeled calibration data (--label-column)")
    unknown = [c for c in candidates if c not in PRESETS]
    if unknown:
        raise UsageError(f"unknown presets: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="kascade-search-") as work:
        bench = _Bench(fp32, data, budget, Path(work))
        table = [bench.measure(PRESETS["fp32"])]
        for name in tqdm(candidates, desc="candidates"):
            table.append(bench.measure(PRESETS[name]))
            log.info("%s", table[-1])
        floats = [n for n in ("fp32", *candidates) if PRESETS[n].matmul == "fp32"]
        for engine in bf16_engines():
            for name in floats:
                table.append(bench.measure(PRESETS[name], engine))
                log.info("%s", table[-1])

        def best_passing() -> Candidate:
            return min((c for c in table if c.meets), key=lambda c: c.ms_per_chunk)

        # Refinement keeps MatMuls in FP32 under ONNX Runtime, whose integer kernels
        # are the ones a partly quantized graph runs on.
        ort_rows = [c for c in table if c.engine == Engine().name]
        failing = sorted(
            (c for c in ort_rows if not c.meets and c.ms_per_chunk < best_passing().ms_per_chunk),
            key=lambda c: c.ms_per_chunk,
        )
        by_name = {c.variant: c for c in ort_rows}
        refined = 0
        for cand in failing:
            base = PRESETS[cand.variant]
            ceiling = by_name.get(base.embeddings_only().name)
            if base.matmul == "fp32" or (ceiling is not None and not ceiling.meets):
                continue  # keeping MatMuls in FP32 cannot fix what the embeddings cost
            if refined == refine:
                break
            refined += 1
            ranking = bench.sensitivity(base, sensitivity_sample)
            for k in (k for k in KEEP_STEPS if k < len(ranking)):
                row = bench.measure(base.keeping(ranking[:k]))
                table.append(row)
                if row.meets or row.ms_per_chunk >= best_passing().ms_per_chunk:
                    break
        best = best_passing()
        chosen, engine = bench.recipes[best.variant], Engine.parse(best.engine)
        measured = {
            "budget": budget.describe(),
            "calibration_examples": len(data),
            "search": [c.as_dict() for c in table],
            "chosen": chosen.name,
            "engine": engine.name,
        }
        manifest = quantize_dir(fp32, out, chosen, measured=measured)
    return SearchResult(chosen, engine, table, manifest)


def bf16_engines() -> list[Engine]:
    """The bf16 engines this host runs (none without OpenVINO or bf16 units)."""
    return [e for e in backends.engines_here() if e.precision is Precision.BF16]
