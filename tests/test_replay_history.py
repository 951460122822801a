"""bench.replay_history: auto mode with the drafting history replayed over multi-turn replies."""

from __future__ import annotations

from itertools import pairwise

import pytest

from app.engine.auto import LOOKUP_MAX
from bench.replay import Reply, TableCosts, replay_auto
from bench.replay_history import conversation_of, gpu_ratios, replay_history

EPYC = TableCosts([1.0, 1.77, 2.49, 3.25, 3.76, 4.28, 5.45, 6.61, 6.98, 7.34, 7.71, 8.07, 8.0, 8.0, 8.0, 8.0])


def _conversation(name: str, base: int) -> list[Reply]:
    """A first turn that writes 120 tokens of prose, then a revision that repeats it with one edit."""
    first = list(range(base, base + 120))
    revised = [*first[:60], 7, *first[61:]]
    ask = [1, 2, base // 100]
    return [
        Reply(f"{name}/1", "first", ask, first, [0.6] * 120),
        Reply(f"{name}/2", "revision", [*ask, *first, 3, 4], revised, [0.95] * 120),
    ]


def test_the_history_makes_the_second_pass_faster_and_never_changes_what_lookup_alone_gets() -> None:
    replies = [*_conversation("a", 1000), *_conversation("b", 3000)]
    (one, _), (two, per) = replay_history(replies, EPYC, max_tokens=256)
    speed = {cat: n / cost for cat, (n, cost) in one.items()}
    again = {cat: n / cost for cat, (n, cost) in two.items()}
    assert speed["first"] == pytest.approx(1.0)  # nothing to copy yet: plain decoding
    assert speed["revision"] > 1.2  # the revision copies the first turn from its own prompt
    assert again["first"] > 1.5 and again["revision"] >= speed["revision"]  # the history knows both
    assert set(per) == {r.id for r in replies}
    lookup = replay_auto(replies, EPYC, max_tokens=256)  # auto mode without the history, one pass
    assert lookup["first"] == one["first"]


def test_a_gpu_table_makes_batches_of_up_to_16_nearly_free() -> None:
    r = gpu_ratios()
    assert len(r) == LOOKUP_MAX + 1 and r[0] == 1.0
    assert r[15] == pytest.approx(1.08) and r[31] == pytest.approx(1.3) and r[63] == pytest.approx(1.8)
    assert all(a <= b for a, b in pairwise(r))
    assert conversation_of("code-stack/3") == "code-stack"
