"""The distribution: one import package, a runtime install without the toolchain, and
the container's exact command run from such an install against the real broker."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest
from helpers import documents, produce

from kascade.dataflow.consume import read_all
from kascade.dataflow.ports import free_port
from kascade.schemas import OutputRecord
from kascade.schemas.kafka import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
TOOLCHAIN_ONLY = ("torch", "transformers", "sklearn", "scipy", "onnx", "onnxscript")


@pytest.fixture(scope="session")
def wheel_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, and what its build printed (as a user running pip sees it)."""
    out = tmp_path_factory.mktemp("wheel")
    # From a clean copy: setuptools builds in ./build, where files of an earlier layout
    # would otherwise ride along into the wheel.
    src = tmp_path_factory.mktemp("source") / "kascade"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv", ".cache", "build", "runs", "*.egg-info"),
    )
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (built,) = out.glob("kascade-*.whl")
    return built, r.stdout + r.stderr


@pytest.fixture(scope="session")
def wheel(wheel_build: tuple[Path, str]) -> Path:
    return wheel_build[0]


def test_building_the_package_prints_no_warning(wheel_build: tuple[Path, str]) -> None:
    _, log = wheel_build
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings)


def test_the_wheel_holds_every_module_of_every_folder(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for folder in ("schemas", "operators", "dataflow", "toolchain"):
        for module in (ROOT / folder).glob("*.py"):
            assert f"kascade/{folder}/{module.name}" in names
    assert "kascade/py.typed" in names


FOLDERS = ("schemas", "operators", "dataflow", "toolchain")


def test_each_subpackage_is_a_link_to_its_top_level_folder() -> None:
    for folder in FOLDERS:
        link = ROOT / "kascade" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder
    import kascade.operators.cascade

    assert Path(kascade.operators.cascade.__file__).resolve() == ROOT / "operators" / "cascade.py"


def test_the_editable_install_is_a_path_entry_without_an_import_hook() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    (pth,) = site.glob("__editable__.kascade-*.pth")
    assert pth.read_text().split() == [str(ROOT)]


def test_a_type_checker_outside_the_tree_resolves_kascade_modules_from_the_install(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from kascade.operators.verdicts import Verdict\n"
        "reveal_type(Verdict.settled_probs)\n"
        "from kascade.dataflow.flow import not_there\n"
    )
    r = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--config-file", "", "--follow-imports", "silent"),
            *("--cache-dir", str(tmp_path / "cache"), str(probe)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "kascade.operators.verdicts.Verdict) -> numpy.ndarray" in r.stdout, r.stdout
    assert 'Module "kascade.dataflow.flow" has no attribute "not_there"' in r.stdout
    assert "missing library stubs" not in r.stdout


@pytest.fixture(scope="session")
def runtime_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv installed as the image is: the runtime lock, then the wheel
    without extras or further resolution."""
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    lock = ROOT / "requirements" / "runtime.txt"
    for args in (["--require-hashes", "-r", str(lock)], ["--no-deps", str(wheel)]):
        subprocess.run([*pip, *args], check=True, capture_output=True, timeout=900)
    return venv


def test_the_wheel_installs_one_top_level_package_kascade(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        names = z.namelist()
    assert tops == {"kascade"}
    for part in ("schemas", "operators", "dataflow", "toolchain", "demo"):
        assert f"kascade/{part}/__init__.py" in names
    assert "kascade/schemas/json/output.schema.json" in names
    assert "kascade/demo/documents.jsonl" in names
    assert "kascade/demo/unlabeled.txt" in names


def test_the_runtime_install_has_no_toolchain_and_the_runtime_never_imports_it(
    runtime_venv: Path, tmp_path: Path
) -> None:
    probe = (
        "import importlib.util, json, sys\n"
        "import kascade.cli, kascade.dataflow.flow, kascade.dataflow.runner\n"
        f"mods = {TOOLCHAIN_ONLY!r}\n"
        "print(json.dumps({'installed': [m for m in mods if importlib.util.find_spec(m)],"
        " 'imported': [m for m in mods if m in sys.modules]}))\n"
    )
    r = subprocess.run(
        [str(runtime_venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout, whose folders would shadow the installed package
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"installed": [], "imported": []}


def test_a_toolchain_command_without_the_extra_says_in_one_line_what_to_install(
    runtime_venv: Path, tmp_path: Path
) -> None:
    data = tmp_path / "train.tsv"
    data.write_text("text\tlabel\nrain\tweather\n")
    kascade = str(runtime_venv / "bin" / "kascade")
    r = subprocess.run(
        [kascade, "train", "--model", "x", "--data", str(data), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kascade[export]'" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def image(target: str = "runtime") -> tuple[list[str], dict[str, str], list[str]]:
    """The command, environment and health check a Dockerfile stage runs."""
    text = (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    stage = text.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", stage, re.M).group(1))
    env = dict(kv.split("=", 1) for kv in shlex.split(re.search(r"^ENV (.*)$", stage, re.M)[1]))
    health = json.loads(re.search(r"HEALTHCHECK .*CMD (\[.*\])$", stage, re.M).group(1))
    return entry + cmd, env, health


def test_the_image_runs_as_a_non_root_user_from_the_wheel() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    runtime = text.split(" AS runtime\n", 1)[1]
    assert re.search(r"^USER kascade$", runtime, re.M)
    assert "pip install --no-cache-dir --no-deps /wheels/kascade-" in runtime
    assert "COPY schemas" not in text  # the wheel, not the folders, is what installs


@pytest.mark.kafka
def test_the_image_command_classifies_documents_and_answers_its_health_check(
    runtime_venv: Path, kafka_settings: KafkaSettings, exported: dict[str, Path], tmp_path: Path
) -> None:
    """What the container does, from a runtime-only install: its command, its
    environment (topics, broker and model directory pointed at this test's), its check."""
    command, env, health = image()
    docs = documents(12)
    produce(kafka_settings, [(d.id.encode(), d.model_dump_json().encode()) for d in docs])
    port = free_port()
    env |= {
        "PATH": f"{runtime_venv / 'bin'}:{os.environ.get('PATH', '')}",
        "KASCADE_MODEL_DIR": str(exported["bert"]),
        "KASCADE_KAFKA__BROKERS": kafka_settings.brokers,
        "KASCADE_KAFKA__INPUT_TOPIC": kafka_settings.input_topic,
        "KASCADE_KAFKA__OUTPUT_TOPIC": kafka_settings.output_topic,
        "KASCADE_KAFKA__DEAD_LETTER_TOPIC": kafka_settings.dead_letter_topic,
        "KASCADE_METRICS_PORT": str(port),
        "KASCADE_METRICS_HOST": "127.0.0.1",
    }
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        out = read_all(kafka_settings, kafka_settings.output_topic, expect=len(docs), timeout_s=180)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        check = subprocess.run(health, env=env, capture_output=True, timeout=30, cwd=tmp_path)
        assert check.returncode == 0, check.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"kascade_documents_out_total" in r.read()
    finally:
        proc.terminate()
        proc.wait(30)
    labels = [OutputRecord.model_validate_json(v) for _, v in out]
    assert sorted(r.id for r in labels) == sorted(d.id for d in docs)
    assert all(r.label is not None for r in labels)


def test_compose_runs_broker_topics_model_pipeline_prometheus_and_grafana() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "topics", "model", "kascade", "prometheus", "grafana"}
    _, env, _ = image()
    pipeline = services["kascade"]
    assert pipeline["build"]["target"] == "runtime"
    assert pipeline["environment"]["KASCADE_MODEL_DIR"] == env["KASCADE_MODEL_DIR"]
    assert any(v.startswith("models:/models") for v in pipeline["volumes"])
    assert any(v.startswith("models:/models") for v in services["model"]["volumes"])
    assert services["model"]["command"] == ["demo", "--save-model", env["KASCADE_MODEL_DIR"]]
    for need in ("topics", "model"):
        assert pipeline["depends_on"][need]["condition"] == "service_completed_successfully"
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"kascade:{pipeline['environment']['KASCADE_METRICS_PORT']}"]
    # Grafana gets compose's Prometheus under the uid the dashboard's queries name.
    grafana = services["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    provisioning = (
        ROOT
        / "docker"
        / mounts["./grafana/provisioning"].replace(
            "/etc/grafana/provisioning", "grafana/provisioning"
        )
    )
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "kascade.yaml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == mounts["./grafana/dashboards"]
    board = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "kascade.json").read_text())
    uids = {p["datasource"]["uid"] for p in board["panels"] if p.get("type") != "row"}
    assert uids == {source["uid"]}
