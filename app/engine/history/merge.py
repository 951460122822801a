"""Merging this process's history into the file, as another process sharing the data folder may have
written it since this one last read or wrote it (the store holds the folder's lock meanwhile).

Documents are keyed by id and the most recently written version of each wins. What this process has not
written since it last synchronized is taken from the file (it may hold a newer version), and where the file
no longer has it, another process removed it, forgot everything, or dropped it for the bound: this process
drops it too. The removals (tombstones: id and when) and the time of the last forget of both are kept, so a
version written before either never comes back. The bound holds after the merge: the least recently
written documents go first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.history.fileformat import Contents
from app.engine.history.layout import CRC_BYTES, HEADER_BYTES, KEEP_TOMBSTONES, SEP, Doc, Shared

_DISK, _MINE = 0, 1


@dataclass
class Merged:
    """A merge's result: the store to write, and what this process must drop from its own index."""

    tokens: np.ndarray
    docs: list[tuple[str, Doc]]  # least recently written first
    shared: Shared
    drop: list[str]  # removed, forgotten or superseded elsewhere
    complete: bool  # every document written is this process's version (the file holds nothing else)


def merge_shared(a: Shared, b: Shared) -> Shared:
    """Both processes' removals and forgets (the newest of each); the larger generation."""
    forgotten = max(a.forgotten_at, b.forgotten_at)
    tombs = dict(a.tombstones)
    for doc_id, when in b.tombstones.items():
        if when > tombs.get(doc_id, -1.0):
            tombs[doc_id] = when
    recent = sorted(((t, d) for d, t in tombs.items() if t > forgotten), reverse=True)[:KEEP_TOMBSTONES]
    return Shared(max(a.generation, b.generation), forgotten, {d: t for t, d in reversed(recent)})


def merge(
    disk: Contents,
    tokens: np.ndarray,
    docs: list[tuple[str, Doc]],
    changed: set[str],
    shared: Shared,
    *,
    max_bytes: int,
) -> Merged:
    """Merge this process's store (``tokens`` and ``docs``, as ``HistoryIndex.snapshot`` gives them, of which
    ``changed`` were written since it last synchronized; its removals and forget in ``shared``) into the
    file's (``disk``)."""
    meta = merge_shared(disk.shared, shared)
    chosen: dict[str, tuple[int, Doc]] = {
        doc_id: (_DISK, doc) for doc_id, doc in disk.docs.items() if not meta.dead(doc_id, doc.used)
    }
    drop: list[str] = []
    for doc_id, doc in docs:
        had = chosen.get(doc_id)
        if meta.dead(doc_id, doc.used):
            drop.append(doc_id)
        elif doc_id in changed:
            if had is None or doc.used >= had[1].used:
                chosen[doc_id] = (_MINE, doc)
            else:  # another process wrote a newer version since
                drop.append(doc_id)
        elif had is None or had[1].used != doc.used:  # gone from the file, or a newer version there
            drop.append(doc_id)
        else:
            chosen[doc_id] = (_MINE, doc)  # the same version
    order = sorted(chosen, key=lambda d: chosen[d][1].used)
    fixed = HEADER_BYTES + len(disk.fingerprint.encode()) + CRC_BYTES + meta.nbytes() + 4
    total = fixed + sum(4 * (d.n + len(d.runs)) + d.nbytes() for _, d in chosen.values())
    first = 0
    while total > max_bytes and len(order) - first > 1:  # the least recently written go first
        old = chosen[order[first]][1]
        total -= 4 * (old.n + len(old.runs)) + old.nbytes()
        first += 1
    order = order[first:]
    sources = (disk.tokens, tokens)
    parts, out, at = [np.full(1, SEP, np.int32)], [], 1
    for doc_id in order:  # each document's runs, one after another
        src, doc = chosen[doc_id]
        runs = []
        for a, b in doc.runs:
            parts.append(sources[src][a : b + 1])
            runs.append([at, at + b - a])
            at += b - a + 1
        out.append((doc_id, Doc(runs, _moved(doc.text, doc.runs, runs), doc.used, doc.n, doc.id_bytes)))
    complete = all(chosen[d][0] == _MINE for d in order)
    return Merged(np.concatenate(parts), out, meta, drop, complete)


def _moved(text: list[list[int]], old: list[list[int]], new: list[list[int]]) -> list[list[int]]:
    """The ranges ``text`` (each within one of the runs ``old``) where the runs moved to ``new``."""
    moved = []
    for x, y in text:
        for (a, b), (na, _) in zip(old, new, strict=True):
            if a <= x and y <= b:
                moved.append([na + x - a, na + y - a])
                break
    return moved
