"""Turns: how many chunks a document reads before the documents behind it get theirs.

A document's chunks arrive together; reading them all at once makes every document
behind it on this worker wait for all of them. With turns of ``size`` chunks, a document
reads that many, then the others' turns come (Bytewax calls ``on_notify`` once per
activation) before its next: short documents pass long ones. What a document reads, and
what it gets, never depend on the turns; only when.

>>> t = Turns(size=2)
>>> [t.take() for _ in range(3)]
[True, True, False]
>>> t.next_turn(); t.take()
True
>>> Turns().take()  # no turns: every chunk that is ready
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass
class Turns:
    size: int | None = None  # chunks per turn (None: no turns)
    _left: int | None = field(default=None, repr=False)  # None: a new document's first turn

    def take(self) -> bool:
        """Whether one more chunk may be read in this turn (and count it)."""
        if self.size is None:
            return True
        if self._left is None:
            self._left = self.size
        if self._left <= 0:
            return False
        self._left -= 1
        return True

    def next_turn(self) -> None:
        self._left = self.size

    def end(self) -> None:
        """No turn comes after this one (the end of the input, or a drain)."""
        self.size = None

    def notify_at(self, waiting: bool) -> datetime | None:
        """When to come back for the next turn: at once (after the other documents'
        turns) while a chunk that is ready waits, else never."""
        return datetime.now(UTC) if self.size is not None and waiting else None
