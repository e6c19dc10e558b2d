"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomically(path: Path | str, text: str, *, private: bool = False) -> None:
    """Write ``text`` to a temporary sibling, then rename it over ``path``.

    The file gets the permissions a plain ``open(path, "w")`` would have given it
    (``mkstemp`` alone would leave it readable by its owner only), or with ``private``
    (text from someone's production stream) its owner's alone, never anyone else's.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> write_text_atomically(p, "hi\\n"); p.read_text()
    'hi\\n'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600 if private else 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
