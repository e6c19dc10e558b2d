"""Value types for command-line flags, so a bad value is refused by argparse in one line
that names the flag, before any work starts.

>>> positive("3"), probability("0.05")
(3, 0.05)
>>> probability("1")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be between 0 and 1 (exclusive), not 1.0
"""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """A whole number of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def at_most(limit: int):
    """A whole number from 1 to ``limit``.

    >>> at_most(10)("11")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be at most 10, not 11
    """

    def parse(text: str) -> int:
        n = positive(text)
        if n > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,}, not {n:,}")
        return n

    return parse


def probability(text: str) -> float:
    """A number strictly between 0 and 1 (an epsilon, a delta, an agreement)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), not {x}")
    return x
