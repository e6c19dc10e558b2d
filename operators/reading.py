"""Reading a document only as far as its label needs: the certified document stop.

Chunks are read in order. After each, :func:`stop_label` decides from the cheap stages'
verdicts alone whether the label a full read would give is already known; the chunks
after it are never computed. The rule (:class:`~kascade.schemas.cascade.StopRule`) is
one point of a path fixed in advance (:data:`STOP_PATH`), certified by ``kascade
calibrate --documents`` like the chunk thresholds are: on documents drawn like the
stream, of those it stops early at most epsilon are labeled otherwise than a full read
by the full model labels them.

An uncertain chunk, or settled chunks that disagree, in the last ``min_chunks`` read
never stop the read; nor does a chunk the cheap stages failed on. So a document whose
opening does not carry its topic (mail headers, a disclaimer) reads on until its own
text has settled the label.

>>> from kascade.schemas.cascade import StopRule
>>> a, b = np.array([0.95, 0.05]), np.array([0.1, 0.9])
>>> rule = StopRule(min_chunks=2, min_lead=0.5)
>>> stop_label(rule, [Seen(True, a, 100), Seen(True, a, 100)], Aggregation.TOKEN_MEAN)
0
>>> stop_label(rule, [Seen(True, b, 100), Seen(False, a, 100)], Aggregation.TOKEN_MEAN) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kascade.operators.aggregation import STRATEGIES, lead
from kascade.schemas import Aggregation
from kascade.schemas.cascade import StopRule

# The rules certification walks, most conservative first (fixed in advance, not chosen on
# the data, so every calibration document can serve the test). Fewer chunks in the
# window and a smaller lead stop sooner and risk more. Rules that also ask the on-topic
# head come first: an opening the cheap heads settle confidently (mail headers, a
# disclaimer) is what makes short windows fail, and that head learns to see it.
ON_TOPIC = 0.8
_WINDOWS = tuple(
    (m, lead_)
    for m, lead_ in (
        (8, 0.8),
        (6, 0.8),
        (5, 0.8),
        (4, 0.8),
        (4, 0.6),
        (3, 0.8),
        (3, 0.6),
        (3, 0.4),
        (2, 0.8),
        (2, 0.6),
        (2, 0.4),
        (2, 0.2),
        (1, 0.9),
        (1, 0.8),
        (1, 0.6),
    )
)
STOP_PATH: tuple[StopRule, ...] = tuple(
    StopRule(min_chunks=m, min_lead=lead_, min_on_topic=on_topic)
    for on_topic in (ON_TOPIC, 0.0)
    for m, lead_ in _WINDOWS
)


@dataclass(frozen=True)
class Seen:
    """What the stop rule knows of one chunk read: whether a cheap stage settled it, the
    cheap probabilities (``None``: the cheap stages failed on it), its token weight, and
    how likely the on-topic head finds it that its label is the document's."""

    settled: bool
    probs: np.ndarray | None
    n_tokens: int
    on_topic: float = 1.0


def stop_label(rule: StopRule, seen: Sequence[Seen], aggregation: Aggregation) -> int | None:
    """The label reading may stop with after the chunks ``seen`` (in reading order), or
    ``None`` to read on."""
    window = seen[-rule.min_chunks :]
    if len(seen) < rule.min_chunks or not all(
        c.settled and c.on_topic >= rule.min_on_topic for c in window
    ):
        return None
    answers = [c.probs for c in seen if c.probs is not None]
    if len(answers) != len(seen):
        return None
    labels = {int(p.argmax()) for p in answers[-rule.min_chunks :]}
    if len(labels) != 1:
        return None
    probs = np.stack(answers).astype(np.float64)
    weights = np.asarray([max(c.n_tokens, 1) for c in seen], dtype=np.float64)
    winner, scores = STRATEGIES[aggregation].combine(probs, weights)
    (label,) = labels
    if winner != label or lead(np.asarray(scores)) < rule.min_lead:
        return None
    return label


def first_stop(rule: StopRule, seen: Sequence[Seen], aggregation: Aggregation) -> int | None:
    """How many chunks of a whole document ``seen`` the rule reads (``None``: all of them,
    the rule never stopping before the last chunk); the reading a run does, replayed
    offline by calibration.

    >>> from kascade.schemas.cascade import StopRule
    >>> a = Seen(True, np.array([0.9, 0.1]), 50)
    >>> first_stop(StopRule(min_chunks=2, min_lead=0.5), [a, a, a, a], Aggregation.TOKEN_MEAN)
    2
    """
    for n in range(1, len(seen)):  # stopping after the last chunk is reading everything
        if stop_label(rule, seen[:n], aggregation) is not None:
            return n
    return None
