"""Whether a drafting mode's sampled output follows plain sampling: the joint law of a reply's first
tokens, compared by a two-sample chi-square (for tests of drafters)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from app.engine.sampling import SamplingParams
from app.engine.settings import GenerationSettings


def assert_same_first_tokens_law(
    engine, prompt: list[int], mode: str, *, n: int = 300, tokens: int = 3
) -> None:
    """At temperature 1 (top-k 3), ``n`` replies of ``tokens`` tokens in ``mode`` and in plain decoding
    (seeds 0..n-1, ``n_max`` = ``tokens``, fixed) have the same joint law of their tokens."""
    counts = {}
    for m in ("plain", mode):
        c: Counter = Counter()
        for i in range(n):
            sp = SamplingParams(seed=i, temperature=1.0, top_k=3)
            gs = GenerationSettings(mode=m, sampling=sp, max_tokens=tokens, n_max=tokens, adaptive=False)
            c[engine.run(prompt, gs).tokens] += 1
        counts[m] = c
    keys = sorted(set(counts["plain"]) | set(counts[mode]))
    a = np.array([counts["plain"][k] for k in keys], dtype=float)
    b = np.array([counts[mode][k] for k in keys], dtype=float)
    mask = (a + b) >= 10
    stat = (((a - b) ** 2) / (a + b))[mask].sum()
    dof = max(1, int(mask.sum()) - 1)
    assert stat < 3 * dof + 15, f"chi2={stat:.1f} dof={dof}\nplain={counts['plain']}\n{mode}={counts[mode]}"
