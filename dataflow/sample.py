"""``kascade sample``: calibration text drawn from the live topic itself.

The certified bound holds for chunks drawn like the calibration text; the stream is the
text that matters. This reads the newest records of the input topic through the run's
own input settings (format, field mapping, Schema Registry), exactly as ``kascade run``
decodes them, skips the records a run would dead-letter, and takes ``count`` of them
spread evenly over partitions and, where records carry one, languages (one from each
(partition, language) in turn), so that a busy partition or language does not crowd out
the others. The file is JSON lines ``{"text", "lang"}``, which ``kascade calibrate
--texts FILE --lang-column lang`` reads.

Memory stays bounded whatever the count and the record sizes: the first pass keeps only
where the chosen records are (partition, offset), at most ``2 x count`` of them; the
second reads those records again and streams their text into the file.

>>> stratified({(0, "de"): ["a", "b", "c"], (1, "en"): ["x"], (0, "fr"): ["p"]}, 4)
['a', 'p', 'x', 'b']
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bytewax.connectors.kafka import KafkaSourceMessage
from confluent_kafka import Consumer, TopicPartition

from kascade.dataflow.broker import DENIED, check_cluster, client_config, not_authorized
from kascade.dataflow.kafka_io import headers_of
from kascade.errors import KascadeError
from kascade.operators.formats import Reader
from kascade.operators.registry import check_registry
from kascade.operators.validate import Received, check
from kascade.schemas import DeadLetter
from kascade.schemas.files import atomic_writer
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import Settings

# Records read per record wanted: room for dead letters and for balancing languages.
OVERREAD = 4
# Bytes of records in hand at once: librdkafka's prefetch queue and one batch of
# records of the largest readable size.
IN_HAND_BYTES = 16 << 20


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
    blank: int = 0  # valid records whose text is only whitespace: nothing to calibrate on


def stratified(buckets: dict[Any, list], count: int) -> list:
    """Up to ``count`` items, one from each bucket in turn (buckets in sorted order)."""
    queues = [iter(v) for _, v in sorted(buckets.items())]
    out: list = []
    while queues and len(out) < count:
        alive = []
        for q in queues:
            item = next(q, _END)
            if item is not _END and len(out) < count:
                out.append(item)
                alive.append(q)
        queues = alive
    return out


_END = object()


class Places:
    """Where the records :func:`stratified` would choose lie, kept to ``2 x count``.

    An item :func:`stratified` leaves out now is left out for good: later items rank
    after it or take a place ahead of it, never move it forward. So each time the kept
    places pass ``2 x count`` they are cut to the ``count`` it would choose, and the
    final choice is the one over every record read.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.buckets: dict[tuple[int, str], list[tuple[int, int]]] = {}
        self.kept = 0

    def add(self, partition: int, lang: str, offset: int) -> None:
        self.buckets.setdefault((partition, lang), []).append((partition, offset))
        self.kept += 1
        if self.kept > 2 * self.count:
            chosen = set(stratified(self.buckets, self.count))
            self.buckets = {
                key: kept
                for key, places in self.buckets.items()
                if (kept := [p for p in places if p in chosen])
            }
            self.kept = len(chosen)

    def chosen(self) -> dict[int, set[int]]:
        """partition -> offsets of the chosen records."""
        out: dict[int, set[int]] = {}
        for p, offset in stratified(self.buckets, self.count):
            out.setdefault(p, set()).add(offset)
        return out


def sample(settings: Settings, count: int, out: Path, timeout_s: float = 30.0) -> Sampled:
    """Write ``count`` texts from the newest records of the input topic to ``out``."""
    k = settings.kafka
    check_cluster(k, [k.input_topic])
    check_registry(settings.registry)
    reader = Reader(settings.input, settings.registry, keep_event=False)
    consumer = Consumer(
        client_config(k)
        | {
            "group.id": f"kascade-sample-{uuid.uuid4()}",
            "enable.auto.commit": "false",
            "isolation.level": "read_committed",  # what a producer committed, only
            "queued.max.messages.kbytes": IN_HAND_BYTES >> 10,
        }
    )
    batch = max(1, min(500, IN_HAND_BYTES // settings.max_text_bytes))
    report = Sampled()

    def decoded(msg: KafkaSourceMessage) -> Received | DeadLetter:
        return check(msg, max_bytes=settings.max_text_bytes, stage="sample", reader=reader)

    try:
        passes = _Passes(consumer, k, batch, timeout_s, decoded, report)
        chosen = passes.survey(count).chosen()
        if not chosen:
            raise NothingToSample(
                f"{k.input_topic} has no record to sample ({report.read} read,"
                f" {sum(report.skipped.values())} of them would be dead letters"
                + (f", {report.blank} blank" if report.blank else "")
                + ")"
            )
        passes.write(chosen, out)
    finally:
        consumer.close()
    return report


@dataclass
class _Passes:
    """The two passes over the input topic, with what they share."""

    consumer: Consumer
    kafka: KafkaSettings
    batch: int  # records per poll
    timeout_s: float
    decode: Callable[[KafkaSourceMessage], Received | DeadLetter]
    report: Sampled

    def survey(self, count: int) -> Places:
        """The newest records of each partition, counted, and the places (partition,
        language, offset) to take ``count`` from."""
        topic, report = self.kafka.input_topic, self.report
        places = Places(count)
        partitions = sorted(self.consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        per_partition = math.ceil(count / len(partitions)) * OVERREAD
        for p in partitions:
            low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for msg in self._read(p, max(low, high - per_partition), high):
                report.read += 1
                got = self.decode(msg)
                if not isinstance(got, Received):
                    report.skipped[got.reason.value] += 1
                elif not got.doc.text.strip():
                    report.blank += 1
                elif msg.offset is not None:  # a consumed record always has one
                    places.add(p, got.doc.lang or "", msg.offset)
        return places

    def write(self, chosen: dict[int, set[int]], out: Path) -> None:
        """The chosen records, read again and written to ``out``."""
        report = self.report
        # production text: its owner's only
        with atomic_writer(out, private=True) as f:
            for p, wanted in sorted(chosen.items()):
                for msg in self._read(p, min(wanted), max(wanted) + 1):
                    again = self.decode(msg) if msg.offset in wanted else None
                    if not isinstance(again, Received):
                        continue  # not chosen (or, read again, no longer what it was)
                    doc = again.doc
                    row = {"text": doc.text} | ({"lang": doc.lang} if doc.lang else {})
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    report.taken += 1
                    report.by_partition[p] += 1
                    if doc.lang:
                        report.by_language[doc.lang] += 1

    def _read(self, partition: int, start: int, end: int) -> Iterator[KafkaSourceMessage]:
        """The records of ``partition`` from offset ``start`` up to ``end``, as Bytewax's
        source hands them to the flow."""
        if start >= end:
            return
        self.consumer.assign([TopicPartition(self.kafka.input_topic, partition, start)])
        idle = 0.0
        while idle < self.timeout_s:
            got = self.consumer.consume(self.batch, 1.0)
            if not got:
                idle += 1.0
                continue
            idle = 0.0
            for m in got:
                if (error := m.error()) is not None:
                    if error.code() in DENIED:  # may describe the topic, may not read it
                        raise not_authorized(self.kafka, [self.kafka.input_topic], "read")
                    continue
                offset = m.offset()
                yield KafkaSourceMessage(
                    key=m.key(),
                    value=m.value(),
                    topic=m.topic(),
                    # as Bytewax's own source passes them: a header may have no value
                    headers=headers_of(m),  # type: ignore[arg-type]  # annotated bytes only
                    offset=offset,
                    partition=m.partition(),
                    timestamp=m.timestamp(),
                )
                if offset is not None and offset >= end - 1:
                    return
