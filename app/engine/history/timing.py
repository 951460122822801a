"""A micro-benchmark of the history index: what its calls cost on an index of a given size."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.engine.history.index import HistoryIndex
from app.engine.history.layout import SEP

VOCAB = 32_000
DOC_TOKENS = 2_000


def synthetic_documents(n_tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Documents of Zipf-distributed token ids; half of each one's chunks repeat a passage of an earlier
    document (as revised code and re-sent files do)."""
    rng = np.random.default_rng(seed)
    docs: list[np.ndarray] = []
    total = 0
    while total < n_tokens:
        n = min(DOC_TOKENS, n_tokens - total)
        toks = (rng.zipf(1.3, n) - 1) % VOCAB
        if docs:
            for at in range(0, n - 64, 128):
                if rng.random() < 0.5:
                    src = docs[rng.integers(len(docs))]
                    a = rng.integers(0, max(1, len(src) - 64))
                    piece = src[a : a + 64]
                    toks[at : at + len(piece)] = piece
        docs.append(toks.astype(np.int32))
        total += n
    return docs


def measure(n_tokens: int = 1_000_000, *, calls: int = 2_000, seed: int = 0) -> dict[str, float]:
    """Median microseconds per call on an index of ``n_tokens`` synthetic tokens: ``add`` (one token to a live
    document, merges included), ``lookup`` of a context found in the index and ``lookup_miss`` of one
    that is not, ``continuation`` (up to 16 tokens, ``min_prob`` 0.5) of what ``lookup`` found, both
    again for contexts that end in a K-gram seen 100 times or more (``*_common``: many candidates); and
    ``rebuild_ms``, indexing the whole store at once (as loading does)."""
    rng = np.random.default_rng(seed)
    index = HistoryIndex(max_bytes=8 << 30)
    for i, doc in enumerate(synthetic_documents(n_tokens, seed)):
        index.add(f"doc{i}", doc)
    index.compact()
    t0 = time.perf_counter()
    index._rebuild()
    rebuild = time.perf_counter() - t0

    store = index._buf[: index._n]
    ends = rng.integers(64, len(store), calls * 4)
    contexts = [store[e - 64 : e].tolist() for e in ends if (store[e - 64 : e] != SEP).all()][:calls]
    found = [index.lookup(ctx) for ctx in contexts]
    # the worst case: the context ends in a K-gram seen hundreds of times, after text never seen
    _, first, counts = np.unique(index._entries >> np.uint64(32), return_index=True, return_counts=True)
    common = (index._entries[first[counts >= 100]] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    grams = [store[p - index.k : p].tolist() for p in rng.choice(common, calls)] if common.size else []
    commons = [rng.integers(VOCAB, 2 * VOCAB, 60).tolist() + g for g in grams]
    found_common = [index.lookup(ctx) for ctx in commons]
    misses = [rng.integers(VOCAB, 2 * VOCAB, 64).tolist() for _ in range(calls)]
    live = rng.integers(0, VOCAB, calls).tolist()
    index.add("live", live[:8])
    return {
        "add": _median_us(lambda tok: index.add("live", (tok,)), live),
        "lookup": _median_us(index.lookup, contexts),
        "lookup_miss": _median_us(index.lookup, misses),
        "continuation": _median_us(lambda c: index.continuation(c[1], 16, 0.5), found),
        "lookup_common": _median_us(index.lookup, commons),
        "continuation_common": _median_us(lambda c: index.continuation(c[1], 16, 0.5), found_common),
        "rebuild_ms": rebuild * 1e3,
    }


def _median_us(call: Callable[[Any], object], args: Sequence[Any]) -> float:
    """The median time of ``call(arg)`` over ``args``, in microseconds (robust to a busy machine)."""
    times = np.empty(len(args))
    for i, arg in enumerate(args):
        t0 = time.perf_counter()
        call(arg)
        times[i] = time.perf_counter() - t0
    return float(np.median(times)) * 1e6
