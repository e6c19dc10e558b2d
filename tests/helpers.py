"""Helpers shared by the test modules: the command line in a fresh process, test
documents and texts, and writing records to the real broker."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka import Producer
from kascade.schemas import InputDocument
from kascade.schemas.settings import ChunkSettings, KafkaSettings
from tiny_models import CORPUS

# Small chunks, so the tiny test models' documents span several of them.
SMALL_CHUNKS = ChunkSettings(max_tokens=64, overlap=8, max_chunks=20)
# A coarse threshold path: the tiny models' heads are never very confident.
TINY_PATH = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


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
    """Mixed-topic sentences from the corpus, for calibration."""
    return [
        f"{CORPUS[i % 13]} and {CORPUS[(i * 7 + 3) % 13]} {CORPUS[(i * 5) % 13]}" for i in range(n)
    ]
