"""A Bytewax stream of a union split by the class of its items, typed on both sides.

``op.branch`` narrows its trues through a ``TypeGuard`` but keeps its falses the whole
union, so each split by class would need a cast or an ignore where it is used. Here the
trues are typed by ``kind``; the rest is typed by what the caller assigns it to.
"""

from __future__ import annotations

from typing import Any, TypeVar

import bytewax.operators as op
from bytewax.dataflow import Stream

A = TypeVar("A")


def by_class(step_id: str, up: Stream[Any], kind: type[A]) -> tuple[Stream[A], Stream[Any]]:
    """``up``'s items of class ``kind``, and the others (in one Bytewax ``branch`` step)."""
    split = op.branch(step_id, up, lambda x: isinstance(x, kind))
    return split.trues, split.falses
