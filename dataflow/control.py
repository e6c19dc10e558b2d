"""The control port: what a process of a job spread over several hosts answers its peers.

Bytewax's own connections between processes say nothing useful when they break (a
surviving process panics, naming no one), so each process's supervisor also answers
its peers over HTTP on its address's port plus ``cluster.control_port_offset``:

- ``GET /state``: ``waiting`` (its dataflow is not connected yet), ``running``,
  ``restarting`` or ``draining``; a peer that does not answer is down or unreachable.
- ``GET /ready``: the same, status 200 only while ``running`` (a readiness probe).
- ``GET /calibration``: the calibration its workers run, the newest it could run, and
  the one it drains to take up (:mod:`~kascade.dataflow.plans`).
- ``POST /calibration``: look at process 0's calibration now (process 0 took a new one
  up); what to do is still decided from what process 0 says on ``GET``.
- ``POST /drain``: drain this process too (a peer was sent SIGTERM), so the whole
  cluster finishes what it holds and exits 0 instead of panicking at the loss.
- ``POST /suspend?cascade=SHA256&scope=SCOPE``: a peer's live test of the bound fired for
  that calibration and scope (a language, ``other``, ``all``, a length of document alone
  or in a language, or ``doc_stop``); this process suspends the same scope
  (:mod:`kascade.schemas.suspensions`).

The POSTs are obeyed only with the cluster's shared token (``Authorization: Bearer``,
``cluster.control_token``): anyone else who can reach the port is refused, and the
refusal is logged with the caller's address.

The server is built for a network it does not control: a request head of bounded size
and no body, a read timeout per connection, a cap on connections at once (more are
closed unanswered), so idle or slow connections cannot pin it while probes go on being
answered.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import re
import resource
import threading
import time
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus

from kascade.dataflow.peers import State, control_address
from kascade.errors import KascadeError
from kascade.schemas.suspensions import SCOPE

log = logging.getLogger(__name__)

# How long a connection may take to send its request (a slow or idle one is closed).
READ_TIMEOUT_S = 2.0
# Refused drains are logged with their source, at most one line this often.
REFUSALS_SAID_EVERY_S = 10.0
# The longest request head read.
MAX_REQUEST_BYTES = 8192


class ControlServer:
    """This process's answers to its peers; ``on_drain`` runs when a peer holding
    ``token`` asks to drain. Binds ``bind`` when given (a pod's own IP), else the
    address's host when it is an IP literal, else every interface.

    One asyncio loop in a thread of its own serves every connection: an idle one costs
    a file descriptor, not a thread, and is closed after :data:`READ_TIMEOUT_S`.
    """

    def __init__(
        self,
        address: str,
        offset: int,
        on_drain: Callable[[], None],
        *,
        token: str,
        bind: str | None = None,
        on_suspend: Callable[[str, str], None] | None = None,
        plan: Callable[[], str] | None = None,
        on_plan: Callable[[], None] | None = None,
    ) -> None:
        host, port = control_address(address, offset)
        self.state = State.WAITING
        self._on_drain = on_drain
        self._on_suspend = on_suspend
        self._plan = plan
        self._on_plan = on_plan
        self._expected = f"Bearer {token}".encode()
        self._open = 0
        self._cap = max_connections()
        self._refusals = 0
        self._refusal_said_at = -math.inf
        self._loop = asyncio.new_event_loop()
        bound = bind or _bind_host(host)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._serve, bound, port, limit=MAX_REQUEST_BYTES, backlog=1024
                )
            )
        except OSError as e:
            self._loop.close()
            raise KascadeError(
                f"cannot answer peers on {bound}:{port} (cluster.control_port_offset): {e}"
            ) from None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self._cap:
            writer.close()  # full: closed unanswered
            return
        self._open += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            client = (writer.get_extra_info("peername") or ("?",))[0]
            status, text = self._answer(head, client)
            writer.write(_response(status, text))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # idle, slow, oversized or gone: closed without an answer
        finally:
            self._open -= 1
            writer.close()

    def _answer(self, head: bytes, client: str) -> tuple[int, str]:
        """The status and text for one request's line and headers."""
        request = parse_request(head)
        if request is None:
            return 400, "bad request"
        method, path, headers = request
        if method == "GET" and path == "/state":
            return 200, self.state
        if method == "GET" and path == "/ready":
            return (200 if self.state == State.RUNNING else 503), self.state
        if method == "GET" and path == "/calibration":
            return (404, "not found") if self._plan is None else (200, self._plan())
        route, _, query = path.partition("?")
        if route not in ("/drain", "/suspend", "/calibration"):
            return 404, "not found"
        if method != "POST":
            return 405, "method not allowed"
        given = headers.get("authorization", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, self._expected):
            self._refused(client, route[1:], "wrong token" if given else "no token")
            return 403, "forbidden"
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            return 413, "a control request has no body"
        if route == "/drain":
            log.warning("drain requested by %s", client)
            self._loop.call_soon(self._on_drain)
            return 200, State.DRAINING
        if route == "/calibration":
            if self._on_plan is None:
                return 404, "not found"
            self._loop.call_soon(self._on_plan)
            return 200, "looking"
        return self._suspend(query, client)

    def _suspend(self, query: str, client: str) -> tuple[int, str]:
        params = urllib.parse.parse_qs(query)
        sha = (params.get("cascade") or [""])[0]
        scope = (params.get("scope") or [""])[0]
        if not re.fullmatch(r"[0-9a-f]{64}", sha) or not re.fullmatch(SCOPE, scope):
            return 400, "bad request"
        if self._on_suspend is None:
            return 404, "not found"
        log.warning(
            "%s reports the live test fired for %s under calibration %s", client, scope, sha[:12]
        )
        self._loop.call_soon(self._on_suspend, sha, scope)
        return 200, "suspended"

    def _refused(self, client: str, what: str, why: str) -> None:
        """Log a refused drain with its source, at most one line per
        :data:`REFUSALS_SAID_EVERY_S` (a flood of requests is not a flood of lines)."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusal_said_at < REFUSALS_SAID_EVERY_S:
            return
        more = self._refusals - 1
        log.warning(
            "refused a %s request from %s: %s%s",
            what,
            client,
            why,
            f" (and {more} more since the last such line)" if more else "",
        )
        self._refusal_said_at, self._refusals = now, 0

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            open_ = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in open_:
                t.cancel()
            await asyncio.gather(*open_, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()


def max_connections() -> int:
    """Connections served at once: a quarter of this process's file descriptors, at
    most 4096 (the probes of a cluster need a handful; the rest is room for noise)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(4096, soft // 4))


def parse_request(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """Method, path and headers (names lowercased) of an HTTP/1 request head, or None.

    >>> parse_request(b"POST /drain HTTP/1.1\\r\\nAuthorization: Bearer t\\r\\n\\r\\n")
    ('POST', '/drain', {'authorization': 'Bearer t'})
    >>> parse_request(b"\\x16\\x03\\x01 garbage\\r\\n\\r\\n") is None
    True
    """
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            return None
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def _response(status: int, text: str) -> bytes:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _bind_host(host: str) -> str:
    """An address literal binds as given; a name (a pod's DNS name may not resolve before
    the pod is ready) binds every interface, unless ``cluster.control_host`` says which."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "0.0.0.0"
    return host.strip("[]")
