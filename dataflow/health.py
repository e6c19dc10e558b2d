"""Whether this process can reach Kafka, told as state changes rather than log floods.

librdkafka reconnects by itself and logs every failed attempt (hundreds of lines a
minute while a broker is down). :class:`LinkState` folds those lines into three kinds:
one line when the cluster becomes unreachable, a reminder at most every
``remind_s`` seconds, and one line when it is reachable again. The sink asks it how
long the outage has lasted, to give up past ``kafka.outage_tolerance_s``.

>>> clock = iter([0.0, 1.0, 70.0, 80.0]).__next__
>>> link = LinkState(remind_s=60, now=clock)
>>> [link.down("refused"), link.down("refused"), link.down("refused")]
['Kafka unreachable (refused); retrying', None, 'Kafka still unreachable after 70 s (refused)']
>>> link.up()
'Kafka reachable again after 80 s'
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
    now: Callable[[], float] = time.monotonic
    _down_since: float | None = None
    _reminded: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def down(self, reason: str) -> str | None:
        with self._lock:
            t = self.now()
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
            lasted = self.now() - self._down_since
            self._down_since = None
            return self._say(logging.WARNING, f"Kafka reachable again after {lasted:.0f} s")

    def outage_s(self) -> float:
        """How long the current outage has lasted (0 when up)."""
        with self._lock:
            return 0.0 if self._down_since is None else self.now() - self._down_since

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
