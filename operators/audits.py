"""Which settled chunks, and which stopped documents, the live test of the guarantee
re-reads with the full model."""

from __future__ import annotations

import hashlib
import secrets

# The audit draw's key, new in every process: a producer who knows the draw could pick
# ids that are never audited (a drift the live test would not see) or always (the full
# model's cost on demand). Within a process the draw is the same for a chunk every time
# it is asked, which is all the cascade needs; after a restart the draw is a new one.
_AUDIT_KEY = secrets.token_bytes(32)


def audit_pick(doc_id: str, index: int, fraction: float) -> bool:
    """A keyed draw, the same for a chunk within this process: audit this settled chunk?

    >>> audit_pick("d", 0, 0.0), audit_pick("d", 0, 1.0)
    (False, True)
    """
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{doc_id}/{index}".encode(), digest_size=8, key=_AUDIT_KEY).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


def stop_audit_pick(doc_id: str, fraction: float) -> bool:
    """A keyed draw of a document the certified stop ended early: read it to its end with
    the full model too, for the live test of the stop?

    >>> stop_audit_pick("d", 0.0), stop_audit_pick("d", 1.0)
    (False, True)
    """
    return audit_pick(doc_id, -1, fraction)  # no chunk has index -1: a draw of its own
