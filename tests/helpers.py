"""Helpers shared by the test modules: the command line in a fresh process, test
documents and texts, and writing records to the real broker."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from tiny_models import CORPUS

from kascade.dataflow.consume import read_all
from kascade.schemas import InputDocument, OutputRecord
from kascade.schemas.engine import Engine, EngineChoice
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import ChunkSettings
from kascade.toolchain.calibrate_config import CalibrateConfig

# Small chunks, so the tiny test models' documents span several of them.
SMALL_CHUNKS = ChunkSettings(max_tokens=64, overlap=8, max_chunks=20)
# A coarse threshold path: the tiny models' heads are never very confident.
TINY_PATH = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def calibration(encoder: Engine | None = None, **settings: Any) -> CalibrateConfig:
    """A calibration's settings on one engine (ONNX Runtime FP32 unless given), so a test
    certifies the same numbers on every host (``auto`` picks bf16 where AMX is)."""
    e = encoder or Engine()
    choice = EngineChoice(backend=e.backend.value, precision=e.precision.value)
    return CalibrateConfig(encoder=choice, **settings)


def kascade_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kascade ARGS`` in a fresh process, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "kascade", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def cluster_addresses(n: int) -> str:
    """``n`` addresses on this host for one cluster: free ports whose successors (each
    process's control port) are free and none of them another's."""
    from kascade.dataflow.ports import free_port

    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if all(abs(p - q) > 1 for q in ports):
            ports.append(p)
    return ";".join(f"127.0.0.1:{p}" for p in ports)


def produce(settings: KafkaSettings, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": settings.brokers})
    for key, value in records:
        producer.produce(settings.input_topic, key=key, value=value)
    assert producer.flush(30) == 0


def documents(n: int) -> list[InputDocument]:
    """Short and long documents: document i repeats corpus sentences i % 9 times."""
    docs = []
    for i in range(n):
        text = " ".join(CORPUS[(i + j) % len(CORPUS)] for j in range(1 + (i % 9) * 4))
        docs.append(InputDocument(id=f"doc-{i}", text=text, lang="en", metadata={"n": i}))
    return docs


def texts(n: int) -> list[str]:
    """Mixed-topic sentences from the corpus, for calibration: up to 2,197 distinct ones
    (three corpus sentences each, in a seeded order), then again from the start.
    Calibration keeps a text and its copies on one side of its fit/certify split, so a
    few texts repeated many times would leave it a few texts to certify on."""
    return [f"{a} and {b} {c}" for a, b, c in (_TRIPLES[i % len(_TRIPLES)] for i in range(n))]


_TRIPLES = random.Random(0).sample(
    [(a, b, c) for a in CORPUS for b in CORPUS for c in CORPUS], len(CORPUS) ** 3
)


def kascade_run(
    settings: KafkaSettings,
    model_dir: Path,
    *extra: str,
    program: tuple[str, ...] = ("-m", "kascade"),
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``kascade run`` on ``settings``'s topics in a fresh process (small chunks), its
    stdout and stderr piped; ``program`` replaces ``-m kascade`` (a test's own flow)."""
    args = [
        sys.executable,
        *program,
        "run",
        "--brokers",
        settings.brokers,
        "--input-topic",
        settings.input_topic,
        "--output-topic",
        settings.output_topic,
        "--dead-letter-topic",
        settings.dead_letter_topic,
        "--model-dir",
        str(model_dir),
        "--chunk-tokens",
        "64",
        "--overlap",
        "8",
        *extra,
    ]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def output_count(settings: KafkaSettings) -> int:
    """Results on the output topic that a read_committed consumer sees now (partition
    watermarks would count the transactions' commit markers too)."""
    return len(read_all(settings, settings.output_topic))


def send(settings: KafkaSettings, docs: list[InputDocument]) -> None:
    """``docs`` to the input topic, each keyed by its id."""
    produce(settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])


def outputs(settings: KafkaSettings) -> list[OutputRecord]:
    """Every record on the output topic, in the order read."""
    return [
        OutputRecord.model_validate_json(v) for _, v in read_all(settings, settings.output_topic)
    ]


def labeled(settings: KafkaSettings) -> dict[str, list[OutputRecord]]:
    """Every result on the output topic, by document id, in the order written."""
    records: dict[str, list[OutputRecord]] = {}
    for r in outputs(settings):
        records.setdefault(r.id, []).append(r)
    return records


def output_ids(settings: KafkaSettings) -> list[str]:
    return [r.id for r in outputs(settings)]


# An opening that is not about the document's topic (a forwarded mail's headers).
BOILERPLATE = "the museum and the old town attract many tourists"
TOPICS = [s for s in CORPUS if s != BOILERPLATE]


def long_documents(
    n: int, *, seed: int, boilerplate_every: int = 4, repeats: tuple[int, int] = (30, 70)
) -> list[InputDocument]:
    """Single-topic documents (one sentence ``repeats`` times: 5 to 12 chunks of
    :data:`SMALL_CHUNKS` by default); every ``boilerplate_every``-th opens with about 3
    chunks of :data:`BOILERPLATE` (its metadata says ``{"boilerplate": true}``)."""
    import random

    rng = random.Random(seed)
    docs = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        text = " ".join([topic] * rng.randint(*repeats))
        opening = i % boilerplate_every == boilerplate_every - 1
        if opening:
            text = " ".join([BOILERPLATE] * 18) + " " + text
        docs.append(
            InputDocument(id=f"long-{seed}-{i}", text=text, metadata={"boilerplate": opening})
        )
    return docs


def word_chunker(room: int = 100, overlap: int = 0) -> Any:
    """A chunker whose tokens are the words ``w`` of a text, ``room`` of them a chunk: a
    text of ``n`` words is ``n`` tokens, so a test says exactly how its chunks fall."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    from kascade.operators.chunking import Chunker

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "w": 3}, "[UNK]"))
    tok.normalizer = normalizers.Replace("\u200b", "")  # zero-width spaces vanish, as in BERT's
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return Chunker.of(tok, room + 2, overlap)


def word_doc(doc_id: str, words: int, lang: str | None = None, text: str | None = None) -> Any:
    """A record of ``words`` tokens for :func:`word_chunker` (or of ``text``), validated."""
    from kascade.operators.items import Origin
    from kascade.operators.validate import Received

    doc = InputDocument(id=doc_id, text=text or " ".join(["w"] * words), lang=lang)
    return Received(doc, Origin(None, doc.model_dump_json().encode()))
