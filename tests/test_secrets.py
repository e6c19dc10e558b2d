"""Secrets stay secret: planted in every place a secret can be given (SASL password,
secret librdkafka properties in ``kafka.extra``, the registry URL's password, the
cluster's control token), none appears in anything kascade prints or writes, and none
is accepted where every user of the host could read it (a flag)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import documents, kascade_cli, kascade_run, produce

from kascade.dataflow.consume import read_all
from kascade.dataflow.ports import free_port
from kascade.operators.registry import RegistryUnavailable, check_registry
from kascade.schemas.events import RegistrySettings
from kascade.schemas.kafka import KafkaSettings
from kascade.schemas.settings import load_settings

PLANTED = "PLANTED-s3cr3t-8d1f"


def planted_env(**more: str) -> dict[str, str]:
    return {
        **os.environ,
        "KASCADE_KAFKA__EXTRA": json.dumps(
            {"sasl.password": PLANTED + "-extra", "ssl.key.password": PLANTED + "-key"}
        ),
        "KASCADE_REGISTRY__BASIC_AUTH_PASSWORD": PLANTED + "-registry",
        "KASCADE_CLUSTER__CONTROL_TOKEN": PLANTED + "-token",
        **more,
    }


def test_settings_never_show_a_secret() -> None:
    settings = load_settings(
        kafka={"extra": {"ssl.key.password": PLANTED, "client.id": "visible"}},
        registry={"url": f"http://alice:{PLANTED}@registry:8081"},
    )
    assert PLANTED not in repr(settings.kafka) and "visible" in repr(settings.kafka)
    assert settings.registry.shown_url == "http://***@registry:8081"


def test_an_unreachable_registry_is_named_without_its_password() -> None:
    url = f"http://alice:{PLANTED}@127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnavailable) as e:
        check_registry(RegistrySettings(url=url, timeout_s=2))
    assert PLANTED not in str(e.value) and "http://***@127.0.0.1:" in str(e.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--kafka.sasl-password", PLANTED],
        ["run", "--registry.basic-auth-password", PLANTED],
        ["topics", "--kafka.extra", f"client.id=a,ssl.key.password={PLANTED}"],
        [
            "sample",
            "--out",
            "x.jsonl",
            "--kafka.extra",
            f"sasl.oauthbearer.client.secret={PLANTED}",
        ],
    ],
)
def test_a_secret_given_as_a_flag_is_refused_in_one_line_without_echoing_it(argv) -> None:
    r = kascade_cli(*argv)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "is not a flag" in line and PLANTED not in line


def test_commands_that_fail_print_no_secret(exported: dict[str, Path]) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    env = planted_env(KASCADE_KAFKA__CONNECT_TIMEOUT_S="2")
    runs = [
        ("run", "--bounded", "--model-dir", str(exported["bert"]), "--brokers", nowhere),
        ("topics", "--brokers", nowhere),
        ("sample", "--out", "/nonexistent/s.jsonl", "--brokers", nowhere),
        ("run", "--bounded", "--model-dir", str(exported["bert"]), "--kafka.extra", "x.y=z"),
    ]
    for argv in runs:
        r = kascade_cli("--log-level", "debug", *argv, env=env)
        assert r.returncode != 0, argv
        assert PLANTED not in r.stdout + r.stderr, (argv, r.stderr)


@pytest.mark.kafka
def test_a_job_with_every_secret_planted_shows_none_in_its_logs_records_or_dead_letters(
    kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    docs = documents(6)
    rows = [(d.id.encode(), d.model_dump_json().encode()) for d in docs]
    produce(kafka_settings, [*rows, (b"bad", b"not json")])
    job = kascade_run(
        kafka_settings,
        exported["bert"],
        "--bounded",
        "--workers",
        "2",
        "--recovery-dir",
        str(tmp_path / "recovery"),
        program=("-m", "kascade", "--log-level", "debug"),
        env=planted_env(),
    )
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    assert "running: kafka" in err  # the logs were written, at debug
    records = read_all(kafka_settings, kafka_settings.output_topic)
    dead = read_all(kafka_settings, kafka_settings.dead_letter_topic)
    assert len(records) == len(docs) and len(dead) == 1
    written = b"".join(k or b"" for k, _ in records + dead) + b"".join(v for _, v in records + dead)
    assert PLANTED.encode() not in written
    assert PLANTED not in out + err
    for f in (tmp_path / "recovery").rglob("*"):
        if f.is_file():
            assert PLANTED.encode() not in f.read_bytes(), f
