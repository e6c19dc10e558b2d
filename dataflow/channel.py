"""What a worker process tells its supervisor, on a pipe of its own: one JSON object per
line, typed (:class:`Note`), never mixed with what the worker logs.

The supervisor opens the pipe and names its file descriptor in the worker's environment
(:data:`ENV`); a process started any other way has no channel, and telling does nothing.
Only Bytewax's own lines (its connection retries) are still read from the worker's output.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from enum import StrEnum
from typing import TextIO

from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

ENV = "KASCADE_SUPERVISOR_FD"


class Event(StrEnum):
    JOINED = "joined"  # the dataflow runs: every peer is connected
    TOTALS = "totals"  # what this process labeled and dead-lettered, as it exits
    FAILED = "failed"  # why it stops with an error (the supervisor reports the first)


class Note(BaseModel):
    """One line of the channel.

    >>> Note.model_validate_json(Note(event=Event.FAILED, cause="worker 1: boom").model_dump_json())
    Note(event=<Event.FAILED: 'failed'>, cause='worker 1: boom', counts={})
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Event
    cause: str | None = None
    counts: dict[str, int] = {}


_out: TextIO | None = None


def open_from_environment() -> None:
    """Take up the channel the supervisor opened for this process, if it opened one. The
    variable is removed, so processes this one starts do not write to it."""
    global _out
    fd = os.environ.pop(ENV, None)
    if fd is not None:
        os.set_inheritable(int(fd), False)  # nor through this process's children
        _out = os.fdopen(int(fd), "w", buffering=1, encoding="utf-8")


def is_worker() -> bool:
    """Whether this process is one of a supervisor's workers."""
    return _out is not None


def tell(note: Note) -> None:
    """Send ``note`` to the supervisor (nothing without one)."""
    if _out is None:
        return
    try:
        _out.write(note.model_dump_json() + "\n")
        _out.flush()
    except OSError:  # the supervisor is gone; this process follows it shortly
        pass


def announce_joined() -> None:
    """Tell the supervisor this worker's dataflow runs. Bytewax builds a dataflow only once
    every peer is connected, so the flow's source calls this when it is built."""
    tell(Note(event=Event.JOINED))


def notes(stream: TextIO) -> Iterator[Note]:
    """The notes a worker sends on ``stream``, until it closes; a line that is not one is
    logged and skipped (a channel is the worker's own: that would be a bug)."""
    for line in stream:
        try:
            yield Note.model_validate_json(line)
        except ValidationError as e:
            log.warning("a worker sent its supervisor a line it cannot read: %r (%s)", line, e)
