"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(path: Path | str, *, private: bool = False) -> Iterator[TextIO]:
    """A text file to write ``path`` through: a temporary sibling, renamed over ``path``
    when the block ends without an exception (removed otherwise).

    The file gets the permissions a plain ``open(path, "w")`` would have given it
    (``mkstemp`` alone would leave it readable by its owner only), or with ``private``
    (text from someone's production stream) its owner's alone, never anyone else's.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o600 if private else 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path | str, text: str, *, private: bool = False) -> None:
    """Write ``text`` to ``path`` through :func:`atomic_writer`.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> write_text_atomically(p, "hi\\n"); p.read_text()
    'hi\\n'
    """
    with atomic_writer(path, private=private) as f:
        f.write(text)
