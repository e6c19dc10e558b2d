"""Which record each worker process is inside, kept where a dead process leaves it.

A record that makes native code crash (a segfault in a library, the kernel's OOM
killer) ends its process before any ``except`` runs, and a restart from the last
snapshot reads it again. So each step that may run native code on a record first notes
the record's source position in a small file of the recovery directory, and clears it
on the way out; the supervisor reads the note a dead process left behind. One
``pwrite`` of a fixed-size slot on entry and one on exit: microseconds against the
milliseconds of a tokenizer or model call. Without a recovery directory nothing is
written.

>>> import tempfile, pathlib
>>> note = pathlib.Path(tempfile.mkdtemp()) / "0"
>>> track(note)
>>> with inside(SourcePosition(topic="in", partition=1, offset=9), "chunk"):
...     read(note).stage
'chunk'
>>> read(note) is None
True
>>> untrack()
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from kascade.schemas import SourcePosition
from kascade.schemas.quarantine import Suspect

# Topic names are at most 249 bytes; a note never needs more than this slot.
_SLOT = 512
_EMPTY = b" " * _SLOT

_fd: int | None = None


def track(path: Path) -> None:
    """Keep this process's note in ``path`` from now on (created empty)."""
    global _fd
    untrack()
    path.parent.mkdir(parents=True, exist_ok=True)
    _fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.pwrite(_fd, _EMPTY, 0)


def untrack() -> None:
    global _fd
    if _fd is not None:
        os.close(_fd)
        _fd = None


@contextlib.contextmanager
def inside(source: SourcePosition | None, stage: str) -> Iterator[None]:
    """Note ``source`` as the record this process is in, for the ``with`` block."""
    fd = _fd
    if fd is None or source is None:
        yield
        return
    note = Suspect(source=source, stage=stage).model_dump_json().encode()
    os.pwrite(fd, note.ljust(_SLOT)[:_SLOT], 0)
    try:
        yield
    finally:
        os.pwrite(fd, _EMPTY, 0)


def read(path: Path) -> Suspect | None:
    """The record a process was inside when it stopped, if it was inside one."""
    try:
        text = path.read_bytes().strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        return Suspect.model_validate_json(text)
    except ValueError:  # a note cut short by the crash names no record for sure
        return None
