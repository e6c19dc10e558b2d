"""``kascade demo``: the whole job on its embedded defaults, printed as tables.

Starts a local broker unless one is given, builds (once) or takes the default model,
creates fresh topics for this run, sends the bundled sample documents plus a few
malformed records, runs the classifying flow until the input is drained, and prints
what reached the output and dead-letter topics.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from kascade.dataflow.broker import client_config
from kascade.dataflow.consume import read_all
from kascade.dataflow.flow import build_flow
from kascade.dataflow.runner import run
from kascade.demo.local_broker import ensure_local_broker, fresh_topics
from kascade.errors import KascadeError
from kascade.schemas import DeadLetter, OutputRecord, StopReason
from kascade.schemas.cascade import CASCADE_FILE, CascadeSpec
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.manifest import MANIFEST
from kascade.schemas.settings import Settings

HERE = Path(__file__).parent
SAMPLES = HERE / "documents.jsonl"
TRAIN = HERE / "train.tsv"
UNLABELED = HERE / "unlabeled.txt"


def model_cache() -> Path:
    """Where built demo models are kept: ``$KASCADE_CACHE_DIR``, else the user's cache."""
    explicit = os.environ.get("KASCADE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kascade" / "models"


# Records a real producer gets wrong, to show where they end up.
MALFORMED: list[bytes] = [
    b"this is not JSON",
    b'{"id": "bad-utf8", "text": "caf\xe9"}',
    b'{"text": "a document without an id"}',
    b'{"id": "", "text": "an empty id"}',
]


def _send(kafka: KafkaSettings, topic: str, values: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer(client_config(kafka))
    for key, value in values:
        producer.produce(topic, key=key, value=value)
    if producer.flush(30):
        raise KascadeError(f"could not deliver the demo records to {topic}")


def demo_model() -> Path:
    """The demo's model directory, built by the toolchain on first use and cached."""
    from kascade.toolchain.demo_model import ensure_demo_model

    return ensure_demo_model(model_cache(), TRAIN, UNLABELED)


def save_model(dest: Path) -> int:
    """Put the demo model at ``dest`` (a container's model volume); kept if already there."""
    if (dest / MANIFEST).is_file():
        print(f"{dest} already holds a model; kept")
        return 0
    src = demo_model()
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dest.exists():  # an empty mount point: fill it rather than replace it
        for f in tmp.iterdir():
            os.replace(f, dest / f.name)
        tmp.rmdir()
    else:
        os.rename(tmp, dest)
    print(f"wrote the demo model to {dest}")
    return 0


def _chunking_of(model_dir: Path) -> dict:
    """The chunking a model's cascade was certified on, so the demo shows it at work."""
    path = model_dir / CASCADE_FILE
    if not path.is_file():
        return {}
    c = CascadeSpec.model_validate_json(path.read_text()).chunking
    return {"max_tokens": c.max_tokens, "overlap": c.overlap}


def _chunks_read(rec: OutputRecord) -> int:
    return (rec.chunks.total or 0) if rec.reading is None else rec.reading.chunks_read


def settled_cheaply(rec: OutputRecord) -> int:
    c = rec.chunks
    return c.settled_s0 + c.settled_s1 + c.skipped


def _read(rec: OutputRecord) -> str:
    """Chunks read, and ``(stop)`` where the certified document stop ended the read."""
    if rec.reading is None:
        return str(rec.chunks.total)
    stop = " (stop)" if rec.reading.stopped is StopReason.CERTAIN else ""
    return f"{rec.reading.chunks_read}{stop}"


NOT_A_TERMINAL_WIDTH = 160


def demo(*, brokers: str | None, port: int, keep_broker: bool, model_dir: Path | None) -> int:
    # Piped into a file or a CI log, rich would fit the tables to 80 columns and wrap
    # every row over several lines; there, one row stays one line.
    console = Console() if sys.stdout.isatty() else Console(width=NOT_A_TERMINAL_WIDTH)
    model_dir = model_dir or demo_model()
    broker = None
    if brokers is None:
        broker = ensure_local_broker(port)
        brokers = broker.bootstrap
    try:
        kafka = fresh_topics(brokers, "kascade-demo")
        settings = Settings(kafka=kafka, model_dir=model_dir, chunking=_chunking_of(model_dir))
        docs = [line.encode() for line in SAMPLES.read_text(encoding="utf-8").splitlines() if line]
        records = [(json.loads(d)["id"].encode(), d) for d in docs]
        _send(kafka, kafka.input_topic, records + [(None, m) for m in MALFORMED])
        console.print(
            f"sent {len(docs)} documents and {len(MALFORMED)} malformed records to "
            f"[bold]{kafka.input_topic}[/] on {brokers}"
        )
        run(settings, build_flow)

        texts = {json.loads(d)["id"]: json.loads(d)["text"] for d in docs}
        out = [OutputRecord.model_validate_json(v) for _, v in read_all(kafka, kafka.output_topic)]
        table = Table(title=f"{kafka.output_topic}: {len(out)} records ({model_dir.name})")
        numeric = ("score", "chunks", "read", "cheap", "ms")
        for col in ("id", "label", "score", "chunks", "read", "cheap", "ms", "text"):
            table.add_column(col, justify="right" if col in numeric else "left")
        for rec in sorted(out, key=lambda r: r.id):
            text = texts.get(rec.id, "").strip()
            table.add_row(
                rec.id,
                rec.label or "(no text)",
                f"{rec.score:.2f}",
                "-" if rec.chunks.total is None else str(rec.chunks.total),
                _read(rec),
                str(settled_cheaply(rec)),
                f"{rec.latency_ms:.0f}",
                text[:40] + ("…" if len(text) > 40 else ""),
            )
        console.print(table)
        read = sum(_chunks_read(r) for r in out)
        cheap = sum(settled_cheaply(r) for r in out)
        stopped = [
            r for r in out if r.reading is not None and r.reading.stopped is StopReason.CERTAIN
        ]
        console.print(
            f"cascade {out[0].cascade.value if out else 'off'}: {cheap} of {read} chunks read"
            " settled without the full model (cheap = S0 + S1 + skipped); "
            f"{len(stopped)} documents stopped early, the certified document stop having known"
            " the label, their rest never tokenized (read: chunks read, (stop) where the stop"
            " ended the read; chunks: of the whole text, - where it was not tokenized to its end)"
        )

        dead = [
            DeadLetter.model_validate_json(v) for _, v in read_all(kafka, kafka.dead_letter_topic)
        ]
        table = Table(title=f"{kafka.dead_letter_topic}: {len(dead)} records")
        table.add_column("reason")
        table.add_column("detail")
        table.add_column("original bytes")
        for d in dead:
            table.add_row(d.reason.value, d.detail[:60], repr(d.original())[:40])
        console.print(table)
        return 0
    finally:
        if broker is not None and not keep_broker:
            broker.stop()
