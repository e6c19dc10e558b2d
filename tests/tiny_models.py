"""Tiny seeded classifiers, built at test time and saved as real HF checkpoint directories."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the team won the cup final in the last minute",
    "the striker scored twice and the coach smiled",
    "parliament passed the budget after a long debate",
    "the minister resigned before the election",
    "doctors recommend exercise and a balanced diet",
    "the vaccine trial reported fewer infections",
    "the river flows through the valley to the sea",
    "the mountain range divides the two countries",
    "researchers built a faster battery with new chemistry",
    "the telescope found water on a distant planet",
    "book the hotel early and take the night train",
    "the museum and the old town attract many tourists",
    "the film won an award and the singer released an album",
]
LABELS = ["sports", "politics", "health", "geography", "science", "travel", "entertainment"]


def save_tokenizer(directory: Path, vocab_size: int = 400) -> None:
    """A WordPiece tokenizer over ``CORPUS``'s words and letters, with BERT-style special tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    # The vocabulary is built, not trained: WordPieceTrainer breaks ties between equally
    # frequent pairs in hash order, so two sessions got different tokenizers, different
    # cascades and different document stops from the same seed.
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    words = sorted({w for line in CORPUS for w in line.lower().split()})
    chars = sorted({c for w in words for c in w})
    pieces = specials + chars + [f"##{c}" for c in chars] + words
    vocab = {piece: i for i, piece in enumerate(pieces[:vocab_size])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(directory)


def _tiny_kwargs(labels: list[str]) -> dict:
    """Config arguments both tiny architectures share: the same small shape, the labels."""
    return {
        "vocab_size": 400,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "pad_token_id": 0,
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def _save_seeded(model_cls, config, directory: Path, seed: int) -> Path:
    import torch

    torch.manual_seed(seed)
    model_cls(config).save_pretrained(directory)
    save_tokenizer(directory)
    return directory


def tiny_modernbert(
    directory: Path, *, labels: list[str] = LABELS, seed: int = 0, head: bool = True
) -> Path:
    """A 4-layer ModernBERT with a 32-token local window, so tests cross it cheaply."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel

    config = ModernBertConfig(
        max_position_embeddings=512,
        local_attention=32,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=160000.0,
        classifier_pooling="mean",
        cls_token_id=1,
        sep_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
        **_tiny_kwargs(labels),
    )
    cls = ModernBertForSequenceClassification if head else ModernBertModel
    return _save_seeded(cls, config, directory, seed)


def tiny_bert(
    directory: Path, *, labels: list[str] = LABELS, seed: int = 0, head: bool = True
) -> Path:
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    config = BertConfig(max_position_embeddings=256, **_tiny_kwargs(labels))
    cls = BertForSequenceClassification if head else BertModel
    return _save_seeded(cls, config, directory, seed)
