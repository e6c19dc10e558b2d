"""How the processes of a job spread over several hosts watch each other.

Bytewax's own connections between processes say nothing useful when they break (a
surviving process panics, naming no one), so each process's supervisor also answers
its peers over HTTP on its address's port plus ``cluster.control_port_offset``:

- ``GET /state``: ``waiting`` (its dataflow is not connected yet), ``running``,
  ``restarting`` or ``draining``; a peer that does not answer is down or unreachable.
- ``GET /ready``: the same, status 200 only while ``running`` (a readiness probe).
- ``POST /drain``: drain this process too (a peer was sent SIGTERM), so the whole
  cluster finishes what it holds and exits 0 instead of panicking at the loss.

These requests carry no data and no credentials; like Bytewax's own ports, the control
port belongs on the cluster's private network.

>>> [str(p) for p in peers_of(["a:9000", "b:9000", "c:9000"], own=1, offset=1)]
['process 0 (a:9000)', 'process 2 (c:9000)']
>>> peers_of(["a:9000", "b:9000"], own=0, offset=1)[0].control
('b', 9001)
"""

from __future__ import annotations

import ipaddress
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kascade.errors import KascadeError

NOT_ANSWERING = "not answering"


@dataclass(frozen=True)
class Peer:
    index: int
    address: str  # host:port of its dataflow
    control: tuple[str, int]

    def __str__(self) -> str:
        return f"process {self.index} ({self.address})"


def control_address(address: str, offset: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port) + offset


def peers_of(hosts: list[str], own: int, offset: int) -> list[Peer]:
    """Every process of the cluster but ``own``."""
    return [Peer(i, a, control_address(a, offset)) for i, a in enumerate(hosts) if i != own]


def probe(peer: Peer, timeout_s: float = 1.0) -> str:
    """The peer's state, or :data:`NOT_ANSWERING`."""
    host, port = peer.control
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/state", timeout=timeout_s) as r:
            return r.read().decode("ascii", "replace").strip() or NOT_ANSWERING
    except (OSError, urllib.error.URLError, ValueError):
        return NOT_ANSWERING


def ask_to_drain(peer: Peer, timeout_s: float = 2.0) -> bool:
    host, port = peer.control
    request = urllib.request.Request(f"http://{host}:{port}/drain", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def states(peers: list[Peer]) -> dict[Peer, str]:
    """Every peer's state, probed in parallel (a host that is gone costs one timeout)."""
    found: dict[Peer, str] = {}
    threads = [
        threading.Thread(target=lambda p=p: found.__setitem__(p, probe(p)), daemon=True)
        for p in peers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {p: found.get(p, NOT_ANSWERING) for p in peers}


def describe(found: dict[Peer, str], *, want: Callable[[str], bool]) -> str:
    """The peers whose state ``want`` picks, with their states, as one phrase.

    >>> p, q = peers_of(["a:1", "b:1", "c:1"], own=0, offset=1)
    >>> describe({p: "not answering", q: "running"}, want=lambda s: s != "running")
    'process 1 (b:1): not answering'
    """
    picked = [f"{p}: {s}" for p, s in found.items() if want(s)]
    return ", ".join(picked)


class ControlServer:
    """This process's answers to its peers; ``on_drain`` runs when one asks to drain."""

    def __init__(self, address: str, offset: int, on_drain: Callable[[], None]) -> None:
        host, port = control_address(address, offset)
        self.state = "waiting"
        self._on_drain = on_drain
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/state":
                    self._reply(server.state)
                elif self.path == "/ready":
                    ready = server.state == "running"
                    self._reply(server.state, 200 if ready else 503)
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                if self.path != "/drain":
                    self.send_error(404)
                    return
                self._reply("draining")
                server._on_drain()

            def _reply(self, text: str, status: int = 200) -> None:
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass  # probes every few seconds are not news

        try:
            self._http = ThreadingHTTPServer((_bind_host(host), port), Handler)
        except OSError as e:
            raise KascadeError(
                f"cannot answer peers on {host}:{port} (cluster.control_port_offset): {e}"
            ) from None
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


def _bind_host(host: str) -> str:
    """An address literal binds as given; a name (a pod's DNS name may not resolve before
    the pod is ready) binds every interface."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "0.0.0.0"
    return host.strip("[]")
