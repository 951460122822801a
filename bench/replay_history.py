"""Replay auto mode with the drafting history on a multi-turn run's replies, pass after pass.

The history starts empty; each reply, once replayed, is kept under its conversation's document (as
``bench.multiturn`` and the app keep it), so later turns and the next pass draft from what came
before. A pass replays every reply once, in the run's order: the second pass is the same work done
again on a history that holds the first.

Also a GPU-like cost table, for asking what the same drafts would give where a batch is nearly free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.engine.auto import LOOKUP_MAX

if TYPE_CHECKING:
    from app.engine.drafting import Proposal
    from bench.replay import Reply, Result, TableCosts


def gpu_ratios(n: int = LOOKUP_MAX + 1) -> list[float]:
    """Verify costs on a laptop GPU, in decode steps, for batches of 1..n: a batch of up to 16 tokens
    costs about one step (1.08 at 16); past it the cost grows to 1.3 steps at 32 and 1.8 at 64
    (assumed, not measured: this machine has no GPU)."""
    points = ((1, 1.0), (16, 1.08), (32, 1.3), (64, 1.8))
    out = []
    for b in range(1, n + 1):
        lo = max(p for p in points if p[0] <= b) if b <= points[-1][0] else points[-2]
        hi = min((p for p in points if p[0] >= b), default=points[-1])
        if hi[0] == lo[0]:
            out.append(lo[1])
        else:
            out.append(round(lo[1] + (hi[1] - lo[1]) * (b - lo[0]) / (hi[0] - lo[0]), 4))
    return out


def conversation_of(reply_id: str) -> str:
    """A multi-turn reply's conversation (its id is ``conversation/turn``)."""
    return reply_id.rsplit("/", 1)[0]


def replay_history(
    replies: Sequence[Reply], costs: TableCosts, max_tokens: int, *, passes: int = 2, model: bool = False
) -> list[tuple[Result, dict[str, float]]]:
    """Per pass: category -> (tokens, cost in steps) of auto mode with the history (and the draft
    model with ``model``), and each reply's speedup. One drafter learns across all passes, as one
    engine would across restarts (its costs and pooled acceptance are re-learned in minutes)."""
    from app.engine.auto import AutoDrafter
    from app.engine.drafting import LookupDrafter
    from app.engine.history.drafter import HistoryDrafter
    from app.engine.history.index import HistoryIndex
    from app.engine.sampling import SamplingParams
    from bench.multiturn import history_doc
    from bench.replay import ReplayDraft, _replay

    stops = replies[0].stops if replies else frozenset()
    history = HistoryDrafter(HistoryIndex(), stops=stops)
    draft = ReplayDraft(costs) if model else None
    auto = AutoDrafter(draft, LookupDrafter(stops=stops), history=history, costs=costs)
    params = SamplingParams()

    def begin(r: Reply) -> float:
        if draft is not None:
            draft.start(r)
        auto.begin(r.prompt)
        return draft.spent if draft is not None else 0.0  # the draft's prompt, where evaluated up front

    def propose(tokens: list[int], room: int) -> Proposal:
        return auto.propose(tokens, room, params, None)  # type: ignore[arg-type]

    out: list[tuple[Result, dict[str, float]]] = []
    for p in range(1, passes + 1):
        result: Result = {}
        per: dict[str, float] = {}
        for r in replies:
            one, speed = _replay([r], costs, max_tokens, begin, propose, auto.observe)
            history.commit(history_doc(conversation_of(r.id), p), [*r.prompt, *r.tokens])
            for cat, (n, c) in one.items():
                n0, c0 = result.get(cat, (0, 0.0))
                result[cat] = (n0 + n, c0 + c)
            per.update(speed)
        out.append((result, per))
    return out
