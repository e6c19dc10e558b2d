"""kascade watched as operators watch it: a real Prometheus (docker/prometheus-local.sh)
scrapes a running ``kascade run`` with compose's own scrape config, and every query of the
Grafana dashboard (docker/grafana/dashboard.py) is evaluated against it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from helpers import documents, kascade_run, output_ids, produce

from kascade.dataflow.ports import free_port
from kascade.schemas.kafka import KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

DOCKER = Path(__file__).resolve().parents[1] / "docker"
SCRIPT = DOCKER / "prometheus-local.sh"
# Grafana replaces $__rate_interval by a window at least four scrape intervals long.
RATE_WINDOW = "30s"


def dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "kascade_dashboard", DOCKER / "grafana" / "dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def scrape_config(metrics_port: int) -> dict[str, Any]:
    """compose's docker/prometheus.yml, aimed at this host's job, scraping every second."""
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (static,) = job["static_configs"]
    assert job["job_name"] == "kascade" and static["targets"] == ["kascade:9100"]
    static["targets"] = [f"127.0.0.1:{metrics_port}"]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    return config


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(metrics_port: int, tmp_path: Path) -> Iterator[Prometheus]:
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(metrics_port)))
    env = {**os.environ, "KASCADE_PROMETHEUS_PORT": str(free_port())}
    subprocess.run([str(SCRIPT), "start", str(config)], env=env, check=True, timeout=300)
    try:
        yield Prometheus(int(env["KASCADE_PROMETHEUS_PORT"]))
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, timeout=60)


def test_the_committed_dashboard_is_what_its_code_builds() -> None:
    module = dashboard_module()
    committed = json.loads((DOCKER / "grafana" / "dashboards" / "kascade.json").read_text())
    assert committed == module.build(), "run: python docker/grafana/dashboard.py"
    titles = {title for title, _ in module.queries(committed)}
    assert {
        "Throughput",
        "Chunks by stage",
        "Escalation share",
        "Audits",
        "Dead letters by reason",
        "Consumer lag",
        "Produce-to-label latency",
    } <= titles


def test_prometheus_scrapes_a_running_job_and_every_dashboard_query_returns_data(
    kafka_settings: KafkaSettings,
    calibrated: Path,
    prometheus: Prometheus,
    metrics_port: int,
) -> None:
    docs = documents(30)
    produce(
        kafka_settings,
        [(d.id.encode(), d.model_dump_json().encode()) for d in docs] + [(b"bad", b"{not json")],
    )
    job = kascade_run(
        kafka_settings,
        calibrated,
        "--metrics-port",
        str(metrics_port),
        "--cascade",
        "on",
        "--cascade.audit-fraction",
        "0.5",
    )  # tails, as a production job does
    try:
        deadline = time.monotonic() + 240
        while set(output_ids(kafka_settings)) != {d.id for d in docs}:
            assert job.poll() is None, job.communicate()[1]
            assert time.monotonic() < deadline, "the job did not label every document"
            time.sleep(0.5)
        up = 'up{job="kascade"}'
        while not prometheus.query(f"{up} == 1"):
            assert time.monotonic() < deadline, "Prometheus never scraped the job"
            time.sleep(0.5)
        time.sleep(5)  # a few scrapes after the last label, so every rate has two samples
        (labels,) = prometheus.query('kascade_documents_out_total{job="kascade"}')
        assert float(labels["value"][1]) == len(docs)

        module = dashboard_module()
        empty = [
            (title, expr)
            for title, expr in module.queries(module.build())
            if not prometheus.query(expr.replace("$__rate_interval", RATE_WINDOW))
        ]
        assert not empty, f"dashboard queries without data: {empty}"
    finally:
        job.terminate()
        job.communicate(timeout=60)
