"""Records as the bytes Kafka receives, within the size the broker accepts.

A record that would be larger than the broker takes (``max_bytes``, read from the
cluster at start) would fail its delivery and, with it, the job. Instead: an output
record that is too large becomes a dead letter pointing at its input, and a dead letter
that is too large keeps its reason and source but carries only a prefix of the
original value, with its size and sha256 (the value itself stays in the input topic).

Both carry the input record's headers, plus kascade's own (``kascade-label``,
``kascade-model``, ``kascade-degraded``; ``kascade-reason`` on dead letters; on both,
``kascade-origin``: the input record they are the result of).

>>> dead = Origin(None, b"", b"k", [("trace", b"t-1")]).dead_letter(
...     DeadLetterReason.EMPTY, "no value", "validate")
>>> out = dead_letter_value(dead, max_bytes=10_000)
>>> out.key, DeadLetter.model_validate_json(out.value).reason.value, out.headers
(b'k', 'empty', [('trace', b't-1'), ('kascade-reason', b'empty')])
"""

from __future__ import annotations

from kascade.errors import KascadeError
from kascade.operators import metrics
from kascade.operators.formats import (
    HEADER_PREFIX,
    Writer,
    carried,
    kascade_headers,
    origin_header,
)
from kascade.operators.items import Origin, Outgoing
from kascade.operators.reduce import Labeled
from kascade.schemas import DeadLetter, DeadLetterReason, OutputRecord


def output_value(
    labeled: Labeled, writer: Writer, *, max_bytes: int, stage: str
) -> Outgoing | DeadLetter:
    """The document's output record for Kafka, or a dead letter when it cannot be sent."""
    record, envelope = labeled.record, labeled.envelope
    try:
        value = writer.value(record, envelope)
    except KascadeError:
        raise  # the registry stayed unreachable past its tolerance: not this record's fault
    except Exception as e:
        return _unsendable(
            labeled,
            f"output record not serializable: {type(e).__name__}: {e}",
            stage,
            reason=DeadLetterReason.PROCESSING,
        )
    if len(value) > max_bytes:
        return _unsendable(
            labeled,
            f"output record is {len(value)} bytes; the broker accepts {max_bytes}"
            " (metadata passed through from the input is the usual cause)",
            stage,
            value,
        )
    metrics.DOCS_OUT.labels(str(record.degraded).lower()).inc()
    metrics.DOC_LATENCY.observe(record.latency_ms / 1000)
    headers = carried(
        envelope.headers if envelope else (),
        *kascade_headers(record),
        *origin_header(record.source),
    )
    return Outgoing(writer.key(record, envelope), value, headers, writer.topic, record.source)


def _unsendable(
    labeled: Labeled,
    detail: str,
    stage: str,
    value: bytes = b"",
    reason: DeadLetterReason = DeadLetterReason.OVERSIZE,
) -> DeadLetter:
    record: OutputRecord = labeled.record
    envelope = labeled.envelope
    # The input's bytes are long gone (chunks do not carry them): the dead letter holds
    # what could not be sent, keyed and headed like the input.
    key = envelope.key if envelope and envelope.key is not None else record.id.encode()
    output = Origin(record.source, value, key, envelope.headers if envelope else ())
    return output.dead_letter(reason, detail, stage)


def dead_letter_value(dead: DeadLetter, *, max_bytes: int, topic: str | None = None) -> Outgoing:
    """The dead letter for Kafka (``topic``), cut down to fit ``max_bytes``, keyed and
    headed like the original record."""
    metrics.DEAD_LETTERS.labels(dead.reason.value).inc()
    fitted = dead.fitted(max_bytes)
    key = fitted.original_key()
    if key is not None and len(key) > max_bytes // 4:
        key = None  # an outsized key (kept in key_b64's prefix) cannot be the record key
    reason = (f"{HEADER_PREFIX}reason", dead.reason.value.encode())
    return Outgoing(
        key,
        fitted.model_dump_json().encode(),
        carried(fitted.original_headers(), reason, *origin_header(dead.source)),
        topic,
        dead.source,
    )
