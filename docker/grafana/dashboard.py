"""kascade's Grafana dashboard, as code: ``python docker/grafana/dashboard.py`` writes
``docker/grafana/dashboards/kascade.json``, which compose's Grafana provisions.

Every query is PromQL over the metrics ``kascade run`` serves (README, "Watching it");
``tests/test_prometheus.py`` evaluates each one against a real Prometheus scraping a
running job and fails on a query that returns nothing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).resolve().parent / "dashboards" / "kascade.json"
DATASOURCE_UID = "prometheus"  # provisioning/datasources/prometheus.yaml
WINDOW = "$__rate_interval"


def rate(metric: str, by: str | None = None) -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}[{WINDOW}]))"


def quantile(q: float) -> str:
    return (
        f"histogram_quantile({q}, sum by (le)"
        f" (rate(kascade_document_latency_seconds_bucket[{WINDOW}])))"
    )


@dataclass(frozen=True)
class Graph:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    description: str


ROWS: tuple[tuple[str, tuple[Graph, ...]], ...] = (
    (
        "Flow",
        (
            Graph(
                "Throughput",
                "reqps",
                (
                    (rate("kascade_documents_in_total"), "documents in"),
                    (
                        rate("kascade_documents_out_total", "degraded"),
                        "labels out (degraded={{degraded}})",
                    ),
                ),
                "Documents read and labels written per second.",
            ),
            Graph(
                "Consumer lag",
                "short",
                (
                    (
                        "sum by (topic, partition) (bytewax_kafka_consumer_lag)",
                        "{{topic}}/{{partition}}",
                    ),
                ),
                "Records on the input topic not yet read, per partition.",
            ),
            Graph(
                "Produce-to-label latency",
                "s",
                tuple((quantile(q), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)),
                "From the input record's Kafka timestamp to its label being emitted.",
            ),
        ),
    ),
    (
        "Cascade",
        (
            Graph(
                "Chunks by stage",
                "short",
                (
                    (rate("kascade_chunks_settled_total", "stage"), "settled by {{stage}}"),
                    (rate("kascade_chunks_full_model_total"), "full model"),
                ),
                "Chunks per second settled by each cheap stage, and sent to the full model.",
            ),
            Graph(
                "Escalation share",
                "percentunit",
                (
                    (
                        rate("kascade_chunks_full_model_total")
                        + " / "
                        + rate("kascade_chunks_total"),
                        "sent to the full model",
                    ),
                ),
                "Share of chunks the cascade could not settle.",
            ),
            Graph(
                "Audits",
                "short",
                ((rate("kascade_audits_total", "agree"), "agree={{agree}}"),),
                "Settled chunks re-checked by the full model, by whether it agreed.",
            ),
            Graph(
                "Certified bound",
                "short",
                (
                    (
                        'max by (lang) (kascade_cascade_guarantee{state="violated"})',
                        "violated: {{lang}}",
                    ),
                ),
                "1 where the live test of the audits rejected the certified bound (all:"
                " every audit; otherwise per language).",
            ),
        ),
    ),
    (
        "Health",
        (
            Graph(
                "Dead letters by reason",
                "short",
                ((rate("kascade_dead_letters_total", "reason"), "{{reason}}"),),
                "Records sent to the dead-letter topic per second, by reason.",
            ),
            Graph(
                "Worker restarts",
                "short",
                (("max(kascade_worker_restarts)", "restarts"),),
                "Times the supervisor restarted the workers from the last snapshot.",
            ),
            Graph(
                "Tokens read and skipped",
                "short",
                ((rate("kascade_tokens_total", "reading"), "{{reading}}"),),
                "Tokens of labeled documents per second: read, or skipped by a certified stop.",
            ),
        ),
    ),
)


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    board = (
        Dashboard("kascade")
        .uid("kascade")
        .tags(["kascade", "generated"])
        .refresh("30s")
        .time("now-1h", "now")
    )
    for row, graphs in ROWS:
        board = board.with_row(Row(row))
        for g in graphs:
            panel = Panel().title(g.title).description(g.description).unit(g.unit).height(8).span(8)
            for i, (expr, legend) in enumerate(g.queries):
                query = Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
                panel = panel.datasource(source).with_target(query)
            board = board.with_panel(panel)
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of a dashboard's JSON model."""
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        if p.get("type") != "row"
        for t in p.get("targets", [])
    ]


def write(path: Path = OUT) -> None:
    text = json.dumps(build(), indent=2, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kascade-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
    print(f"wrote {sys.argv[1] if len(sys.argv) > 1 else OUT}")
