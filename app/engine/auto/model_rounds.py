"""Auto mode's draft model rounds: whether to draft with the model, how far, and when to probe it.

A model round is planned at this reply's estimate of the draft's acceptance in the current class
(how sure the target was of its last tokens), with the round's share of catching the draft up with
text decoded without it, and its predicted cost scaled by how much longer such rounds really took
(the models evict each other from the CPU caches). A reply explores the draft model from its first
rounds wherever the timed costs say it could pay at a plausible acceptance, and keeps it while its
measured return holds, and while it is in step with the text, as long as this reply's acceptance
could still pay (a paused draft falls behind, and resuming costs a catch-up); when it does not, the
draft pauses and is probed now and then (with exponential back-off) so auto notices when drafting
starts to pay.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.auto.acceptance import ALWAYS, Acceptance, Upper, model_class
from app.engine.auto.catching_up import CatchingUp
from app.engine.auto.costs import CostModel, Window
from app.engine.auto.evidence import PLAIN, Evidence, Kind
from app.engine.auto.planner import Plan, best_length, continue_rule, memo_plan
from app.engine.auto.priors import (
    CONFIDENCE_FLOOR,
    CONFIDENCE_WINDOW,
    ENGAGED_ERRORS,
    MODEL_CLASSES,
    PROBE_K,
    PROBE_MEMORY,
    RELAX,
    SERVED_RUNS,
)
from app.engine.auto.probing import Probing
from app.engine.drafting.base import Outcome, Proposal
from app.engine.drafting.model import ModelDrafter
from app.engine.events import Action, Decision, Policy, Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.grammar import Grammar


class ModelRounds(Probing, CatchingUp):
    """Plans the rounds that draft with a model, and learns from them (part of :class:`AutoDrafter`);
    its probes' rules are :class:`~.probing.Probing`'s, its catch-ups' price
    :class:`~.catching_up.CatchingUp`'s."""

    def __init__(
        self,
        model: ModelDrafter,
        costs: CostModel,
        evidence: Evidence,
        *,
        n_max: int,
        margin: float,
        probe_every: int,
        probe_max: int,
        probe_odds: float,
        optimistic: float,
        source: Source = Source.MODEL,
        target_conf: deque[float] | None = None,
    ):
        self.model, self.costs, self.evidence, self.source = model, costs, evidence, source
        self.n_max, self.margin = n_max, margin
        # how sure the target was of its last tokens (the drafter's, shared)
        self.target_conf = target_conf if target_conf is not None else deque(maxlen=CONFIDENCE_WINDOW)
        self.cls = 0  # the class of the round being drafted
        # whether the last round planned found that even a draft always right would not pay (then
        # the target's confidence, which only picks a class, is not worth reading)
        self.priced_out = False
        self._class_share = [1 / len(MODEL_CLASSES)] * len(MODEL_CLASSES)  # this reply's rounds, by class
        self.amortized = 1.0  # rounds the last catch-up was spread over
        self._runs: deque[int] = deque(maxlen=SERVED_RUNS + 1)  # model rounds per catch-up, this reply
        self._served = Window(15)  # model rounds per catch-up, earlier replies
        self.probe_every, self.probe_max = probe_every, probe_max
        self._probe_interval = probe_every
        self.since = 0  # rounds since the model last drafted
        self.probing = False
        self.cut = False  # this round's draft was made and then not verified at all (see _worth_verifying)
        # the first token cut from the last draft, judged once the text reaches it: (where the draft
        # started in the text, the draft through that token, its confidence, the class)
        self._unjudged: tuple[int, tuple[int, ...], float, int] | None = None
        # A reply tries the draft in its first rounds where the estimate alone would not (see
        # :meth:`_hopeful`): while every draft so far was accepted in full, and then while what its
        # rounds delivered beats plain rounds.
        self.trying = False
        # A probe makes the draft catch up with everything it has not seen. It is worth it only when
        # drafting could pay at all (even at an ``optimistic`` acceptance rate), and when what it
        # costs is less than what finding out could gain over the rest of this reply, discounted by
        # the odds that drafting turns out to pay: learned from this pair's probes on this machine
        # (how many of them made drafting pay again), ``probe_odds`` before any, weighing as much as
        # PROBE_PRIOR_WEIGHT probes. What a probe costs is what its round took beyond what plain
        # rounds would have taken for its tokens, once probes have been timed: on a GPU the draft's
        # catch-up, its steps and a batch after plain rounds cost several times what the same steps
        # cost in a run of drafted rounds.
        self.probe_odds = probe_odds
        self.probes = [0.0, 0.0]  # probes that made drafting pay again, probes
        self._after_probe: Kind | None = None  # the kind of the rounds a probe started, until judged
        self.hoped = (1.0, 0.0)  # the last probe's hope: the speedup of drafting, at the acceptance hoped for
        self.probe_loss = Window(7)  # seconds a probe round took beyond plain rounds' time for its tokens
        self._optimistic = Acceptance(n_max, prior=optimistic, weight=1e12)
        self.sync_cost = Window(15)  # the draft's seconds per token when catching up
        self._syncs: deque[tuple[int, float]] = deque(maxlen=15)  # catch-ups: (tokens, seconds)
        self._saved_syncs: list[tuple[int, float]] = []  # an earlier session's: (tokens, decode steps)
        # A model round takes longer than its parts timed alone (the two models evict each other's
        # weights from the CPU caches, the draft's Python): the median ratio of what model rounds
        # took to what the cost model predicted corrects its plans. What a probe hopes for is
        # planned on the lowest recent costs, so it is corrected by what rounds took over those: on
        # a GPU the lowest are the load's batches timed back to back, which a round after plain
        # rounds never reaches (another batch size's kernels and graphs, the queued step it wastes).
        self.overrun_window = Window(15)
        self.overrun_low_window = Window(15)

    def kind(self) -> Kind:
        return (self.source, self.cls)

    def begin(self) -> None:
        """A new reply: the model is judged afresh (its losing guard and its probe interval)."""
        self._judge_probe()
        self._class_share = [1 / len(MODEL_CLASSES)] * len(MODEL_CLASSES)
        for n in self._runs:
            self._served.add(n)
        self._runs.clear()
        self.evidence.forget_realized((self.source,))
        self._probe_interval = self.probe_every
        self.trying = True
        self._unjudged = None  # a token cut at the end of the last reply has no text to be judged by

    def rate(self, tokens: Sequence[int], limit: int, rest: int, copy_share: float) -> float:
        """The tokens per second a round of this model is expected to deliver now (0: none in play)."""
        d = self.costs.draft_step()
        if d is None or self.costs.verify(2) is None:
            return 0.0
        c = model_class(self.target_conf)
        if self.evidence.losing((self.source, c)) or self.cannot_pay(d, limit):
            return 0.0
        saved, self.cls = self.cls, c
        acc = self.evidence.estimate(self.source, c)
        catch_up = self.catch_up(tokens, d, rest, copy_share)
        plan = best_length(acc, self.costs, d, limit, self.margin, catch_up, self.overrun())
        self.cls = saved
        return plan.rate if plan.k else 0.0

    def propose(
        self,
        tokens: Sequence[int],
        limit: int,
        params: SamplingParams,
        rng: np.random.Generator,
        t0: float,
        *,
        rest: int,
        copy_share: float,
        grammar: Grammar | None = None,
    ) -> Proposal | Action:
        """Draft with the model, probe it, or measure it; else the action of a round without it."""
        d = self.costs.draft_step()
        self.since += 1
        c = self.cls = model_class(self.target_conf)
        self.amortized = 1.0  # until this round's catch-up is planned (none while measuring)
        self._class_share = [0.9 * x + 0.1 * (i == c) for i, x in enumerate(self._class_share)]
        acc = self.evidence.estimate(self.source, c)
        self.probing = self.cut = self.priced_out = False
        if d is None or self.costs.verify(2) is None:
            if self.costs.verify(1) is None:
                return Action.MEASURE
            plan = Plan(min(2, limit), 0.0, 0.0)
            decision = Decision(Action.MEASURE, Policy.AUTO, self.source, k=plan.k)
        elif self.cannot_pay(d, limit):
            self._judge_probe()
            self.priced_out = True
            return Action.PAUSED
        else:
            catch_up = self.catch_up(tokens, d, rest, copy_share)
            plan = best_length(acc, self.costs, d, limit, self.margin, catch_up, self.overrun())
            sure = min(self.target_conf, default=0.0)
            decision = Decision(
                Action.DRAFT,
                Policy.AUTO,
                self.source,
                k=plan.k,
                target_sure=sure if sure >= CONFIDENCE_FLOOR else None,
                sure_floor=CONFIDENCE_FLOOR,
                acceptance=acc.overall(),
                expected_speedup=plan.rate / plan.plain_rate,
                measured_speedup=self.evidence.measured(self.kind()),
            )
            losing = self.evidence.losing(self.kind())
            if plan.k > 0 and losing:
                plan = Plan(0, plan.rate, plan.plain_rate)
            elif plan.k == 0 and not losing and (self._hopeful() or catch_up == 0.0):
                # on hope early in a reply; or, in step with the text, while this reply's acceptance
                # could still be what a round needs (a pause would leave the draft behind)
                optimism = self._probe_optimism() if self._hopeful() else Upper(acc, ENGAGED_ERRORS)
                hope = best_length(optimism, self.costs, d, limit, self.margin, catch_up, self.overrun())
                if hope.k:  # on hope: the estimate alone would not draft
                    plan = hope
                    decision = replace(decision, expected_speedup=hope.rate / hope.plain_rate)
            if plan.k == 0:
                self._judge_probe()
                if not self.probe_due(tokens, d, limit, rest):
                    return Action.PAUSED
                plan = Plan(min(PROBE_K, limit), 0.0, plan.plain_rate)
                speedup, right = self.hoped  # what drafting would deliver if the probe finds it that good
                decision = Decision(
                    Action.PROBE,
                    Policy.AUTO,
                    self.source,
                    k=plan.k,
                    acceptance=right,
                    expected_speedup=speedup,
                )
                self.probing = True
        if plan.k == 0:
            return Action.NO_ROOM
        self._retimed()
        # a probe stays short; a real round drafts on while the draft's confidence says it pays; one
        # that measures drafts all it planned (it times the steps after the first: cut, it never would)
        measuring = decision.action is Action.MEASURE
        room = plan.k if self.probing or measuring else limit
        rule = continue_rule(self.costs, self.evidence.calibration[self.source], acc, d or 0.0, room)
        keep_going = None if measuring else rule
        if grammar is None:  # (a grammar only where there is one: a replayed model takes none)
            prop = self.model.propose(tokens, room, params, rng, keep_going=keep_going)
        else:
            prop = self.model.propose(tokens, room, params, rng, keep_going=keep_going, grammar=grammar)
        prop = self._worth_verifying(prop, len(tokens))
        return replace(prop, decision=replace(decision, k=plan.k), t=time.perf_counter() - t0)

    def _worth_verifying(self, prop: Proposal, start: int) -> Proposal:
        """The prefix of a draft worth verifying: what drafting it cost is spent, so only as many of its
        tokens go to the target as deliver the most tokens per second of verifying, by the draft's
        calibrated confidence in each; none where a plain step delivers more. On a CPU a batch of 2
        costs about 1.4 steps, so a draft that stopped at one unsure token is not worth its batch; on
        a GPU every batch costs about a step and nothing is cut. A draft model's memory follows the
        text by its prefix, so a cut draft needs nothing undone; a probe is verified whole."""
        if not prop.tokens or self.probing or self.source is not Source.MODEL:
            return prop
        v1 = self.costs.verify(1)
        if v1 is None:
            return prop
        calibration = self.evidence.calibration[self.source]
        best, best_rate = 0, 1.0 / v1
        reach, expected = 1.0, 1.0
        for m, c in enumerate(prop.confidence, 1):
            reach *= calibration.calibrated(c)
            expected += reach
            v = self.costs.verify(m + 1)
            if v is not None and expected / v > best_rate:
                best, best_rate = m, expected / v
        if best == len(prop.tokens):
            return prop
        self.cut = best == 0
        self._unjudged = (start, prop.tokens[: best + 1], prop.confidence[best], self.cls)
        return replace(prop, tokens=prop.tokens[:best], q=prop.q[:best], confidence=prop.confidence[:best])

    def judge_cut(self, tokens: Sequence[int]) -> None:
        """Judge the first token cut from the last draft against the text that came (the target's
        own token in its place is known once the verified part of the draft was accepted): without
        it the draft's unsure tokens are never judged, and a class whose drafts keep being cut learns
        nothing from them."""
        pending, self._unjudged = self._unjudged, None
        if pending is None:
            return
        start, draft, confidence, cls = pending
        i = len(draft) - 1
        if len(tokens) <= start + i or tuple(tokens[start : start + i]) != draft[:i]:
            return  # the text left the draft before the cut token (or has not reached it)
        ok = tokens[start + i] == draft[i]
        self.evidence.calibration[self.source].judge(i, ok, confidence)
        self.evidence.pooled(self.source, cls).judge(i, ok, confidence)
        self.evidence.estimate(self.source, cls).judge(i, ok)

    def cannot_pay(self, draft_cost: float, limit: int) -> bool:
        """Even a draft that is always right, with nothing to catch up, would not beat plain decoding.

        Then there is nothing to plan or probe: a plan (acceptance at most 1, a catch-up at least 0,
        its round's cost scaled by the overrun) and a probe's hope (at most ``optimistic``, unscaled)
        are bounded by this one, so the answer is the same, for a third of the Python per round (on
        a CPU where the draft model never pays, most rounds ask it).
        """
        low = self.low_costs()
        draft = low.draft_step() or draft_cost
        scale = min(1.0, self.overrun())
        key = ("always", draft, limit, self.margin, scale)
        plan = memo_plan(low, key, lambda: best_length(ALWAYS, low, draft, limit, self.margin, scale=scale))
        return plan.k == 0

    def low_costs(self) -> CostModel:
        """The costs at their lowest recent timings (a cost model without them: itself). What rules the
        draft out for good, and what a probe hopes for, is judged on these: a timing a busy moment
        inflated would otherwise never be taken again (see :class:`~.costs.Optimistic`)."""
        low = getattr(self.costs, "optimistic", None)
        return low() if low is not None else self.costs

    def overrun(self, low: bool = False) -> float:
        """What model rounds really took over what the cost model predicted (the median of recent
        rounds; 1.0 until measured); ``low``: over what the lowest recent costs predicted
        (:meth:`low_costs`)."""
        w = self.overrun_low_window if low else self.overrun_window
        return min(2.0, max(0.8, self._faded(w.value))) if w.n >= 3 else 1.0

    def _faded(self, overrun: float) -> float:
        """An overrun faded toward none by RELAX for each round since the model last drafted, as
        acceptance evidence fades toward its prior: only rounds that draft re-time it, so a busy moment
        that slowed the last ones timed (and was kept in the memory file) would otherwise keep the draft
        paused, and unprobed, for good. (``since`` counts the round being planned too.)"""
        return 1.0 + (overrun - 1.0) * RELAX ** (self.since - 1) if self.since > 1 else overrun

    def _retimed(self) -> None:
        """The model drafts again: the overruns timed before are kept as faded as they have become."""
        if self.since > 1:
            for w in (self.overrun_window, self.overrun_low_window):
                samples = [self._faded(x) for x in w.samples]
                w.clear()
                for x in samples:
                    w.add(x)
        self.since = 0

    def _hopeful(self) -> bool:
        """Whether to draft on hope where the estimate says no: early in a reply, while each draft the
        reply has tried was accepted in full (a reply where the draft is right, such as arithmetic or
        a list of records, shows it in a round or two; one where it is wrong costs one round), and
        afterwards while the rounds of this kind delivered more than plain rounds did."""
        if self.trying:
            return True
        measured = self.evidence.measured(self.kind())
        return measured is not None and measured > 1.0 + self.margin

    def observe(self, proposal: Proposal, outcome: Outcome, seconds: float, charged: float) -> None:
        """Learn from a round this model drafted (``seconds``: the round's time with its catch-up
        spread as planned; ``charged``: the part of the catch-up in it)."""
        d, v = self.costs.draft_step(), self.costs.verify(outcome.batch)
        if proposal.tokens:
            self._retimed()
        if proposal.tokens and d and v:  # a probe too: it re-times what paused the draft
            self.overrun_window.add(seconds / (outcome.n_drafted * d + v + charged))
            low = self.low_costs()
            d_low, v_low = low.draft_step() or d, low.verify(outcome.batch) or v
            self.overrun_low_window.add(seconds / (outcome.n_drafted * d_low + v_low + charged))
        if proposal.tokens and not self.probing:  # a try goes on only while the draft is right in full
            self.trying = self.trying and outcome.n_accepted >= outcome.n_drafted
        if self.cut:  # a draft not worth verifying: a try that failed
            self.trying = False
        if proposal.n_steps:
            self.costs.observe_draft(proposal.n_steps, proposal.t_steps)
        if proposal.n_sync > 2:
            self._restore_syncs()  # (before this one: they are older)
            self.sync_cost.add(proposal.t_sync / proposal.n_sync)
            self._syncs.append((proposal.n_sync, proposal.t_sync))
        if proposal.tokens:
            if proposal.n_sync > 2 or not self._runs:
                self._runs.append(1)  # a catch-up: a new run of model rounds
            else:
                self._runs[-1] += 1
        for acc in (self.evidence.calibration[self.source], self.evidence.pooled(self.source, self.cls)):
            acc.observe(outcome.n_drafted, outcome.n_accepted, proposal.confidence)
        self.evidence.estimate(self.source, self.cls).observe(outcome.n_drafted, outcome.n_accepted)
        if self.probing:
            plain = self.evidence.realized[PLAIN]
            v1 = self.costs.verify(1)
            per_token = 1.0 / plain.rate() if plain.n >= 3 and plain.rate() > 0 else v1
            if per_token:
                self.probe_loss.add(outcome.t_round - (outcome.n_accepted + 1) * per_token)
            acc = self.evidence.estimate(self.source, self.cls)
            plan = best_length(acc, self.costs, self.costs.draft_step() or 0.0, self.n_max, self.margin)
            if plan.k:  # drafting pays again: judge the next real rounds afresh, and the probe by them
                self._judge_probe()  # (an earlier probe's rounds, before they are forgotten)
                self._probe_interval = self.probe_every
                self.evidence.realized[self.kind()].rounds.clear()
                self._after_probe = self.kind()
            else:  # a probe that found nothing
                self.probes[1] += 1
                if outcome.n_accepted >= outcome.n_drafted:  # right, but not enough yet: probe on
                    self._probe_interval = self.probe_every
                else:
                    self._probe_interval = min(self.probe_max, self._probe_interval * 2)

    def state(self) -> dict[str, Any]:
        """What model rounds really took over their prediction, and the probes' record and price,
        for the memory file."""
        low = self.overrun_low_window
        return {
            "overrun": round(self._faded(self.overrun_window.value), 4) if self.overrun_window.n else None,
            "overrun_low": round(self._faded(low.value), 4) if low.n else None,
            "probes": [round(x, 3) for x in self.probes],
            "probe_loss": round(self.probe_loss.value, 6) if self.probe_loss.n else None,
            "syncs": self.syncs_state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        # the overrun as two rounds (one live round more makes it count); the one a probe's hope is
        # scaled by as three, so the first probe of a session is judged as the last one was
        for key, window, weight in (
            ("overrun", self.overrun_window, 2),
            ("overrun_low", self.overrun_low_window, 3),
        ):
            value = state.get(key)
            if isinstance(value, (int, float)) and 0.0 < value < 1e6:  # a busy machine's 6x is kept as 4x
                for _ in range(weight):
                    window.add(min(4.0, max(0.5, float(value))))
        probes = state.get("probes")
        if (
            isinstance(probes, list)
            and len(probes) == 2
            and all(isinstance(x, (int, float)) and 0 <= x < 1e9 for x in probes)
            and probes[0] <= probes[1]
        ):
            # what earlier sessions found weighs as much as PROBE_MEMORY probes, so the odds still move
            scale = min(1.0, PROBE_MEMORY / probes[1]) if probes[1] else 1.0
            self.probes = [float(probes[0]) * scale, float(probes[1]) * scale]
        self.restore_syncs(state.get("syncs"))
        loss = state.get("probe_loss")
        if isinstance(loss, (int, float)) and 0.0 <= loss < 60.0:
            for _ in range(2):
                self.probe_loss.add(float(loss))
