"""Settings: flags beat environment beat the config file; bad combinations fail at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kascade.errors import UsageError
from kascade.schemas.settings import load_settings


def test_flags_beat_environment_which_beats_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        'max_text_bytes = 10\n[kafka]\nbrokers = "file:1"\ninput_topic = "file-in"\n'
        'output_topic = "file-out"\n'
    )
    monkeypatch.setenv("KASCADE_KAFKA__INPUT_TOPIC", "env-in")
    monkeypatch.setenv("KASCADE_KAFKA__OUTPUT_TOPIC", "env-out")
    s = load_settings(cfg, kafka={"output_topic": "flag-out"})
    assert (s.kafka.brokers, s.kafka.input_topic, s.kafka.output_topic) == (
        "file:1",
        "env-in",
        "flag-out",
    )
    assert s.max_text_bytes == 10


def test_sasl_without_credentials_is_rejected_when_settings_are_built() -> None:
    with pytest.raises(ValidationError, match="needs sasl_mechanism, sasl_username"):
        load_settings(kafka={"security_protocol": "SASL_SSL"})


def test_the_sasl_password_reaches_librdkafka_but_never_a_repr() -> None:
    s = load_settings(
        kafka={
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "svc",
            "sasl_password": "hunter2",
        }
    )
    assert s.kafka.client_config()["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())


def test_a_missing_config_file_is_an_error_not_silently_ignored(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.toml")


def test_an_unknown_setting_is_rejected() -> None:
    with pytest.raises(ValidationError):
        load_settings(kafka={"brokerz": "x"})


TOKEN = {"control_token": "t0k3n"}


def test_a_job_over_several_hosts_is_refused_without_a_control_token() -> None:
    with pytest.raises(ValidationError, match="needs a control token"):
        load_settings(addresses="h:7000;h:7002", process_id=0)


def test_the_control_token_is_read_from_its_file_and_never_shown(tmp_path) -> None:
    (tmp_path / "token").write_text("from-a-file\n")
    s = load_settings(
        addresses="h:7000;h:7002",
        process_id=0,
        cluster={"control_token_file": str(tmp_path / "token")},
    )
    assert s.cluster.token() == "from-a-file"
    assert "t0k3n" not in repr(
        load_settings(addresses="h:7000;h:7002", process_id=0, cluster=TOKEN)
    )
    (tmp_path / "empty").write_text("  \n")
    empty = s.cluster.model_copy(update={"control_token_file": tmp_path / "empty"})
    with pytest.raises(UsageError, match="is empty"):
        empty.token()


def test_a_cluster_whose_control_port_is_another_process_address_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"control port .* is h:7001, another process"):
        load_settings(addresses="h:7000;h:7001", process_id=0)
    spaced = load_settings(addresses="h:7000;h:7002", process_id=1, cluster=TOKEN)
    assert spaced.hosts == ["h:7000", "h:7002"]
    offset = load_settings(
        addresses="h:7000;h:7001", process_id=1, cluster={"control_port_offset": 2, **TOKEN}
    )
    assert offset.cluster.connect_timeout_s == 120


def test_an_address_without_a_port_is_refused() -> None:
    with pytest.raises(ValidationError, match="'h' is not host:port"):
        load_settings(addresses="h", process_id=0)
