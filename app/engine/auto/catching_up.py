"""What catching a paused draft model up with the text costs a round (part of
:class:`~.model_rounds.ModelRounds`).

The draft falls behind by every token decoded without it; the round that drafts with it again first
evaluates what it missed, as one batch. That batch's cost is learned from the catch-ups timed (on a
GPU a batch of hundreds costs about what one of a few does; on a CPU it grows with its size), kept in
the memory file in decode steps, and a round is charged its share of it over the model rounds it is
expected to serve.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.engine.auto.priors import HORIZON, SERVED_RUNS, SYNC_SHARE, SYNC_SPREAD, TOKENS_PER_ROUND

if TYPE_CHECKING:
    from app.engine.auto.costs import CostModel, Window
    from app.engine.drafting.model import ModelDrafter


class CatchingUp:
    """The catch-up rules of :class:`~.model_rounds.ModelRounds`, which holds their state."""

    # what ModelRounds holds and these rules read (see its constructor)
    model: ModelDrafter
    costs: CostModel
    cls: int
    amortized: float
    sync_cost: Window
    _syncs: deque[tuple[int, float]]
    _saved_syncs: list[tuple[int, float]]
    _class_share: list[float]
    _runs: deque[int]
    _served: Window

    def sync_per_token(self, draft_cost: float) -> float:
        """What one more token of a catch-up costs the draft, in seconds (a batch: cheaper than drafting).

        Once catch-ups of sizes at least SYNC_SPREAD apart have been timed, their cost's slope in
        the batch's size: on a GPU a batch of hundreds costs little more than one of a few, and what
        a few cost per token would price the prompt's catch-up tens of times too high. Until then,
        their median cost per token (a CPU's cost grows with the batch)."""
        self._restore_syncs()
        if not self.sync_cost.n:
            return SYNC_SHARE * draft_cost
        per_token = self.sync_cost.value
        sizes = [n for n, _ in self._syncs]
        if len(sizes) < 3 or max(sizes) < SYNC_SPREAD * min(sizes):
            return per_token
        n_mean = statistics.fmean(sizes)
        t_mean = statistics.fmean(t for _, t in self._syncs)
        var = sum((n - n_mean) ** 2 for n in sizes)
        slope = sum((n - n_mean) * (t - t_mean) for n, t in self._syncs) / var
        return min(per_token, max(slope, min(t / n for n, t in self._syncs)))

    def _restore_syncs(self) -> None:
        """An earlier session's catch-ups, kept in decode steps, in seconds once a step is timed."""
        if not self._saved_syncs:
            return
        step = self.costs.verify(1)
        if step is None:
            return
        for n, steps in self._saved_syncs:
            self.sync_cost.add(steps * step / n)
            self._syncs.append((n, steps * step))
        self._saved_syncs = []

    def catch_up(self, tokens: Sequence[int], draft_cost: float, rest: int, copy_share: float) -> float:
        """A round's share of what catching the draft up with the text costs (0 when it kept up).

        The draft falls behind by every token decoded without it. Catching up serves the model
        rounds that follow in this reply too, until the draft falls behind again, so a round is
        charged its share over the fewer of: the rounds of the same class expected in what is left
        of the reply (how often this reply has been in the class, times the rounds left at a few
        tokens each; ``rest`` tokens, counted as ``HORIZON`` at most); the model rounds a catch-up
        has served lately in this reply (once it has had a few; until then in earlier replies); and
        the rounds expected before a copy is drafted again (one in 1 / ``copy_share`` of this
        reply's recent rounds), which leaves the draft behind as plain decoding does. In a JSON
        reply or a code edit where copies and model rounds take turns, each model round needs its
        own catch-up.
        """
        # up to 2 are a drafted round's own (its last draft token and the target's), the rest is lag
        behind = self.model.pending(tokens) - 2
        if behind <= 0:
            self.amortized = 1.0
            return 0.0
        rounds_left = min(rest, HORIZON) / TOKENS_PER_ROUND
        spread = self._class_share[self.cls] * rounds_left
        if len(self._runs) > SERVED_RUNS:  # the last run is still going on
            spread = min(spread, statistics.median(list(self._runs)[:-1]))
        elif self._served.n >= SERVED_RUNS + 1:  # until then: what catch-ups served in earlier replies
            spread = min(spread, self._served.value)
        if copy_share > 0:  # copies leave the draft behind again
            spread = min(spread, 1.0 / copy_share)
        self.amortized = max(1.0, spread)
        return behind * self.sync_per_token(draft_cost) / self.amortized

    def syncs_state(self) -> list[list[float]]:
        """The recent catch-ups for the memory file, in decode steps (tokens, steps): a session prices
        catch-ups by their slope from its start."""
        step = self.costs.verify(1)
        if not step:
            return [[n, steps] for n, steps in self._saved_syncs]
        return [[n, round(t / step, 4)] for n, t in self._syncs]

    def restore_syncs(self, saved: Any) -> None:
        """Start from :meth:`syncs_state`'s record (what is not one is skipped)."""
        if isinstance(saved, list):
            self._saved_syncs = [
                (int(x[0]), float(x[1]))
                for x in saved[-(self._syncs.maxlen or 0) :]
                if isinstance(x, list)
                and len(x) == 2
                and isinstance(x[0], int)
                and isinstance(x[1], (int, float))
                and 2 < x[0] < 1 << 24
                and 0.0 < x[1] < 1e6
            ]
