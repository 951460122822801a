"""The history store's layout: separators, K-gram hashes, index entries, document records, and the
sizes of the saved file (see :mod:`.store`) that bound the index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SEP = -1  # between runs (and the sentinel at index 0)
DEAD = -2  # tokens (and separators) of removed documents, until compaction
MASK = (1 << 64) - 1
POS = np.uint64((1 << 32) - 1)  # an entry's low 32 bits: its position
_B = 0x9E3779B97F4A7C15  # the hash's odd multiplier
# The saved file: a header and the fingerprint, the tokens (int32, separators and the sentinel
# included), per document a record and its ranges (two uint32 each), the removed documents' ids, a CRC32.
HEADER_BYTES = 64
DOC_RECORD_BYTES = 18
RANGE_BYTES = 8
TOMBSTONE_BYTES = 10  # an id's length u16 and when it was removed f64, then the id
CRC_BYTES = 4
KEEP_TOMBSTONES = 4096  # the most recent removals a file remembers


def file_limit(max_bytes: int) -> int:
    """The largest file the store reads for a bound of ``max_bytes``: the bound, the removals' record and
    a margin (the most recent document is kept even if it alone is over the bound)."""
    return max_bytes + max_bytes // 8 + (1 << 20)


@dataclass
class Shared:
    """What a file tells the processes that share it, beyond its documents: how many times it was written
    (``generation``), when everything was last forgotten, and when each recently removed document was."""

    generation: int = 0
    forgotten_at: float = 0.0
    tombstones: dict[str, float] = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(TOMBSTONE_BYTES + len(d.encode()) for d in self.tombstones)

    def dead(self, doc_id: str, used: float) -> bool:
        """Whether a version of ``doc_id`` written at ``used`` was forgotten or removed since."""
        return used <= self.forgotten_at or used <= self.tombstones.get(doc_id, -1.0)


def gram_keys(tokens: np.ndarray, k: int) -> np.ndarray:
    """The rolling hash of every ``k``-gram of ``tokens``: ``keys[i]`` covers ``tokens[i:i + k]``."""
    m = len(tokens) - k + 1
    if m <= 0:
        return np.empty(0, np.uint64)
    t = tokens.astype(np.uint64)  # separators wrap to huge values; their grams are never indexed
    h = t[:m].copy()
    b = np.uint64(_B)
    for j in range(1, k):
        h *= b  # uint64 arithmetic wraps: the hash is modulo 2**64
        h += t[j : j + m]
    return h


def gram_key(gram: Sequence[int]) -> int:
    """The hash of one K-gram, as :func:`gram_keys` computes it."""
    h = 0
    for t in gram:
        h = (h * _B + t) & MASK
    return h


def pack(hashes: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Index entries: the hash's top 32 bits (the key) over the position."""
    return (hashes & ~POS) | pos.astype(np.uint64)


@dataclass
class Doc:
    """A document of the store."""

    runs: list[list[int]]  # [start, end): ``end`` is the run's separator
    text: list[list[int]]  # the ranges whose tokens make its latest version (within its runs)
    used: float  # when it was last written (time.time())
    n: int = 0  # tokens in its runs
    id_bytes: int = 0  # its id's length in UTF-8

    def nbytes(self) -> int:
        """Its record's size in the file."""
        return DOC_RECORD_BYTES + self.id_bytes + RANGE_BYTES * (len(self.runs) + len(self.text))


def cut(ranges: list[list[int]], p: int) -> tuple[list[list[int]], list[list[int]]]:
    """Split ``ranges`` after their first ``p`` tokens."""
    head: list[list[int]] = []
    for i, (a, b) in enumerate(ranges):
        if p >= b - a:
            head.append([a, b])
            p -= b - a
            continue
        if p:
            head.append([a, a + p])
        return head, [[a + p, b]] + [list(r) for r in ranges[i + 1 :]]
    return head, []
