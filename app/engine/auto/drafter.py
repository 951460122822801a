"""Auto mode's drafter: draft only when it pays, measured online for this pair on this machine.

Before each round the :class:`AutoDrafter` picks the draft length ``k`` (0 = plain decoding) that
maximizes expected tokens per second::

    rate(k) = E[tokens | k] / (k * draft_cost + verify_cost(k + 1) + catch_up)
    E[tokens | k] = 1 + sum_{i=1..k} prod_{j<=i} a_j

where ``a_j`` is the chance that the j-th draft token is accepted when the ones before it were,
``draft_cost`` the draft's seconds per token, ``verify_cost(b)`` the target's seconds for a batch of
``b`` tokens (both :class:`MeasuredCosts`) and ``catch_up`` this round's share of bringing the draft
model up to date with text decoded without it.

Acceptance is learned per source and class of situation, pooled over replies and followed within each
reply (:class:`~app.engine.auto.evidence.Evidence`). Copies (prompt lookup's, or the history's where it
copies other text and its class expects more) are planned by :class:`~.copies.CopyRounds`, the draft
model by :class:`~.model_rounds.ModelRounds`; a copy is drafted unless a model round is expected to
deliver more, and a model round's draft goes on with the copy prompt lookup finds where it ends, as
far as that is expected to pay (:func:`~.planner.best_extension`). Each round's choice is returned as
a :class:`~app.engine.events.Decision`; the UI words it. What was learned can be saved and restored
(:meth:`AutoDrafter.state`, :mod:`.memory`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.auto.copies import CopyRounds
from app.engine.auto.costs import CostModel, DraftCosts, MeasuredCosts
from app.engine.auto.evidence import COPIERS, PLAIN, Evidence, Kind
from app.engine.auto.model_rounds import ModelRounds
from app.engine.auto.planner import best_extension
from app.engine.auto.priors import (
    CONFIDENCE_FLOOR,
    CONFIDENCE_WINDOW,
    LOOKUP_MAX,
    RELAX,
    RELAX_EVERY,
    REPLY_LENGTHS,
    REPLY_MIN,
)
from app.engine.drafting.base import Drafter, Outcome, Proposal, within
from app.engine.drafting.lookup import LookupDrafter
from app.engine.drafting.model import ModelDrafter
from app.engine.events import Action, Decision, Declined, Policy, Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.drafting.mtp import MtpDrafter
    from app.engine.grammar import Grammar


class AutoDrafter:
    """Chooses, per round, between prompt lookup, the history, the draft model and not drafting."""

    name = "auto"
    target_confidence_floor = CONFIDENCE_FLOOR  # exact at or above it; below it, an upper bound

    def __init__(
        self,
        model: ModelDrafter | None,
        lookup: LookupDrafter,
        *,
        history: Drafter | None = None,
        mtp: MtpDrafter | None = None,
        n_max: int = 8,
        lookup_max: int = LOOKUP_MAX,
        costs: CostModel | None = None,
        margin: float = 0.03,
        probe_every: int = 12,
        probe_max: int = 192,
        refresh_plain: int = 48,
        probe_odds: float = 0.25,
        optimistic: float = 0.98,
    ):
        self.model = model
        self.lookup = lookup
        self.history = history  # copies from the user's earlier conversations (a HistoryDrafter)
        self.mtp = mtp  # the target's own multi-token-prediction head, where it has one
        self.n_max = n_max  # the draft model's longest draft
        self.lookup_max = max(n_max, lookup_max)  # prompt lookup's
        self.costs: CostModel = costs or MeasuredCosts()
        self.margin = margin
        self.evidence = Evidence(n_max, self.lookup_max)
        # how sure the target was of the last tokens (the top probability of each, oldest first)
        self.target_confidence: deque[float] = deque(maxlen=CONFIDENCE_WINDOW)
        self.copies = CopyRounds(self.costs, self.evidence, margin)
        planning = {
            "n_max": n_max,
            "margin": margin,
            "probe_every": probe_every,
            "probe_max": probe_max,
            "probe_odds": probe_odds,
            "optimistic": optimistic,
            "target_conf": self.target_confidence,
        }
        source = getattr(model, "source", Source.MODEL)  # the draft model, or an EAGLE-3 head in its place
        self.rounds = None
        if model is not None:
            self.rounds = ModelRounds(model, self.costs, self.evidence, source=source, **planning)
        # the MTP head's step has its own cost; the target's verify costs are shared
        self.mtp_costs = DraftCosts(self.costs) if isinstance(self.costs, MeasuredCosts) else self.costs
        self.mtp_rounds = (
            ModelRounds(mtp, self.mtp_costs, self.evidence, source=Source.MTP, **planning)  # type: ignore[arg-type]
            if mtp is not None
            else None
        )
        # the drafters that predict (judged by the target's confidence), each planned on its own
        self.predictors = [r for r in (self.rounds, self.mtp_rounds) if r is not None]
        self.refresh_plain = refresh_plain
        self._since_plain = 0
        self._n_rounds = 0  # rounds planned (for fading the evidence by class)
        self.rest = 0  # tokens this reply is expected to produce still (see REPLY_MIN)
        self._after: tuple[Kind, int] | None = None  # the kind and diagonal of a copy after a draft
        self._prompt_len = 0
        self.lengths: deque[int] = deque(maxlen=REPLY_LENGTHS)  # the recent replies', in tokens
        self._reached = -1  # tokens this reply has produced (-1: no reply yet)

    @property
    def wants_target_confidence(self) -> int:
        """How many of each round's last tokens the loop is to report the target's confidence in:
        the last few while a predictor (the draft model, a head) could pay, none while each is priced
        out (:meth:`ModelRounds.cannot_pay`) or there is none. The confidence only picks a predictor's
        class, and reading it is not free where the next step is queued: the rows are read before
        the queue, 2 % of a 7B model's step on an H200 (``docs/benchmarks.md``)."""
        if any(not r.priced_out for r in self.predictors):
            return CONFIDENCE_WINDOW
        return 0

    def begin(self, prompt: Sequence[int]) -> float:
        self.target_confidence.clear()
        self.evidence.begin()
        self.copies.begin()
        self._prompt_len = len(prompt)
        if self._reached > 0:
            self.lengths.append(self._reached)
        self._reached = 0
        t = self.lookup.begin(prompt)
        if self.history is not None:
            t += self.history.begin(prompt)
        for rounds in self.predictors:
            rounds.begin()
            # The draft does not evaluate the prompt with the target's, as in speculative mode: it
            # catches up when a round first drafts with it, where that is planned to pay, so a reply
            # it does not draft in costs it no time at all (the same work, when it drafts).
            t += rounds.model.begin(prompt, evaluate=False)
        return t

    def expected_rest(self, t: int) -> float:
        """Tokens a reply that has ``t`` so far is expected to produce still: what the recent replies
        that went on past ``t`` produced after it, with as much as the reply so far (at least
        REPLY_MIN) weighing as one of them. Without it a reply's first rounds would count on a short
        rest, and a catch-up or a probe there could never pay."""
        lindy = max(t, REPLY_MIN)
        longer = [n - t for n in self.lengths if n > t]
        return (sum(longer) + lindy) / (len(longer) + 1)

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """This round's draft (or none); with a ``grammar``, copies cut before the first token it
        forbids and the draft model masked by it."""
        self._reached = len(tokens) - self._prompt_len
        self.rest = min(k + 1, self.expected_rest(self._reached))
        limit = min(k, self.n_max)
        for rounds in self.predictors:
            rounds.probing = False
        if k <= 0:
            return _no_draft(Action.NO_ROOM, 0.0)
        self._since_plain += 1
        if self._since_plain > self.refresh_plain:  # keep the plain-decoding baseline current
            return _no_draft(Action.MEASURE, 0.0)
        t0 = time.perf_counter()
        self._n_rounds += 1
        if self._n_rounds % RELAX_EVERY == 0:  # in steps of a few rounds: it touches every class's arrays
            for acc in self.evidence.every():
                acc.relax(RELAX**RELAX_EVERY)
        self.evidence.copying = self.copies.check(tokens, len(tokens) - self._prompt_len)
        self.copies.follow(tokens)
        for rounds in self.predictors:
            rounds.judge_cut(tokens)
        room = min(k, self.lookup_max)
        if grammar is None:
            found = self.lookup.propose(tokens, room, params, rng)
        else:  # a copy cut before what the grammar forbids (a shorter match's where its first token is)
            found = self.lookup.propose(tokens, room, params, rng, grammar=grammar)
        if self.history is not None:  # the user's history may offer another copy than the context
            earlier = within(self.history.propose(tokens, min(k, self.lookup_max), params, rng), grammar)
            if earlier.tokens and (not found.tokens or self.copies.better(tokens, found, earlier)):
                found = earlier
        declined = None  # a copy prompt lookup or the history found and auto did not draft
        rates = [0.0] * len(self.predictors)  # what each predictor is expected to deliver, where asked
        if found.tokens or len(self.predictors) > 1:
            rates = [r.rate(tokens, limit, self.rest, self.copies.share) for r in self.predictors]
        if found.tokens:
            copied, declined = self.copies.propose(tokens, found, t0, max(rates, default=0.0))
            if copied is not None:
                return copied
        if not self.predictors:
            return _no_draft(Action.DECLINED if declined else Action.NO_MATCH, t0, declined)
        self.copies.share *= 0.9
        # the predictor expected to deliver most drafts; one that is paused (or has no room) leaves
        # the round to the next
        ranked = sorted(range(len(rates)), key=lambda i: -rates[i])  # ties: the draft model first
        first: tuple[Action, Source] | None = None
        for rounds in (self.predictors[i] for i in ranked):
            drafted = rounds.propose(
                tokens, limit, params, rng, t0, rest=self.rest, copy_share=self.copies.share, grammar=grammar
            )
            if not isinstance(drafted, Action):
                return self._copy_after(tokens, drafted, rounds, min(k, self.lookup_max), grammar)
            first = first or (drafted, rounds.source)
        assert first is not None
        return _no_draft(first[0], t0, declined, first[1])

    def _copy_after(
        self,
        tokens: Sequence[int],
        drafted: Proposal,
        rounds: ModelRounds,
        room: int,
        grammar: Grammar | None,
    ) -> Proposal:
        """The draft, with the copy prompt lookup finds where it ends appended where that is expected
        to pay: a copy's tokens cost only a longer batch, and where the text repeats a structure with
        new values in it (records, an edited file) the draft writes the values and the copy the rest."""
        self._after = None
        k = len(drafted.tokens)
        if not k or rounds.probing or room <= k:
            return drafted
        found = self.lookup.after(tokens, drafted.tokens, room - k, grammar=grammar)
        if not found.tokens:
            return drafted
        kind, diagonal, acc, copy_room = self.copies.after(tokens, k, found)
        calibration = self.evidence.calibration[rounds.source]
        reach, expected = 1.0, 1.0
        for c in drafted.confidence:
            reach *= calibration.calibrated(c)
            expected += reach
        m = best_extension(reach, expected, drafted.t_steps, k, acc, self.costs, copy_room)
        if m == 0:
            return drafted
        self._after = (kind, diagonal)
        decision = drafted.decision and replace(drafted.decision, copied=m, match=found.match)
        return replace(
            drafted,
            decision=decision,
            tokens=drafted.tokens + found.tokens[:m],
            q=drafted.q + found.q[:m],
            confidence=drafted.confidence + found.confidence[:m],
            match=found.match,
            origin=found.origin,
            copied=m,
        )

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        self._reached += outcome.n_accepted + 1
        if outcome.timed:
            self.costs.observe_verify(outcome.batch, outcome.t_verify)
        if self.wants_target_confidence:
            self.target_confidence.extend(outcome.confidence)
        else:  # not read while priced out: the class starts afresh when a predictor could pay again
            self.target_confidence.clear()
        rounds = next((r for r in self.predictors if r.source is proposal.source), None)
        probing = rounds is not None and rounds.probing
        kind: Kind = PLAIN
        if proposal.tokens and proposal.source in COPIERS:
            kind = self.copies.round[0]
        elif rounds is not None and (proposal.tokens or rounds.cut):  # a cut round: the model's too
            kind = rounds.kind()
        seconds, charged = outcome.t_round, 0.0
        if proposal.n_sync > 2 and rounds is not None:  # the round's share of catching up, as planned
            catch_up = proposal.t_sync * (proposal.n_sync - 2) / proposal.n_sync
            charged = catch_up / rounds.amortized
            seconds -= catch_up - charged
        if not probing:  # a probe is short on purpose: not a sample
            self.evidence.realized[kind].add(outcome.n_accepted + 1, seconds)
        if outcome.batch == 1:
            self._since_plain = 0
        if proposal.source in COPIERS:
            self.copies.observe(proposal, outcome)
        elif rounds is not None:
            if proposal.copied:  # the draft's part, and the copy's
                k = len(proposal.tokens) - proposal.copied
                if outcome.n_accepted >= k and self._after is not None:
                    self.copies.observe_after(*self._after, proposal.copied, outcome.n_accepted - k)
                proposal = replace(
                    proposal, tokens=proposal.tokens[:k], q=proposal.q[:k], confidence=proposal.confidence[:k]
                )
                outcome = replace(outcome, n_drafted=k, n_accepted=min(k, outcome.n_accepted))
            rounds.observe(proposal, outcome, seconds, charged)

    def state(self) -> dict[str, Any]:
        """What auto mode learned (pooled acceptance by source and class, model rounds' overrun), for
        :class:`~app.engine.auto.memory.AutoMemory`; the costs are the cost model's to save."""
        out: dict[str, Any] = {
            "evidence": self.evidence.state(),
            "model": self.rounds.state() if self.rounds else {},
            # the recent replies' lengths, with the one in progress or just ended
            "lengths": [*self.lengths, *([self._reached] if self._reached > 0 else [])][-REPLY_LENGTHS:],
        }
        if self.mtp_rounds is not None:
            mtp_costs = self.mtp_costs.state() if isinstance(self.mtp_costs, DraftCosts) else {}
            out["mtp"] = {**self.mtp_rounds.state(), **mtp_costs}
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Start from a saved :meth:`state` (what does not fit this drafter's shape is skipped)."""
        evidence, model = state.get("evidence"), state.get("model")
        if isinstance(evidence, dict):
            self.evidence.restore(evidence)
        if isinstance(model, dict) and self.rounds is not None:
            self.rounds.restore(model)
        lengths = state.get("lengths")
        if isinstance(lengths, list) and all(isinstance(n, int) and 0 < n < 1 << 24 for n in lengths):
            self.lengths.extend(lengths[-REPLY_LENGTHS:])
        mtp = state.get("mtp")
        if isinstance(mtp, dict) and self.mtp_rounds is not None:
            self.mtp_rounds.restore(mtp)
            if isinstance(self.mtp_costs, DraftCosts):
                self.mtp_costs.restore(mtp)

    def close(self) -> None:
        self.lookup.close()


def _no_draft(
    action: Action, t0: float, declined: Declined | None = None, source: Source = Source.NONE
) -> Proposal:
    """A round that drafts nothing, and why (``t0``: when planning began; 0.0 for no time spent;
    ``source``: the drafter that paused, where one did)."""
    t = time.perf_counter() - t0 if t0 else 0.0
    decision = Decision(action, Policy.AUTO, source, declined=declined)
    return Proposal((), (), (), Source.NONE, t, decision=decision)
