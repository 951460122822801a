"""The token history of many documents, indexed by K-gram: where the context's last tokens occurred
before, and what followed them.

Layout: every document's tokens sit in one int32 array. A document is one or more runs (its tokens
appended since another document's), each followed by a separator ``SEP``; index 0 holds a ``SEP``
sentinel. Tokens of removed documents are marked ``DEAD`` until :meth:`HistoryIndex.compact` drops them.

An index entry is a K-gram with a continuation: the position ``p`` where the continuation starts, keyed
by a polynomial rolling hash (uint64, wrapping) of ``tokens[p - K:p]``, where those K tokens and
``tokens[p]`` are all tokens (no separator). An entry is one uint64: the hash's top 32 bits (the key)
over the position (32 bits), so one ``np.sort`` orders the entries by key, then position (faster than a
stable ``argsort`` of the keys, and 8 bytes an entry instead of 12), and ``np.searchsorted`` finds a
key's occurrences, oldest first. The entries added since the last merge sit in a dict
``{key: [positions]}``, merged into the array (``np.insert``, no re-sort) once it holds
max(``MERGE_MIN``, entries / 256). A hash collision only adds a candidate that the match measurement
rejects. Memory: 4 bytes a token plus 8 an entry (about 12 bytes a token in all).

Costs (N tokens stored): ``add`` O(1) per token plus the amortized merge (at most 256 entries moved
per token added, as a merge moves N entries once per N / 256 added);
``lookup`` O(log N) plus the match measurement over at most ``SCAN`` occurrences; ``continuation``
O(candidates x length); a full rebuild (loading) O(N log N); compaction O(N). ``timing.measure``
measures them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from app.engine.history.layout import (
    CRC_BYTES,
    DEAD,
    HEADER_BYTES,
    MASK,
    POS,
    SEP,
    Doc,
    cut,
    gram_key,
    gram_keys,
    pack,
)

FEW = 8  # up to this many candidates, the match is measured in a Python loop
SCAN = 1024  # the most recent occurrences of a K-gram whose match is measured
MERGE_MIN = 4096  # the dict of recent entries is merged in at max(MERGE_MIN, entries / 256)
TRANSIENT = "\0"  # documents whose id begins with it are never saved
_STATE = ("_buf", "_n", "_docs", "_live", "_runs", "_table", "_dead", "_entries", "_pending", "_last_used")
_BLOCKS = (8, 16, 32)  # tokens compared per step after the K-gram itself (then the last size repeats)


@dataclass
class _Pending:
    entries: dict[int, list[int]] = field(default_factory=dict)
    count: int = 0


class HistoryIndex:
    """Documents of token ids in one store, searchable for the context's end (see the module doc).

    Bounded by ``max_bytes`` (the saved file's size): over it, the least recently written documents
    go first (never the most recent one). Thread-safe: every public method holds one lock.
    """

    def __init__(self, *, k: int = 4, max_bytes: int = 64 << 20, fingerprint: str = ""):
        if not 1 <= k <= 16:
            raise ValueError(f"k must be within 1..16, not {k}")
        if max_bytes > 8 << 30:
            raise ValueError("max_bytes above 8 GB: positions are stored as 32-bit")
        self.k = k
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint
        self._lock = threading.RLock()
        self._last_used = 0.0
        self._set_store(np.full(1, SEP, np.int32), {})

    def _now(self) -> float:
        """time.time(), strictly increasing: the order documents were written in."""
        self._last_used = max(time.time(), self._last_used + 1e-6)
        return self._last_used

    def _set_store(self, tokens: np.ndarray, docs: dict[str, Doc]) -> None:
        self._buf = np.empty(max(1024, 2 * len(tokens)), np.int32)
        self._buf[: len(tokens)] = tokens
        self._n = len(tokens)
        self._docs = docs
        self._live = sum(d.n for d in docs.values())
        self._runs = sum(len(d.runs) for d in docs.values())
        self._table = sum(d.nbytes() for d in docs.values())
        self._dead = int(np.count_nonzero(tokens == DEAD))
        self._pending = _Pending()
        self._last_used = max((d.used for d in docs.values()), default=self._last_used)
        self._rebuild()

    # -- reading ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        """The size of the file :func:`app.engine.history.store.save` writes (with the transient
        documents, which it leaves out)."""
        fixed = HEADER_BYTES + len(self.fingerprint.encode()) + CRC_BYTES
        return fixed + 4 * (1 + self._live + self._runs) + self._table

    def documents(self, *, transient: bool = False) -> list[str]:
        """The documents' ids, least recently written first; ``transient``: with those whose id begins
        with ``TRANSIENT`` (a drafter's request in progress), never saved."""
        with self._lock:
            ids = sorted(self._docs, key=lambda d: self._docs[d].used)
            return ids if transient else [d for d in ids if not d.startswith(TRANSIENT)]

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._docs

    def tokens(self, doc_id: str) -> np.ndarray:
        """The latest version of a document (empty if unknown)."""
        with self._lock:
            doc = self._docs.get(doc_id)
            return self._gather(doc.text) if doc else np.empty(0, np.int32)

    def _gather(self, ranges: Iterable[Sequence[int]]) -> np.ndarray:
        parts = [self._buf[a:b] for a, b in ranges]
        return np.concatenate(parts) if parts else np.empty(0, np.int32)

    def lookup(
        self, context: Sequence[int], *, max_candidates: int = 64, max_match: int = 64
    ) -> tuple[int, np.ndarray]:
        """The longest match of ``context``'s end (at least K tokens, at most ``max_match``) and the
        positions where the continuations of the most recent ``max_candidates`` such matches start.

        The match is measured backwards token by token, as prompt lookup does; (0, empty) if none.
        """
        k = self.k
        limit = min(max(max_match, k), len(context))
        if limit < k:
            return 0, np.empty(0, np.int64)
        with self._lock:
            key = gram_key([int(t) for t in context[-k:]]) >> 32
            bounds = np.array([key << 32, min((key + 1) << 32, MASK)], np.uint64)
            lo, hi = np.searchsorted(self._entries, bounds)
            cands = (self._entries[max(lo, hi - SCAN) : hi] & POS).astype(np.int64)
            recent = self._pending.entries.get(key)
            if recent:
                cands = np.concatenate((cands, np.asarray(recent, np.int64)))[-SCAN:]
            if not cands.size:
                return 0, cands
            rev = context[-limit:][::-1]
            best, cands = self._longest(cands, rev.tolist() if isinstance(rev, np.ndarray) else rev)
        return (best, cands[-max_candidates:]) if best >= k else (0, np.empty(0, np.int64))

    def _longest(self, cands: np.ndarray, rev: Sequence[int]) -> tuple[int, np.ndarray]:
        """The longest match before ``cands`` of ``rev`` (the context's end, reversed: ``rev[d]`` is the
        token ``d + 1`` back), and the candidates that reach it."""
        toks, limit = self._buf[: self._n], len(rev)
        if len(cands) <= FEW:  # a copy in progress: a Python loop beats numpy's per-call overhead
            lengths = []
            for c in cands.tolist():
                seg = toks[max(0, c - limit) : c].tolist()  # index 0 is a separator: a match stops there
                m, n = 0, len(seg)
                while m < n and seg[n - 1 - m] == rev[m]:
                    m += 1
                lengths.append(m)
            best = max(lengths)
            return best, cands[np.array(lengths) == best]
        want = np.array(rev, np.int32)
        d, width, blocks = 0, self.k, iter(_BLOCKS)
        while True:  # compare block by block: the candidates that match a whole block go on
            w = min(width, limit - d)
            win = np.take(toks, cands[:, None] - np.arange(d + 1, d + w + 1), mode="clip")
            eq = win == want[d : d + w]
            full = eq.all(axis=1)
            if not full.any():
                lengths = d + np.argmin(eq, axis=1)
                best = int(lengths.max())
                return best, cands[lengths == best]
            cands, d = cands[full], d + w
            if d >= limit:
                return d, cands
            width = next(blocks, width)

    def continuation(
        self, positions: Sequence[int] | np.ndarray, max_len: int, min_prob: float
    ) -> tuple[list[int], list[float]]:
        """The most frequent continuation of ``positions``, token by token, with each token's share of
        the candidates still in play (those that agreed so far). Stops before a token whose share is
        under ``min_prob``, at a separator, or at ``max_len`` tokens."""
        cands = np.asarray(positions, np.int64)
        if not cands.size or max_len <= 0:
            return [], []
        with self._lock:
            if len(cands) == 1:  # one occurrence: copy it up to a separator
                seg = self._buf[int(cands[0]) : min(int(cands[0]) + max_len, self._n)].tolist()
                seg = seg[: next((i for i, t in enumerate(seg) if t < 0), len(seg))]
                return seg, [1.0] * len(seg)
            # clip: past the store's end reads its last separator
            rows = np.take(self._buf[: self._n], cands[:, None] + np.arange(max_len), mode="clip")
        out: list[int] = []
        probs: list[float] = []
        j = 0
        while j < max_len:
            first = rows[0]
            stop = ~(rows == first).all(axis=0) | (first < 0)  # columns not unanimous, or a separator
            stop[:j] = False
            end = int(np.argmax(stop)) if stop.any() else max_len
            out += first[j:end].tolist()
            probs += [1.0] * (end - j)
            j = end
            if j >= max_len or (first[j] < 0 and (rows[:, j] == first[j]).all()):
                break
            col = rows[:, j]
            vals, counts = np.unique(col, return_counts=True)
            top = vals[counts == counts.max()]
            tok = top[0] if len(top) == 1 else next(t for t in col[::-1] if t in top)  # ties: the newest
            p = float(np.count_nonzero(col == tok)) / len(col)
            if tok < 0 or p < min_prob:
                break
            out.append(int(tok))
            probs.append(p)
            rows = rows[col == tok]
            j += 1
        return out, probs

    # -- writing ------------------------------------------------------------------------------------

    def add(self, doc_id: str, tokens: Sequence[int] | np.ndarray) -> None:
        """Append ``tokens`` to a document (created if new). A document whose run ends the store grows
        in place; otherwise its new tokens start a new run at the end."""
        small = len(tokens) <= 16 and not isinstance(tokens, np.ndarray)  # skip numpy's call overhead
        toks = [int(t) for t in tokens] if small else np.asarray(tokens, np.int32)
        if len(toks) and min(toks) < 0:
            raise ValueError("token ids must be >= 0")
        with self._lock:
            doc = self._docs.get(doc_id)
            if doc is None:
                doc = self._docs[doc_id] = Doc([], [], self._now(), id_bytes=len(doc_id.encode()))
                self._table += doc.nbytes()
            doc.used = self._now()
            if not len(toks):
                return
            before = doc.nbytes()
            self._reserve(len(toks) + 1)
            run = doc.runs[-1] if doc.runs else None
            if run is None or run[1] != self._n - 1:
                run = [self._n, self._n]
                doc.runs.append(run)
                self._runs += 1
            a, b = run[1], run[1] + len(toks)
            self._buf[a:b] = toks
            self._buf[b] = SEP
            self._n = b + 1
            run[1] = b
            if doc.text and doc.text[-1][1] == a:
                doc.text[-1][1] = b
            else:
                doc.text.append([a, b])
            doc.n += len(toks)
            self._live += len(toks)
            self._table += doc.nbytes() - before
            self._index_positions(max(a, run[0] + self.k), b)
            self._evict()

    def absorb(self, src_id: str, doc_id: str) -> int:
        """Make document ``src_id``'s text the latest version of ``doc_id``, keeping only what is new:
        the tokens after their common prefix with ``doc_id``'s latest version move to ``doc_id`` (a new
        version of a conversation repeats the earlier turns); the rest of ``src_id`` is removed.
        Returns how many tokens ``doc_id`` gained."""
        with self._lock:
            src = self._docs.get(src_id)
            if src is None or src_id == doc_id:
                return 0
            dst = self._docs.get(doc_id)
            if dst is None:  # a new document: rename
                self._table -= src.nbytes()
                self._docs[doc_id] = self._docs.pop(src_id)
                src.id_bytes, src.used = len(doc_id.encode()), self._now()
                self._table += src.nbytes()
                return src.n
            old, new = self._gather(dst.text), self._gather(src.text)
            m = min(len(old), len(new))
            diff = np.flatnonzero(old[:m] != new[:m])
            p = int(diff[0]) if diff.size else m
            head, _ = cut(dst.text, p)
            _, tail = cut(src.text, p)
            saved = [self._buf[a:b].copy() for a, b in tail]
            self._remove(src_id)
            before = dst.nbytes()
            gained = 0
            for (a, b), vals in zip(tail, saved, strict=True):
                self._buf[a:b] = vals
                self._buf[b] = SEP
                dst.runs.append([a, b])
                gained += b - a
            self._dead -= gained + len(tail)
            dst.text = head + [list(r) for r in tail]
            dst.n += gained
            dst.used = self._now()
            self._live += gained
            self._runs += len(tail)
            self._table += dst.nbytes() - before
            return gained

    def remove(self, doc_id: str) -> None:
        with self._lock:
            if doc_id in self._docs:
                self._remove(doc_id)
                self._maybe_compact()

    def _remove(self, doc_id: str) -> None:
        doc = self._docs.pop(doc_id)
        for a, b in doc.runs:
            self._buf[a : b + 1] = DEAD  # a dead separator still stops a match and a continuation
            self._dead += b + 1 - a
        self._live -= doc.n
        self._runs -= len(doc.runs)
        self._table -= doc.nbytes()

    def clear(self) -> None:
        with self._lock:
            self._set_store(np.full(1, SEP, np.int32), {})

    def adopt(self, other: HistoryIndex) -> None:
        """Take over ``other``'s documents (a loaded file) and K; this index's own documents (the
        latest version of each) are appended after them, as the most recent."""
        with self._lock, other._lock:
            mine = [(d, self._gather(self._docs[d].text)) for d in self.documents(transient=True)]
            self.k = other.k
            for name in _STATE:
                setattr(self, name, getattr(other, name))
            other.clear()
            for doc_id, toks in mine:
                self.remove(doc_id)
                self.add(doc_id, toks)

    def _reserve(self, extra: int) -> None:
        if self._n + extra > len(self._buf):
            buf = np.empty(max(2 * len(self._buf), self._n + extra), np.int32)
            buf[: self._n] = self._buf[: self._n]
            self._buf = buf

    def _index_positions(self, lo: int, hi: int) -> None:
        """Index the K-grams ending at positions ``lo`` .. ``hi - 1`` (all inside one run)."""
        if hi <= lo:
            return
        k, pend = self.k, self._pending
        if pend.count + hi - lo > max(MERGE_MIN, len(self._entries) >> 8):
            self._merge(gram_keys(self._buf[lo - k : hi - 1], k), np.arange(lo, hi, dtype=np.int32))
            return
        seg = self._buf[lo - k : hi].tolist()
        for i in range(hi - lo):
            pend.entries.setdefault(gram_key(seg[i : i + k]) >> 32, []).append(lo + i)
        pend.count += hi - lo

    def _merge(self, keys: np.ndarray | None = None, pos: np.ndarray | None = None) -> None:
        """Move the recent entries (and K-gram hashes ``keys`` at positions ``pos``) into the array."""
        pend = self._pending
        new = pack(keys, pos) if keys is not None and pos is not None else np.empty(0, np.uint64)
        if pend.count:
            recent = np.fromiter(
                ((key << 32) | p for key, ps in pend.entries.items() for p in ps), np.uint64, count=pend.count
            )
            new = np.concatenate((recent, new))
            self._pending = _Pending()
        if new.size:
            new.sort()
            self._entries = np.insert(self._entries, np.searchsorted(self._entries, new), new)

    def _rebuild(self) -> None:
        """Index the whole store (vectorized: the hashes, then one sort)."""
        k, toks = self.k, self._buf[: self._n]
        pos = np.arange(k, self._n, dtype=np.int64)
        neg = np.concatenate(([0], np.cumsum(toks < 0, dtype=np.int64)))
        ok = neg[pos + 1] == neg[pos - k]  # no separator in the gram nor at its continuation
        self._entries = np.sort(pack(gram_keys(toks, k)[: len(pos)][ok], pos[ok]))
        self._pending = _Pending()

    def snapshot(self) -> tuple[np.ndarray, list[tuple[str, Doc]]]:
        """The store as a file holds it: its tokens without the removed and the transient documents',
        and the other documents (least recently written first) with their ranges moved to match."""
        with self._lock:
            toks = self._buf[: self._n].copy()
            for doc_id, doc in self._docs.items():
                if doc_id.startswith(TRANSIENT):
                    for a, b in doc.runs:
                        toks[a : b + 1] = DEAD
            keep = toks != DEAD
            new = np.cumsum(keep, dtype=np.int64) - 1
            docs = []
            for doc_id in self.documents():
                doc = self._docs[doc_id]
                runs = [[int(new[a]), int(new[b])] for a, b in doc.runs]
                text = [[int(new[a]), int(new[b - 1]) + 1] for a, b in doc.text]
                docs.append((doc_id, Doc(runs, text, doc.used, doc.n, doc.id_bytes)))
            return toks[keep], docs

    def compact(self) -> None:
        """Drop the removed documents' tokens (and their index entries) from the store. O(N)."""
        with self._lock:
            if not self._dead:
                return
            self._merge()
            toks = self._buf[: self._n]
            keep = toks != DEAD
            new = np.cumsum(keep, dtype=np.int64) - 1  # each kept index's new place
            pos = (self._entries & POS).astype(np.int64)
            neg = np.concatenate(([0], np.cumsum(toks < 0, dtype=np.int64)))
            ok = neg[pos + 1] == neg[pos - self.k]
            # positions move down in order: the entries stay sorted
            self._entries = (self._entries[ok] & ~POS) | new[pos[ok]].astype(np.uint64)
            for doc in self._docs.values():
                doc.runs = [[int(new[a]), int(new[b])] for a, b in doc.runs]
                doc.text = [[int(new[a]), int(new[b - 1]) + 1] for a, b in doc.text]
            kept = toks[keep]
            self._buf = np.empty(max(1024, 2 * len(kept)), np.int32)
            self._buf[: len(kept)] = kept
            self._n, self._dead = len(kept), 0

    def _maybe_compact(self) -> None:
        if self._dead > max(1 << 16, self._live // 2):
            self.compact()

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and len(self._docs) > 1:
            self._remove(min(self._docs, key=lambda d: self._docs[d].used))
        self._maybe_compact()
