"""What the drafter tests share: whether a mode's sampled output follows plain sampling (the joint law
of a reply's first tokens, by a two-sample chi-square), and whether a drafter stays in step with the
text across rejections, a cancel and a new turn."""

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


def rounds(events) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each round's drafted and accepted counts and its tokens."""
    from app.engine.events import Step

    return [(e.n_drafted, e.n_accepted, e.tokens) for e in events if isinstance(e, Step)]


def assert_stays_in_step(load, greedy: GenerationSettings, prompts: tuple[str, ...], check=None) -> None:
    """After replies with rejections, a cancelled reply and a regenerated one, the drafter drafts a new
    turn exactly as a freshly loaded engine does (``check(engine)``: more to assert before it closes)."""
    from app.engine.engine import Engine
    from app.engine.events import Step

    with Engine(load) as eng:
        first = eng.tokenize(prompts[0])
        reply = eng.run(first, greedy)
        assert reply.stats.n_accepted < reply.stats.n_drafted  # rejections happened
        stream = eng.generate(eng.tokenize(prompts[1]), greedy)
        for event in stream:
            if isinstance(event, Step):
                break
        stream.close()  # cancelled after one round
        again = eng.run(first, greedy)  # regenerated: the same reply
        assert again.tokens == reply.tokens
        turn = [*first, *reply.tokens, *eng.tokenize(" and then")]
        seen = rounds(eng.generate(turn, greedy))
        if check is not None:
            check(eng)
    with Engine(load) as fresh:
        assert rounds(fresh.generate(turn, greedy)) == seen
