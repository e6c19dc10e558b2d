"""Records as the bytes Kafka receives, within the size the broker accepts.

A record that would be larger than the broker takes (``max_bytes``, read from the
cluster at start) would fail its delivery and, with it, the job. Instead: an output
record that is too large becomes a dead letter pointing at its input, and a dead letter
that is too large keeps its reason and source but carries only a prefix of the
original value, with its size and sha256 (the value itself stays in the input topic).

>>> key, value = dead_letter_value(DeadLetter.of(DeadLetterReason.EMPTY, "no value",
...     stage="s", raw=b"", key=b"k", source=None, timestamp_ms=None), max_bytes=10_000)
>>> key, DeadLetter.model_validate_json(value).reason.value
(b'k', 'empty')
"""

from __future__ import annotations

from kascade.operators import metrics
from kascade.schemas import DeadLetter, DeadLetterReason, OutputRecord

KeyValue = tuple[bytes | None, bytes]


def output_value(record: OutputRecord, *, max_bytes: int, stage: str) -> KeyValue | DeadLetter:
    """The output record's key and JSON, or a dead letter when it cannot be sent."""
    try:
        value = record.model_dump_json().encode()
    except Exception as e:  # pragma: no cover - inputs are validated; belt and braces
        return _unsendable(
            record, f"output record not serializable: {type(e).__name__}: {e}", stage
        )
    if len(value) > max_bytes:
        return _unsendable(
            record,
            f"output record is {len(value)} bytes; the broker accepts {max_bytes}"
            " (metadata passed through from the input is the usual cause)",
            stage,
            value,
        )
    metrics.DOCS_OUT.labels(str(record.degraded).lower()).inc()
    metrics.DOC_LATENCY.observe(record.latency_ms / 1000)
    return record.id.encode(), value


def _unsendable(record: OutputRecord, detail: str, stage: str, value: bytes = b"") -> DeadLetter:
    return DeadLetter.of(
        DeadLetterReason.OVERSIZE,
        detail,
        stage=stage,
        raw=value,
        key=record.id.encode(),
        source=record.source,
        timestamp_ms=None,
    )


def dead_letter_value(dead: DeadLetter, *, max_bytes: int) -> KeyValue:
    """The dead letter's key and JSON, cut down to fit ``max_bytes``."""
    metrics.DEAD_LETTERS.labels(dead.reason.value).inc()
    fitted = dead.fitted(max_bytes)
    key = fitted.original_key()
    if key is not None and len(key) > max_bytes // 4:
        key = None  # an outsized key (kept in key_b64's prefix) cannot be the record key
    return key, fitted.model_dump_json().encode()
