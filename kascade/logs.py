"""How every kascade process logs: one level and one format, set on the command line and
handed to the worker processes, so ``-v`` reaches them and their lines look like the
supervisor's.

>>> import io
>>> out = io.StringIO()
>>> configure(LogConfig(level="info", format="json"), stream=out, worker=1)
>>> logging.getLogger("kascade.demo").info("ready: %d documents", 12)
>>> record = json.loads(out.getvalue())
>>> record["level"], record["logger"], record["message"], record["worker"]
('INFO', 'kascade.demo', 'ready: 12 documents', 1)
>>> configure(LogConfig())  # back to the default for the examples that follow
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from typing import Literal, TextIO

Level = Literal["debug", "info", "warning", "error"]
Format = Literal["text", "json"]
LEVELS: tuple[Level, ...] = ("debug", "info", "warning", "error")
FORMATS: tuple[Format, ...] = ("text", "json")
# The start and stop lines of a job (what it runs, what it did) are said at the
# default level too: a newcomer sees that the job started and what it did.
LIFECYCLE_LOGGER = "kascade.run"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(worker_tag)s: %(message)s"
_current: LogConfig | None = None


@dataclass(frozen=True)
class LogConfig:
    """What ``--log-level`` and ``--log-format`` chose (``-v`` is ``--log-level info``)."""

    level: Level = "warning"
    format: Format = "text"


class _JsonLines(logging.Formatter):
    """One JSON object per line, for log shippers (Loki, Elasticsearch, CloudWatch)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        worker = getattr(record, "worker", None)  # stamped by configure's filter
        if worker is not None:
            entry["worker"] = worker
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(
    config: LogConfig, *, stream: TextIO | None = None, worker: int | None = None
) -> None:
    """Log at ``config``'s level and format to ``stream`` (stderr); ``worker``: this
    process is that worker of the supervisor, and its lines say so."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        _JsonLines() if config.format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    tag = "" if worker is None else f" [worker {worker}]"

    def stamp(record: logging.LogRecord) -> bool:
        record.worker = worker
        record.worker_tag = tag
        return True

    handler.addFilter(stamp)
    global _current
    _current = config
    level = getattr(logging, config.level.upper())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger(LIFECYCLE_LOGGER).setLevel(
        min(level, logging.INFO) if level <= logging.WARNING else level
    )
    # librdkafka reports transient conditions (retries, config hints) as warnings.
    logging.getLogger("kascade.rdkafka").setLevel(level if level <= logging.INFO else logging.ERROR)
    if level > logging.INFO:
        # onnxruntime's quantizer logs advice (opset upgrades, pre-processing) on every
        # call, partly through the root logger; the toolchain validates its output itself.
        handler.addFilter(lambda r: "onnxruntime" not in r.pathname)


def current() -> LogConfig:
    """What this process was configured with: what its worker processes are given."""
    return _current or LogConfig()
