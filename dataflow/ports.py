"""Free local TCP ports: for a host's worker processes (which Bytewax connects on fresh
ports) and for the brokers, registries and servers tests and the demo start."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody holds now whose successor is free too (the controller's), below
    the kernel's ephemeral range, so no client connection takes it before it is bound."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(max(1024, low - 12_000), low - 1)
        if _bindable(port) and _bindable(port + 1):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
