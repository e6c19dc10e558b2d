"""The command line: misuse and unreachable brokers give one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import kascade_cli

from kascade.dataflow.ports import free_port


def test_an_unknown_subcommand_prints_one_line_and_exits_2() -> None:
    r = kascade_cli("frobnicate")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "invalid choice" in r.stderr


def test_a_bad_flag_value_prints_one_line_and_exits_2() -> None:
    r = kascade_cli("topics", "--partitions", "many")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_invalid_setting_from_the_environment_is_one_line_and_exit_2() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kascade", "run", "--bounded"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KASCADE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "PATH": ""},
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kascade: invalid settings: kafka: SASL_SSL needs sasl_mechanism,"
        " sasl_username, sasl_password"
    ]


def test_running_against_an_unreachable_broker_fails_fast_with_one_line(exported) -> None:
    start = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kascade",
            "run",
            "--bounded",
            "--model-dir",
            str(exported["bert"]),
            "--brokers",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KASCADE_KAFKA__CONNECT_TIMEOUT_S": "2", "PATH": ""},
    )
    assert r.returncode == 1
    assert time.monotonic() - start < 30
    assert r.stderr.strip().splitlines()[-1].startswith("kascade: cannot reach Kafka at 127.0.0.1")
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.kafka
def test_the_topics_command_creates_missing_topics_and_reports_existing_ones(
    kafka_bootstrap: str, topic_factory
) -> None:
    existing = topic_factory("existing")
    args = (
        "topics",
        "--brokers",
        kafka_bootstrap,
        "--input-topic",
        existing,
        "--output-topic",
        f"{existing}-out",
        "--dead-letter-topic",
        f"{existing}-dlq",
    )
    r = kascade_cli(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{existing}: exists",
        f"{existing}-out: created",
        f"{existing}-dlq: created",
    ]
