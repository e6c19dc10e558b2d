"""mmBERT configurations, built with seeded random weights for speed and memory measurements.

Real mmBERT weights need the model hub; these configurations reproduce the exact
architecture (ModernBERT, 22 layers, 256k vocabulary, 8192 positions, local attention
128 with a global layer every third, both RoPE thetas 160000, mean pooling), and
inference speed does not depend on weight values.
"""

from __future__ import annotations

from typing import Any

from kascade.errors import UsageError

_MMBERT_COMMON: dict[str, Any] = {
    "vocab_size": 256_000,
    "max_position_embeddings": 8192,
    "num_hidden_layers": 22,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    # ModernBERT's default local theta is 10000; mmBERT uses 160000 for both, and a
    # port that keeps the default produces plausible but wrong outputs past 128 tokens.
    "global_rope_theta": 160_000.0,
    "local_rope_theta": 160_000.0,
    "classifier_pooling": "mean",
    "pad_token_id": 0,
    "cls_token_id": 1,
    "sep_token_id": 1,
    "bos_token_id": 1,
    "eos_token_id": 1,
}

MMBERT: dict[str, dict[str, Any]] = {
    "mmbert-small": _MMBERT_COMMON
    | {"hidden_size": 384, "intermediate_size": 1152, "num_attention_heads": 6},
    "mmbert-base": _MMBERT_COMMON
    | {"hidden_size": 768, "intermediate_size": 1152, "num_attention_heads": 12},
}


def random_classifier(name: str, labels: list[str], seed: int = 0, **overrides: Any):
    """A ModernBertForSequenceClassification with mmBERT's configuration and seeded weights."""
    import torch
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    if name not in MMBERT:
        raise UsageError(f"unknown architecture {name!r}; choose from {', '.join(MMBERT)}")
    labeled = {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "attn_implementation": "sdpa",
    }
    config = ModernBertConfig(**(MMBERT[name] | overrides | labeled))
    torch.manual_seed(seed)
    return ModernBertForSequenceClassification(config).eval()
