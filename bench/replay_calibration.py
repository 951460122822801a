"""Are auto mode's bets biased? Its drafted rounds on the recorded replies, grouped by the speedup
over plain it expected of each, against the tokens per decode step they delivered, on every
recorded cost table (``bench.replay_tables``)::

    python -m bench.replay_calibration

A round taken at the margin (expected 1.00-1.10x of plain) that delivers less than expected means
the decision rule takes bets that lose; one that delivers as much or more means the rounds that lose
in a short reply are the spread of bets that pay on the whole.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engine.events import Source
from bench.replay import DRAFT_PYTHON, STEP, ReplayDraft, Reply, TableCosts, _replay, accepted, orders

MARGIN = 1.10  # rounds expected below this speedup over plain are the marginal ones


@dataclass
class Tally:
    """Drafted rounds: how many, and their expected tokens, delivered tokens and cost in steps."""

    rounds: int = 0
    expected: float = 0.0
    tokens: float = 0.0
    steps: float = 0.0

    def add(self, expected_speedup: float, tokens: int, steps: float) -> None:
        self.rounds += 1
        self.expected += expected_speedup * steps
        self.tokens += tokens
        self.steps += steps

    def cells(self) -> str:
        if not self.rounds:
            return "0 | - | -"
        return f"{self.rounds} | {self.expected / self.steps:.3f}x | {self.tokens / self.steps:.3f}x"


@dataclass
class Calibration:
    """Per source (``model``, ``lookup``...): the marginal rounds and all drafted rounds."""

    margin: dict[str, Tally] = field(default_factory=dict)
    all: dict[str, Tally] = field(default_factory=dict)


def calibrate(sets: Sequence[tuple[Sequence[Reply], int]], costs: TableCosts, n_orders: int) -> Calibration:
    """Replay auto mode (with the draft model) on each set of replies (with its token budget) in
    ``n_orders`` orders, each from nothing learned, and tally its drafted rounds."""
    out = Calibration()
    for replies, max_tokens in sets:
        for order in orders(replies, n_orders):
            _tally(order, costs, max_tokens, out)
    return out


def _tally(replies: Sequence[Reply], costs: TableCosts, max_tokens: int, out: Calibration) -> None:
    from app.engine.auto import AutoDrafter
    from app.engine.drafting import LookupDrafter
    from app.engine.drafting.base import Proposal
    from app.engine.sampling import SamplingParams

    params = SamplingParams()
    draft = ReplayDraft(costs)
    auto = AutoDrafter(draft, LookupDrafter(stops=replies[0].stops), costs=costs)
    now: list[Reply] = []

    def begin(r: Reply) -> float:
        now[:] = [r]
        draft.start(r)
        auto.begin(r.prompt)
        return draft.spent  # the draft's prompt, where evaluated up front

    def propose(tokens: list[int], room: int) -> Proposal:
        p = auto.propose(tokens, room, params, None)  # type: ignore[arg-type]
        expected = p.decision.expected_speedup if p.decision is not None else None
        if p.tokens and expected:
            r = now[0]
            seconds = costs.verify(1 + len(p.tokens))
            if p.source is Source.MODEL:
                seconds += p.t_sync + p.t_steps + (len(p.tokens) - p.copied) * STEP * DRAFT_PYTHON
            got = accepted(p.tokens, r.tokens, len(tokens) - len(r.prompt)) + 1
            name = p.source.name.lower()
            out.all.setdefault(name, Tally()).add(expected, got, seconds / STEP)
            if expected < MARGIN:
                out.margin.setdefault(name, Tally()).add(expected, got, seconds / STEP)
        return p

    _replay(replies, costs, max_tokens, begin, propose, auto.observe)


def main(argv: list[str] | None = None) -> int:
    from bench.gpu_replay import SETS, load_prepared
    from bench.replay_tables import tables

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=3, help="orders of the replies, each from nothing learned")
    ap.add_argument("--tables", default="", help="comma-separated table names (default: all)")
    args = ap.parse_args(argv)
    sets = [(replies, int(meta["max_tokens"])) for meta, replies in map(load_prepared, SETS.values())]
    print(f"auto mode's drafted rounds on the recorded replies ({', '.join(SETS)}), {args.orders} orders")
    print("(speedups over plain: expected, and delivered in tokens per decode step)\n")
    print(f"| table | source | rounds expected under {MARGIN:.2f}x | expected | delivered "
          "| all drafted rounds | expected | delivered |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    chosen = [t for t in args.tables.split(",") if t]
    for name, (ratios, draft, _) in tables().items():
        if chosen and name not in chosen:
            continue
        cal = calibrate(sets, TableCosts(ratios, draft), args.orders)
        for source, tally in cal.all.items():
            print(f"| {name} | {source} | {cal.margin.get(source, Tally()).cells()} | {tally.cells()} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
