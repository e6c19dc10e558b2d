"""Whether this process can reach Kafka, told as state changes rather than log floods.

librdkafka reconnects by itself and logs every failed attempt (hundreds of lines a
minute while a broker is down). :class:`LinkState` folds those lines into three kinds:
one line when the cluster becomes unreachable, a reminder at most every
``remind_s`` seconds, and one line when it is reachable again.

Reconnecting is not one event: a dozen clients (a consumer per worker, a producer per
input partition) reconnect one by one, and one client's late "refused" comes after
another's first success. So "reachable again" is said once the cluster has stayed
reachable for ``settle_s``; a failure before that continues the same outage.

>>> clock = iter([0.0, 1.0, 70.0, 80.0, 80.5, 81.0, 84.0]).__next__
>>> link = LinkState(remind_s=60, settle_s=3, now=clock)
>>> [link.down("refused"), link.down("refused"), link.down("refused")]
['Kafka unreachable (refused); retrying', None, 'Kafka still unreachable after 70 s (refused)']
>>> [link.up(), link.down("refused"), link.up(), link.up()]
[None, None, None, 'Kafka reachable again after 81 s']
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("kascade.kafka")

# What librdkafka says while it cannot reach a broker (log lines and error names).
_UNREACHABLE = re.compile(
    r"Connection refused|Connect to .* failed|Disconnected|all broker|Broker transport"
    r" failure|_TRANSPORT|_ALL_BROKERS_DOWN|Timed out|_RESOLVE|Failed to resolve",
    re.IGNORECASE,
)


def means_unreachable(message: str) -> bool:
    """Whether a librdkafka message reports a connection problem, not a data problem."""
    return bool(_UNREACHABLE.search(message))


@dataclass
class LinkState:
    """Up or down since when; every method returns the line it logged (or ``None``)."""

    remind_s: float = 60.0
    settle_s: float = 3.0
    now: Callable[[], float] = time.monotonic
    _down_since: float | None = None
    _up_since: float | None = None  # reachable since, not yet for settle_s
    _reminded: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def down(self, reason: str) -> str | None:
        with self._lock:
            t = self.now()
            self._up_since = None  # a client's late failure: the same outage goes on
            if self._down_since is None:
                self._down_since = self._reminded = t
                return self._say(logging.WARNING, f"Kafka unreachable ({reason}); retrying")
            if t - self._reminded >= self.remind_s:
                self._reminded = t
                lasted = t - self._down_since
                return self._say(
                    logging.WARNING, f"Kafka still unreachable after {lasted:.0f} s ({reason})"
                )
            return None

    def up(self) -> str | None:
        with self._lock:
            if self._down_since is None:
                return None
            t = self.now()
            if self._up_since is None:
                self._up_since = t
            if t - self._up_since < self.settle_s:
                return None
            lasted = self._up_since - self._down_since
            self._down_since = self._up_since = None
            return self._say(logging.WARNING, f"Kafka reachable again after {lasted:.0f} s")

    @staticmethod
    def _say(level: int, line: str) -> str:
        log.log(level, line)
        return line


LINK = LinkState()  # one per process: every client of it shares one view of the cluster


class FoldConnectionErrors(logging.Filter):
    """Drops librdkafka's per-attempt connection errors, telling :data:`LINK` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno >= logging.WARNING and means_unreachable(message):
            LINK.down(message.rsplit(": ", 1)[-1][:120])
            return False
        return True
