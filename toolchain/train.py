"""Fine-tune a Hugging Face encoder for sequence classification on CPU, seeded.

Writes an HF checkpoint directory (weights, config with the label map, tokenizer, and
its provenance: base model and version, data hash, recipe) that ``kascade export``
takes. Reports dev macro-F1 after every epoch and keeps the best epoch.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np

from kascade.errors import UsageError
from kascade.toolchain.checkpoint import load_classifier
from kascade.toolchain.data import Examples
from kascade.toolchain.evaluate import macro_f1
from kascade.toolchain.graphs import staged_directory
from kascade.toolchain.provenance import base_of, write_provenance
from kascade.toolchain.train_config import TrainConfig

log = logging.getLogger(__name__)


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _predict(model, tokenizer, texts: list[str], max_length: int, batch_size: int) -> list[int]:
    import torch

    model.eval()
    preds: list[int] = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[i : i + batch_size],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            preds.extend(model(**enc).logits.argmax(-1).tolist())
    return preds


def train(
    base: str,
    out: Path,
    train_data: Examples,
    dev_data: Examples | None,
    config: TrainConfig | None = None,
) -> dict:
    """Fine-tune ``base`` (local directory or hub id) and write the checkpoint to ``out``."""
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    config = config or TrainConfig()
    if train_data.labels is None:
        raise UsageError("training data needs a label column")
    if config.threads:
        torch.set_num_threads(config.threads)
    _seed_everything(config.seed)
    labels = sorted(
        set(train_data.labels) | set(dev_data.labels if dev_data and dev_data.labels else [])
    )
    label_id = {label: i for i, label in enumerate(labels)}
    model = load_classifier(base, labels=labels)
    base_ref = base_of(base, model)
    tokenizer = AutoTokenizer.from_pretrained(base)
    y = torch.tensor([label_id[label] for label in train_data.labels])
    steps_per_epoch = (len(train_data) + config.batch_size - 1) // config.batch_size
    total = steps_per_epoch * config.epochs
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    schedule = get_linear_schedule_with_warmup(optimizer, int(total * config.warmup_ratio), total)
    generator = torch.Generator().manual_seed(config.seed)
    history = []
    best_f1, best_state = -1.0, None
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = torch.randperm(len(train_data), generator=generator).tolist()
        bar = tqdm(
            range(0, len(order), config.batch_size),
            desc=f"epoch {epoch}",
            leave=False,
            disable=None,  # a progress bar on a terminal only, not in a log
        )
        losses = []
        for start in bar:
            idx = order[start : start + config.batch_size]
            enc = tokenizer(
                [train_data.texts[i] for i in idx],
                truncation=True,
                max_length=config.max_length,
                padding=True,
                return_tensors="pt",
            )
            loss = model(**enc, labels=y[idx]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        entry = {"epoch": epoch, "train_loss": float(np.mean(losses))}
        if dev_data is not None and dev_data.labels is not None:
            preds = _predict(model, tokenizer, dev_data.texts, config.max_length, 64)
            f1 = macro_f1(dev_data.labels, [labels[p] for p in preds], labels)
            entry["dev_macro_f1"] = f1
            if f1 > best_f1:
                best_f1 = f1
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        history.append(entry)
        print(
            f"epoch {epoch}: train loss {entry['train_loss']:.4f}"
            + (f", dev macro-F1 {entry['dev_macro_f1']:.4f}" if "dev_macro_f1" in entry else "")
        )
    if best_state is not None:
        model.load_state_dict(best_state)
    with staged_directory(out) as tmp:
        model.eval()
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_provenance(tmp, base_ref, train_data, dev_data, config)
    return {
        "labels": labels,
        "history": history,
        "best_dev_macro_f1": max(best_f1, 0.0) if dev_data else None,
    }
