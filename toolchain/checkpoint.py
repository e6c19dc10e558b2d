"""Loading Hugging Face classifiers from a local directory or, with internet, a hub id."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kascade.errors import UsageError
from kascade.toolchain import ToolchainError

SUPPORTED = ("bert", "modernbert", "roberta", "xlm-roberta")


@contextmanager
def _loading(what: str) -> Iterator[None]:
    """Turn a Hugging Face loading failure into a one-line :class:`ToolchainError`."""
    quiet_transformers()
    try:
        yield
    except (OSError, ValueError) as e:
        raise ToolchainError(f"cannot load {what}: {str(e).splitlines()[0]}") from None


def quiet_transformers() -> None:
    """Keep transformers' own reports (load reports that list the new head's weights as
    missing, progress bars for loading and saving shards) out of the output unless the
    user asked for INFO (``kascade -v``): none of them is something to act on here."""
    if logging.getLogger().getEffectiveLevel() <= logging.INFO:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _config(source: str) -> Any:
    from transformers import AutoConfig

    path = Path(source)
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UsageError(f"{source} is not a Hugging Face checkpoint (no config.json)")
    elif source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise UsageError(f"checkpoint not found: {source}")
    with _loading(f"the configuration of {source}"):
        config = AutoConfig.from_pretrained(source)
    if config.model_type not in SUPPORTED:
        raise UsageError(
            f"{source}: unsupported architecture {config.model_type!r};"
            f" supported: {', '.join(SUPPORTED)}"
        )
    return config


def has_classification_head(config: Any) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))


def load_classifier(source: str, *, labels: list[str] | None = None):
    """A sequence classifier in eval mode, on the SDPA attention path the exporter traces.

    With ``labels``, a new classification head is initialized (for fine-tuning a base
    encoder); without, the checkpoint must already have one.
    """
    from transformers import AutoModelForSequenceClassification

    config = _config(source)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
    if labels is None:
        if not has_classification_head(config):
            raise UsageError(
                f"{source} has no sequence-classification head; fine-tune it with kascade train"
            )
    else:
        kwargs |= {  # the label count follows from id2label
            "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)},
            "ignore_mismatched_sizes": True,
        }
    with _loading(source):
        model = AutoModelForSequenceClassification.from_pretrained(source, **kwargs)
    return model.eval()


def labels_of(model: Any) -> list[str]:
    id2label = model.config.id2label
    return [id2label[i] for i in range(len(id2label))]


def tokenizer_json(source: str, out: Path) -> None:
    """Write the checkpoint's fast tokenizer as ``tokenizer.json`` into ``out``."""
    from transformers import AutoTokenizer

    with _loading(f"the tokenizer of {source}"):
        tok = AutoTokenizer.from_pretrained(source)
    if not tok.is_fast:
        raise UsageError(f"{source} has no fast tokenizer (tokenizer.json) to serve with")
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
