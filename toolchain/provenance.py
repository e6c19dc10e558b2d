"""Where a model came from, recorded when it is made: the base model and its version,
the training data's hash and the recipe, carried from checkpoint to manifest.

>>> from kascade.toolchain.data import Examples
>>> examples_sha256(Examples(["a b"], ["x"])) == examples_sha256(Examples(["a b"], ["x"]))
True
>>> examples_sha256(Examples(["a b"], ["x"])) == examples_sha256(Examples(["a b"], ["y"]))
False
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from kascade.schemas.files import write_text_atomically
from kascade.schemas.manifest import BASE_FILE, PROVENANCE_FILE, BaseModelRef, Provenance
from kascade.toolchain.data import Examples
from kascade.toolchain.train_config import TrainConfig

# What a local checkpoint's version is the digest of: its configuration and weights.
_WEIGHT_PATTERNS = ("config.json", "*.safetensors", "*.bin")


def examples_sha256(examples: Examples) -> str:
    """A digest of the (text, label) pairs, whatever file format they were read from."""
    canonical = json.dumps([examples.texts, examples.labels], ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_base(directory: Path, ref: BaseModelRef) -> None:
    """Record in a converted checkpoint which published model it holds."""
    write_text_atomically(directory / BASE_FILE, ref.model_dump_json(indent=2) + "\n")


def base_of(base: str, model: Any) -> BaseModelRef:
    """The identity of the checkpoint ``base`` (a directory or a hub id) loaded as ``model``."""
    directory = Path(base)
    if (directory / BASE_FILE).is_file():
        return BaseModelRef.model_validate_json((directory / BASE_FILE).read_text())
    if directory.is_dir():
        digest = hashlib.sha256()
        for pattern in _WEIGHT_PATTERNS:
            for f in sorted(directory.glob(pattern)):
                with f.open("rb") as fh:
                    for block in iter(functools.partial(fh.read, 1 << 20), b""):
                        digest.update(block)
        return BaseModelRef(name=str(directory.resolve()), version=f"sha256:{digest.hexdigest()}")
    commit = getattr(model.config, "_commit_hash", None)
    return BaseModelRef(name=base, version=f"commit:{commit}" if commit else "unknown")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_provenance(
    directory: Path,
    base: BaseModelRef,
    train: Examples,
    dev: Examples | None,
    config: TrainConfig,
) -> Provenance:
    p = Provenance(
        base=base,
        training_data_sha256=examples_sha256(train),
        training_examples=len(train),
        dev_data_sha256=examples_sha256(dev) if dev is not None else None,
        recipe=config.model_dump(mode="json"),
        tools={name: _version(name) for name in ("kascade", "torch", "transformers")},
    )
    write_text_atomically(directory / PROVENANCE_FILE, p.model_dump_json(indent=2) + "\n")
    return p


def read_provenance(checkpoint: str) -> Provenance | None:
    """What ``kascade train`` recorded in ``checkpoint``, if it made it."""
    f = Path(checkpoint) / PROVENANCE_FILE
    return Provenance.model_validate_json(f.read_text()) if f.is_file() else None
