"""Prometheus metrics of the flow, shared by every operator in a worker process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

DOCS_IN = Counter("kascade_documents_in_total", "Valid documents read from Kafka")
DOCS_OUT = Counter("kascade_documents_out_total", "Document labels emitted", ["degraded"])
CHUNKS_IN = Counter("kascade_chunks_total", "Chunks made from documents")
CHUNKS_FULL_MODEL = Counter("kascade_chunks_full_model_total", "Chunks sent to the full model")
CHUNK_FAILURES = Counter("kascade_chunk_failures_total", "Chunks whose full-model call failed")
CHEAP_FAILURES = Counter(
    "kascade_cheap_stage_failures_total", "Chunks the cascade's cheap stages failed on"
)
DEAD_LETTERS = Counter(
    "kascade_dead_letters_total", "Records sent to the dead-letter topic", ["reason"]
)
STAGE_SECONDS = Histogram(
    "kascade_stage_seconds", "Time spent per item in a stage", ["stage"], buckets=_LATENCY_BUCKETS
)
DOC_LATENCY = Histogram(
    "kascade_document_latency_seconds",
    "From the input record's Kafka timestamp to the label being emitted",
    buckets=_LATENCY_BUCKETS,
)
CHUNKS_SETTLED = Counter(
    "kascade_chunks_settled_total", "Chunks settled without the full model", ["stage"]
)
TOKENS = Counter(
    "kascade_tokens_total",
    "Tokens of labeled documents: read, or skipped by a certified document stop (counted"
    " where the text was tokenized to its end; a stop tokenizes only what it reads)",
    ["reading"],
)
CHARS = Counter(
    "kascade_text_chars_total",
    "Characters of labeled documents: read, or skipped by a certified document stop",
    ["reading"],
)
AUDITS = Counter("kascade_audits_total", "Settled chunks re-checked by the full model", ["agree"])
GUARANTEE = Gauge(
    "kascade_cascade_guarantee",
    "1 for the state the live test of the certified bound is in (holding, violated), per"
    " language and for all audits (lang=all)",
    ["lang", "state"],
)
STOP_AUDITS = Counter(
    "kascade_stop_audits_total",
    "Documents the certified stop ended early that the full model also read to their end",
    ["agree"],
)
STOP_GUARANTEE = Gauge(
    "kascade_document_stop_guarantee",
    "1 for the state the live test of the certified document stop is in (holding, violated)",
    ["state"],
)
REPLAYS_DROPPED = Counter(
    "kascade_replayed_results_dropped_total",
    "Results a resumed run computed again and did not write: they were committed before"
    " the crash (delivery=exactly_once)",
)
RESTARTS = Gauge(
    "kascade_worker_restarts",
    "Times the supervisor restarted this run's worker processes from the last snapshot",
)


def totals() -> dict[str, int]:
    """What this process labeled and dead-lettered, for the line ``kascade run`` prints
    when it stops: ``labeled`` (of them ``degraded``) and ``dead_letters``.

    >>> sorted(totals())
    ['dead_letters', 'degraded', 'labeled']
    """
    counts = {"labeled": 0, "degraded": 0, "dead_letters": 0}
    for metric in (*DOCS_OUT.collect(), *DEAD_LETTERS.collect()):
        for sample in metric.samples:
            if not sample.name.endswith("_total"):
                continue  # the _created timestamps
            n = int(sample.value)
            if metric.name == "kascade_dead_letters":
                counts["dead_letters"] += n
            else:
                counts["labeled"] += n
                counts["degraded"] += n if sample.labels.get("degraded") == "true" else 0
    return counts
