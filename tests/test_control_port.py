"""The control port as a hostile neighbour finds it: drains without the token or with a
wrong one, bodies and heads too large, garbage, slow and idle connections by the
thousand. None drains the job or keeps the port from answering its probes."""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request

import pytest

from kascade.dataflow.control import READ_TIMEOUT_S, ControlServer
from kascade.dataflow.peers import Peer, ask_to_drain, nudge, probe
from kascade.dataflow.ports import free_port

TOKEN = "s3cret-control-token"


class Drains:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.fixture
def server():
    port = free_port()
    drains = Drains()
    control = ControlServer(f"127.0.0.1:{port - 1}", 1, drains, token=TOKEN)
    control.state = "running"
    yield control, port, drains
    control.close()


def post(port: int, headers: dict[str, str] | None = None, data: bytes = b"") -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/drain", data=data, method="POST", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def raw(port: int, data: bytes, timeout: float = 5) -> bytes:
    """What the server answers to ``data`` sent as it is (b"": closed unanswered)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


def peer(port: int) -> Peer:
    return Peer(0, f"127.0.0.1:{port - 1}", ("127.0.0.1", port))


def test_a_drain_without_the_token_or_with_a_wrong_one_is_refused_and_logged(
    server, caplog: pytest.LogCaptureFixture
) -> None:
    _, port, drains = server
    with caplog.at_level(logging.WARNING, logger="kascade.dataflow.peers"):
        assert post(port) == 403
        assert post(port, {"Authorization": "Bearer guess"}) == 403
        assert post(port, {"Authorization": f"Bearer {TOKEN}x"}) == 403
        assert post(port, {"Authorization": TOKEN}) == 403
        assert not ask_to_drain(peer(port), "guess")
    assert drains.count == 0
    # One line names the first refusal's source; the rest of the burst is counted in the
    # next line, not written one by one.
    assert caplog.messages == ["refused a drain request from 127.0.0.1: no token"]
    assert probe(peer(port)) == "running"


def test_a_flood_of_refused_drains_is_one_line_then_a_count(
    server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, port, drains = server
    with caplog.at_level(logging.WARNING, logger="kascade.dataflow.peers"):
        for _ in range(100):
            assert post(port, {"Authorization": "Bearer guess"}) == 403
        monkeypatch.setattr(control, "_refusal_said_at", -1e9)  # the window has passed
        assert post(port) == 403
    assert caplog.messages == [
        "refused a drain request from 127.0.0.1: wrong token",
        "refused a drain request from 127.0.0.1: no token (and 99 more since the last such line)",
    ]
    assert drains.count == 0


def test_the_token_drains_and_the_drain_is_logged_with_its_source(
    server, caplog: pytest.LogCaptureFixture
) -> None:
    _, port, drains = server
    with caplog.at_level(logging.WARNING, logger="kascade.dataflow.peers"):
        assert ask_to_drain(peer(port), TOKEN)
        deadline = time.monotonic() + 2
        while drains.count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert drains.count == 1
    assert "drain requested by 127.0.0.1" in caplog.messages


def test_a_drain_with_a_body_or_a_huge_declared_length_is_refused_at_once(server) -> None:
    _, port, drains = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post(port, auth, data=b"x" * 100) == 413
    began = time.monotonic()
    answer = raw(
        port,
        f"POST /drain HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 1000000000\r\n\r\n".encode(),
    )
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - began < 1
    assert drains.count == 0


@pytest.mark.parametrize(
    "data",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello
        b"GET\r\n\r\n",
        b"GET /state HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\xff\xfe\xfd\r\n\r\n",
    ],
)
def test_garbage_gets_a_400_and_the_port_goes_on_answering(server, data: bytes) -> None:
    _, port, drains = server
    assert raw(port, data).startswith(b"HTTP/1.1 400")
    assert probe(peer(port)) == "running" and drains.count == 0


def test_a_head_larger_than_the_limit_is_closed_unanswered(server) -> None:
    _, port, _ = server
    huge = b"GET /state HTTP/1.1\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\n"
    try:
        answer = raw(port, huge)
    except ConnectionResetError:
        answer = b""
    assert answer == b""
    assert probe(peer(port)) == "running"


def test_a_slow_connection_is_cut_after_the_read_timeout(server) -> None:
    _, port, _ = server
    began = time.monotonic()
    assert raw(port, b"GET /sta", timeout=READ_TIMEOUT_S + 5) == b""
    assert READ_TIMEOUT_S - 0.5 < time.monotonic() - began < READ_TIMEOUT_S + 2


def test_a_thousand_idle_connections_leave_the_probes_answered_within_a_second(server) -> None:
    _, port, _ = server
    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        began = time.monotonic()
        assert probe(peer(port), timeout_s=1.0) == "running"
        assert time.monotonic() - began < 1.0
    finally:
        for s in idle:
            s.close()


def test_a_peers_suspension_is_obeyed_only_with_the_token_and_a_well_formed_scope() -> None:
    from kascade.dataflow.peers import tell_suspended

    port = free_port()
    got: list[tuple[str, str]] = []
    control = ControlServer(
        f"127.0.0.1:{port - 1}", 1, Drains(), token=TOKEN, on_suspend=lambda *a: got.append(a)
    )
    try:
        sha = "ab" * 32
        assert not tell_suspended(peer(port), "guess", sha, "sw")
        # every scope a test can fire for: a language, a length in one, the document stop
        scopes = ["sw", "de/long", "short", "doc_stop"]
        for scope in scopes:
            assert tell_suspended(peer(port), TOKEN, sha, scope), scope
        for bad in ("sw\nFAKE", "../x", "a" * 40, "de/medium", "doc_stop/long"):
            assert not tell_suspended(peer(port), TOKEN, sha, bad)
        assert not tell_suspended(peer(port), TOKEN, "not-a-sha", "sw")
        deadline = time.monotonic() + 5
        while len(got) < len(scopes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [(sha, scope) for scope in scopes]
    finally:
        control.close()


def test_a_peer_reads_what_calibration_a_process_runs_and_garbage_reads_as_none() -> None:
    from kascade.dataflow.plans import PlanView, view_of

    port = free_port()
    said = [PlanView("a" * 64, "b" * 64, None).text()]
    looks = Drains()  # counts the asks to look at process 0's calibration now
    control = ControlServer(
        f"127.0.0.1:{port - 1}", 1, Drains(), token=TOKEN, plan=lambda: said[0], on_plan=looks
    )
    try:
        assert view_of(peer(port)) == PlanView("a" * 64, "b" * 64, None)
        assert not nudge(peer(port), "guess") and nudge(peer(port), TOKEN)
        time.sleep(0.2)
        assert looks.count == 1  # only the one with the cluster's token
        said[0] = "a" * 64 + " not-a-digest -"  # what a broken or foreign process says
        assert view_of(peer(port)) is None
    finally:
        control.close()
    assert view_of(peer(port)) is None  # not answering
    plain = ControlServer(f"127.0.0.1:{port - 1}", 1, Drains(), token=TOKEN)  # no cascade
    try:
        assert b"404" in raw(port, b"GET /calibration HTTP/1.1\r\n\r\n").split(b"\r\n")[0]
    finally:
        plain.close()
