"""The locked dependencies: every requirement of pyproject.toml pinned with hashes, the
three locks agreeing on versions, every install path reading them, and the audit that
fails on a known vulnerability and never passes having checked nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
# which extras each lock holds
EXTRAS = {"runtime": (), "toolchain": ("export",), "dev": ("dev", "export", "bench")}


def pins(lock: str) -> dict[str, list[tuple[str, list[str]]]]:
    """name -> [(version, hashes)], one entry per environment marker variant."""
    text = (LOCKS / f"{lock}.txt").read_text().replace("\\\n", " ")
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)", line)
        if m:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
            found.setdefault(canonicalize_name(m[1]), []).append((m[2], hashes))
    return found


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


@pytest.mark.parametrize("lock", sorted(EXTRAS))
def test_every_declared_requirement_is_pinned_within_its_range_with_hashes(lock: str) -> None:
    locked = pins(lock)
    for req in declared(EXTRAS[lock]):
        name = canonicalize_name(req.name)
        assert name in locked, f"{req} is not in requirements/{lock}.txt: run make lock"
        for version, hashes in locked[name]:
            assert req.specifier.contains(version, prereleases=True), (
                f"requirements/{lock}.txt pins {name}=={version}, outside {req}: run make lock"
            )
            assert hashes, f"{name}=={version} has no hash"
    assert all(h for variants in locked.values() for _, h in variants)


@pytest.mark.parametrize("lock", ["runtime", "toolchain"])
def test_the_image_locks_pin_the_versions_the_tests_ran_with(lock: str) -> None:
    dev = pins("dev")
    for name, variants in pins(lock).items():
        assert {v for v, _ in variants} <= {v for v, _ in dev[name]}, name


def test_the_runtime_lock_holds_no_toolchain_package() -> None:
    assert not {"torch", "transformers", "scikit-learn", "onnx"} & set(pins("runtime"))


def test_every_install_reads_a_lock_with_hashes_required() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r $(LOCK)" in makefile
    assert "LOCK ?= requirements/dev.txt" in makefile
    assert "make install" in (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/audit" in (ROOT / ".ci" / "run").read_text()
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    for lock in ("runtime", "toolchain"):
        assert f"--require-hashes -r /requirements/{lock}.txt" in docker
    # kascade itself never resolves anything beyond the lock
    assert docker.count("--no-deps /wheels/kascade-") == 2


class _Advisories(BaseHTTPRequestHandler):
    """An OSV query endpoint answering from a fixed table: (name, version) -> ids."""

    table: ClassVar[dict[tuple[str, str], list[str]]] = {}

    def do_POST(self) -> None:
        query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name, version = query["package"]["name"], query["version"]
        vulns = [
            {
                "id": vid,
                "summary": "planted for the test",
                "affected": [{"package": {"name": name, "ecosystem": "PyPI"}, "ranges": []}],
            }
            for vid in self.table.get((name, version), [])
        ]
        body = json.dumps({"vulns": vulns} if vulns else {}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def advisories() -> Iterator[tuple[str, dict[tuple[str, str], list[str]]]]:
    table: ClassVar[dict[tuple[str, str], list[str]]] = {}
    handler = type("Advisories", (_Advisories,), {"table": table})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/query", table
    finally:
        server.shutdown()
        server.server_close()


def audit(url: str, require: bool = False) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "KASCADE_AUDIT_ARGS": f"-s osv --osv-url {url}",
        "KASCADE_REQUIRE_AUDIT": "1" if require else "0",
    }
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "audit")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_audit_passes_a_lock_with_no_known_vulnerability(advisories) -> None:
    url, table = advisories
    table[("requests", "2.31.0")] = ["CANARY-1"]
    r = audit(url, require=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no known vulnerability in requirements/dev.txt" in r.stdout


def test_the_audit_fails_on_a_locked_version_with_a_known_vulnerability(advisories) -> None:
    url, table = advisories
    table[("requests", "2.31.0")] = ["CANARY-1"]
    version = pins("dev")["numpy"][0][0]
    table[("numpy", version)] = ["PLANTED-2026-1"]
    r = audit(url)
    assert r.returncode == 1
    assert "PLANTED-2026-1" in r.stdout and "numpy" in r.stdout


def test_an_audit_that_cannot_see_a_known_vulnerability_says_it_checked_nothing(
    advisories,
) -> None:
    url, _ = advisories  # answers "nothing known" for everything, the canary too
    r = audit(url)
    assert r.returncode == 0 and "audit: NOT DONE" in r.stderr
    r = audit(url, require=True)
    assert r.returncode == 1 and "audit: NOT DONE" in r.stderr
