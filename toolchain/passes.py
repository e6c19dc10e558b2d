"""Full-model passes over many texts on every core, with progress shown.

Calibration runs the full model on every chunk of its texts, one chunk at a time as a
run does (one session thread per process: parallel single-chunk workers beat big
batches on CPUs, docs/BENCHMARKS.md). Texts are independent, so blocks of them go to
worker processes, each with its own sessions; results come back in the texts' order and
are the same, bit for bit, as one process would compute, because every chunk runs on an
identically configured single-threaded session.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.engine import Engine

T = TypeVar("T")
X = TypeVar("X")  # a text, or a text with what the work needs to know about it
Work = Callable[[Encoder, list[X]], T]

# Texts per task: small enough to spread long and short texts over the processes and to
# move the progress bar, large enough that a task outweighs its pickling.
BLOCK = 8

_encoder: Encoder | None = None  # a worker process's own sessions


def blocks_of(texts: list[X]) -> list[list[X]]:
    """The consecutive blocks :func:`over_texts` hands out, in order."""
    return [texts[i : i + BLOCK] for i in range(0, len(texts), BLOCK)]


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def over_texts(
    model_dir: Path,
    work: Work[X, T],
    texts: list[X],
    *,
    processes: int | None = None,
    what: str = "full model",
    engine: Engine | None = None,
) -> list[T]:
    """``work(encoder, block)`` for consecutive blocks of ``texts``, in order, on up to
    ``processes`` worker processes (default: every core this process may use), the
    graphs run by ``engine`` (default ONNX Runtime); ``work`` must be picklable (a
    module-level function, or a partial of one)."""
    engine = engine or Engine()
    from tqdm import tqdm

    blocks = blocks_of(texts)
    processes = max(1, min(processes or available_cores(), len(blocks)))
    out: list[T] = []
    # disable=None: a bar on a terminal, nothing in a log file or a pipe
    with tqdm(total=len(texts), desc=what, unit="text", disable=None, leave=False) as bar:
        if processes == 1:
            encoder = Encoder(load_model_dir(model_dir), graphs="stages", engine=engine)
            for block in blocks:
                out.append(work(encoder, block))
                bar.update(len(block))
            return out
        with ProcessPoolExecutor(
            processes,
            # spawn: ONNX Runtime's threads and sessions do not survive a fork
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(str(model_dir), engine),
        ) as pool:
            results = pool.map(functools.partial(_run, work), blocks)
            for block, result in zip(blocks, results, strict=True):
                out.append(result)
                bar.update(len(block))
    return out


def _start(model_dir: str, engine: Engine) -> None:
    global _encoder
    _encoder = Encoder(load_model_dir(Path(model_dir)), graphs="stages", engine=engine)


def _run(work: Work[X, T], block: list[X]) -> T:
    assert _encoder is not None
    return work(_encoder, block)
