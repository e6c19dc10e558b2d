"""``kascade sample``: calibration text drawn from the live topic itself.

The certified bound holds for chunks drawn like the calibration text; the stream is the
text that matters. This reads the newest records of the input topic through the run's
own input settings (format, field mapping, Schema Registry), exactly as ``kascade run``
decodes them, skips the records a run would dead-letter, and takes ``count`` of them
spread evenly over partitions and, where records carry one, languages (one from each
(partition, language) in turn), so that a busy partition or language does not crowd out
the others. The file is JSON lines ``{"text", "lang"}``, which ``kascade calibrate
--texts FILE --lang-column lang`` reads.

>>> stratified({(0, "de"): ["a", "b", "c"], (1, "en"): ["x"], (0, "fr"): ["p"]}, 4)
['a', 'p', 'x', 'b']
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bytewax.connectors.kafka import KafkaSourceMessage
from confluent_kafka import Consumer, TopicPartition
from kascade.dataflow.kafka_io import check_cluster, client_config
from kascade.operators.formats import Reader
from kascade.operators.registry import check_registry
from kascade.operators.validate import Received, check
from kascade.schemas.files import write_text_atomically
from kascade.schemas.settings import Settings

from kascade.errors import KascadeError

# Records read per record wanted: room for dead letters and for balancing languages.
OVERREAD = 4


class NothingToSample(KascadeError):
    """The topic holds no record a run would classify."""


@dataclass
class Sampled:
    """What ``kascade sample`` took and left."""

    taken: int = 0
    read: int = 0
    by_partition: Counter = field(default_factory=Counter)
    by_language: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # dead-letter reason -> records


def stratified(buckets: dict[tuple[int, str], list], count: int) -> list:
    """Up to ``count`` items, one from each bucket in turn (buckets in sorted order)."""
    queues = {k: list(v) for k, v in sorted(buckets.items())}
    out: list = []
    while len(out) < count and any(queues.values()):
        for q in queues.values():
            if q and len(out) < count:
                out.append(q.pop(0))
    return out


def sample(settings: Settings, count: int, out: Path, timeout_s: float = 30.0) -> Sampled:
    """Write ``count`` texts from the newest records of the input topic to ``out``."""
    k = settings.kafka
    partitions = check_cluster(k, [k.input_topic])[k.input_topic]
    check_registry(settings.registry)
    reader = Reader(settings.input, settings.registry, keep_event=False)
    consumer = Consumer(
        client_config(k)
        | {
            "group.id": f"kascade-sample-{uuid.uuid4()}",
            "enable.auto.commit": "false",
            "isolation.level": "read_committed",  # what a producer committed, only
        }
    )
    report = Sampled()
    buckets: dict[tuple[int, str], list[dict]] = {}
    try:
        partitions = sorted(
            consumer.list_topics(k.input_topic, timeout=10).topics[k.input_topic].partitions
        )
        per_partition = math.ceil(count / len(partitions)) * OVERREAD
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(k.input_topic, p), timeout=10)
            start = max(low, high - per_partition)
            for msg in _read(consumer, k.input_topic, p, start, high, timeout_s):
                report.read += 1
                got = check(msg, max_bytes=settings.max_text_bytes, stage="sample", reader=reader)
                if not isinstance(got, Received):
                    report.skipped[got.reason.value] += 1
                    continue
                row = {"text": got.doc.text} | ({"lang": got.doc.lang} if got.doc.lang else {})
                lang = got.doc.lang or ""
                buckets.setdefault((p, lang), []).append((p, lang, row))
    finally:
        consumer.close()
    rows = stratified(buckets, count)
    if not rows:
        raise NothingToSample(
            f"{k.input_topic} has no record to sample ({report.read} read,"
            f" {sum(report.skipped.values())} of them would be dead letters)"
        )
    report.by_partition.update(p for p, _, _ in rows)
    report.by_language.update(lang for _, lang, _ in rows if lang)
    report.taken = len(rows)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for _, _, r in rows)
    write_text_atomically(out, text, private=True)  # production text: its owner's only
    return report


def _read(consumer: Consumer, topic: str, partition: int, start: int, end: int, timeout_s: float):
    """The records of ``partition`` from offset ``start`` up to ``end``, as Bytewax's
    source hands them to the flow."""
    if start >= end:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    idle = 0.0
    while idle < timeout_s:
        batch = consumer.consume(500, 1.0)
        if not batch:
            idle += 1.0
            continue
        idle = 0.0
        for m in batch:
            if m.error() is not None:
                continue
            yield KafkaSourceMessage(
                key=m.key(),
                value=m.value(),
                topic=m.topic(),
                headers=list(m.headers() or []),
                offset=m.offset(),
                partition=m.partition(),
                timestamp=m.timestamp(),
            )
            if m.offset() >= end - 1:
                return
