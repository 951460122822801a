"""Auto mode's probes of a paused draft model: when one is worth its price, what it hopes to find,
and the record of what probes found (part of :class:`~.model_rounds.ModelRounds`).

A paused draft falls behind the text, so a probe costs a catch-up and a round that is likely to lose
against a plain step; it is made only when that price is less than what finding the draft paying
again could gain over the rest of the reply, discounted by the odds, learned per pair and machine,
that a probe finds it paying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from app.engine.auto.acceptance import Acceptance
from app.engine.auto.planner import best_length, memo_plan
from app.engine.auto.priors import PROBE_HOPE, PROBE_K, PROBE_PRIOR_WEIGHT

if TYPE_CHECKING:
    from app.engine.auto.costs import CostModel, Window
    from app.engine.auto.evidence import Evidence, Kind
    from app.engine.drafting.model import ModelDrafter
    from app.engine.events import Source


class Probing:
    """The probe rules of :class:`~.model_rounds.ModelRounds`, which holds their state."""

    # what ModelRounds holds and these rules read (see its constructor)
    evidence: Evidence
    source: Source
    cls: int
    n_max: int
    margin: float
    model: ModelDrafter
    since: int
    probe_odds: float
    probes: list[float]
    hoped: tuple[float, float]
    probe_loss: Window
    _probe_interval: int
    _optimistic: Acceptance
    _after_probe: Kind | None

    # and its methods these rules call
    low_costs: Callable[[], CostModel]
    overrun: Callable[..., float]
    sync_per_token: Callable[[float], float]

    def _probe_optimism(self) -> Acceptance:
        """The acceptance a probe hopes for in the current class: halfway from what the class is
        known for (its prior, or its evidence if better) to always right. Where the target hesitates
        the draft agrees with it 75 % of the time, so on a CPU a probe there cannot find a draft that
        pays, and each probe costs a catch-up and a batch (2-3 decode steps for 1-2 tokens)."""
        known = self.evidence.pooled(self.source, self.cls)
        hope = max(known.prior, known.overall())
        hope = min(self._optimistic.prior, hope + (1.0 - hope) * PROBE_HOPE)
        return Acceptance(self.n_max, prior=hope, weight=1e12)

    def probe_due(self, tokens: Sequence[int], draft_cost: float, limit: int, rest: int) -> bool:
        """A probe is worth its price: the catch-up, and what its own round is expected to lose
        against a plain step at the acceptance this class has shown (a probe drafts ``PROBE_K``
        tokens for a batch of up to ``PROBE_K + 1``), must be less than what finding out could gain
        over the ``rest`` of the reply, discounted by the odds that drafting turns out to pay."""
        if self.since < self._probe_interval:
            return False
        low = self.low_costs()
        draft_cost = low.draft_step() or draft_cost
        hope = self._probe_optimism()
        # what real rounds would deliver if the class turned out that good: planned on these costs
        # with what model rounds have really taken over them
        scale = self.overrun(low=True)
        key = ("probe", hope.prior, draft_cost, limit, self.margin, scale)
        best = memo_plan(
            low, key, lambda: best_length(hope, low, draft_cost, limit, self.margin, scale=scale)
        )
        if best.k == 0 or best.plain_rate <= 0:
            return False  # the draft model cannot pay here even if this class turns out much better
        catch_up = self.model.pending(tokens) * self.sync_per_token(draft_cost)
        k = min(PROBE_K, limit)
        known = self.evidence.estimate(self.source, self.cls)
        reach, expected = 1.0, 1.0
        for i in range(k):
            reach *= known.alpha(i)
            expected += reach
        verify = low.verify(k + 1)
        own = (k * draft_cost + (verify or 0.0)) * min(1.0, self.overrun()) - expected / best.plain_rate
        price = catch_up + max(0.0, own)
        if self.probe_loss.n:
            price = max(price, self.probe_loss.value)
        rest_of_reply = rest / best.plain_rate  # seconds, decoding plainly
        # the seconds drafting at best.rate would save over it (the tokens are the reply's either way)
        gain = self.odds() * (1 - best.plain_rate / best.rate) * rest_of_reply
        self.hoped = (best.rate / best.plain_rate, hope.prior)
        return price <= gain

    def _judge_probe(self) -> None:
        """The rounds a probe started have ended (the draft pauses, or the reply ended): the probe
        found drafting paying if they delivered more tokens/s than plain rounds."""
        if self._after_probe is None:
            return
        measured = self.evidence.measured(self._after_probe)
        self.probes[0] += measured is not None and measured > 1.0
        self.probes[1] += 1
        self._after_probe = None

    def odds(self) -> float:
        """The odds that a probe finds drafting paying again: this pair's record on this machine, the
        ``probe_odds`` prior weighing as much as PROBE_PRIOR_WEIGHT probes."""
        paid, tried = self.probes
        return (paid + self.probe_odds * PROBE_PRIOR_WEIGHT) / (tried + PROBE_PRIOR_WEIGHT)
