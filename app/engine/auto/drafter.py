"""Auto mode's drafter: draft only when it pays, measured online for this pair on this machine.

Before each round the :class:`AutoDrafter` picks the draft length ``k`` (0 = plain decoding) that
maximizes expected tokens per second::

    rate(k) = E[tokens | k] / (k * draft_cost + verify_cost(k + 1) + catch_up)
    E[tokens | k] = 1 + sum_{i=1..k} prod_{j<=i} a_j

where ``a_j`` is the chance that the j-th draft token is accepted when the ones before it were,
``draft_cost`` the draft's seconds per token, ``verify_cost(b)`` the target's seconds for a batch of
``b`` tokens (both :class:`MeasuredCosts`) and ``catch_up`` this round's share of bringing the draft
model up to date with text decoded without it. A model round's predicted cost is scaled by how much
longer such rounds really took (the models evict each other from the CPU caches).

Acceptance is learned per class of situation, pooled over replies and followed within each reply
(:class:`ReplyAcceptance`): for prompt lookup by the length of the match the draft was copied from,
by whether the target was sure of the last few tokens, and by whether a short match resumes the last
accepted copy after a small edit (a copied token from where the reply once departed from a copy of
itself is judged at the rate such tokens held: :class:`CopyBreaks`); for the draft model by how
sure the target was of the last few tokens (where it was, the draft nearly always agrees). Prompt
lookup is tried first (its drafts cost almost nothing); the draft model next. A model draft goes on
while a longer draft, judged from the draft's own confidence so far, is expected to deliver more
tokens per second. When drafting does not pay, the drafter pauses and re-probes now and then (with
exponential back-off) so it notices when drafting starts to pay.

Each round's choice is returned as a :class:`~app.engine.events.Decision` (what was decided, the
source, and the numbers behind it); the UI words it. Priors live in :mod:`.priors`, costs in
:mod:`.costs`, acceptance estimates in :mod:`.acceptance`, the planner in :mod:`.planner`.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from app.engine.auto.acceptance import (
    ALWAYS,
    Acceptance,
    AtBreaks,
    CopyBreaks,
    ReplyAcceptance,
    lookup_class,
    model_class,
)
from app.engine.auto.costs import CostModel, MeasuredCosts, Realized, Window
from app.engine.auto.planner import Plan, best_length, continue_rule
from app.engine.auto.priors import (
    CONFIDENCE_FLOOR,
    CONFIDENCE_WINDOW,
    COPYING,
    FIRST_LOOKUP,
    HORIZON,
    LOOKUP_CLASSES,
    LOOKUP_MAX,
    MODEL_CLASSES,
    PROBE_HOPE,
    PROBE_K,
    RELAX,
    RELAX_EVERY,
    REPLY_MIN,
    REPLY_WEIGHT,
    RESUME,
    RESUME_BELOW,
    RESUME_PRIOR,
    RESUME_SHIFT,
    SERVED_RUNS,
    TOKENS_PER_ROUND,
)
from app.engine.drafting.base import Drafter, Outcome, Proposal, within
from app.engine.drafting.lookup import LookupDrafter
from app.engine.drafting.model import ModelDrafter
from app.engine.events import Action, Decision, Declined, Policy, Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.grammar import Grammar


class AutoDrafter:
    """Chooses, per round, between prompt lookup, the draft model and not drafting at all."""

    name = "auto"
    # the speculative loop reports the target's confidence in this many of each round's last tokens
    wants_target_confidence = CONFIDENCE_WINDOW
    target_confidence_floor = CONFIDENCE_FLOOR  # exact at or above it; below it, an upper bound

    def __init__(
        self,
        model: ModelDrafter | None,
        lookup: LookupDrafter,
        *,
        history: Drafter | None = None,
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
        self.n_max = n_max  # the draft model's longest draft
        self.lookup_max = max(n_max, lookup_max)  # prompt lookup's
        self.costs: CostModel = costs or MeasuredCosts()
        self.margin = margin
        self.acc = {"model": Acceptance(n_max)}  # pooled: calibrates the draft's own confidence
        # the draft model's acceptance by how sure the target was of the last few tokens
        self.model_acc = [Acceptance(n_max, prior=p, weight=3.0) for _, p in MODEL_CLASSES]
        self._target_conf: deque[float] = deque(maxlen=CONFIDENCE_WINDOW)
        self._model_class = 0  # the class of the round being drafted
        self._class_share = [1 / len(MODEL_CLASSES)] * len(MODEL_CLASSES)  # this reply's rounds, by class
        self._copy_share = 0.0  # this reply's rounds drafted by prompt lookup (recent ones weigh more)
        self._amortized = 1.0  # rounds the last catch-up was spread over
        self._runs: deque[int] = deque(maxlen=SERVED_RUNS + 1)  # model rounds per catch-up, this reply
        self._served = Window(15)  # model rounds per catch-up, earlier replies
        # prompt lookup's acceptance, by how long the match its draft was copied from is
        # (and by whether the target was sure of the last tokens: index 1 if so, 0 if not)
        self.lookup_acc = [
            (
                Acceptance(self.lookup_max, prior=unsure[0], prior_rest=unsure[1], weight=3.0),
                Acceptance(self.lookup_max, prior=sure[0], prior_rest=sure[1], weight=3.0),
            )
            for _, sure, unsure in (*LOOKUP_CLASSES, (0, RESUME_PRIOR, RESUME_PRIOR))
        ]
        # copies from the history, by the same classes (no resumes: a history copy has no diagonal
        # here), learned apart: in a revision the history holds older versions of the text, and its
        # most frequent continuation may be an older one than the copy the context offers
        self.history_acc = [
            (
                Acceptance(self.lookup_max, prior=unsure[0], prior_rest=unsure[1], weight=3.0),
                Acceptance(self.lookup_max, prior=sure[0], prior_rest=sure[1], weight=3.0),
            )
            for _, sure, unsure in LOOKUP_CLASSES
        ]
        self._copy_diagonal: int | None = None  # context index minus copied index of the last copy
        self._breaks = CopyBreaks()  # where this reply departed from copies of itself
        # A copy prompt lookup offered and auto did not draft, followed against the text as it comes:
        # (kind, class, sureness, diagonal, context index where it starts, the copy). What drafting it
        # would have got (at temperature 0 exactly what verifying it would have accepted) counts as
        # this reply's evidence for its class, and a copy that held is the copy an edit resumes.
        # Without it a class whose prior does not pay is never drafted, so never learned.
        self._undrafted: tuple[str, int, int, int | None, int, tuple[int, ...]] | None = None
        # the kind ("lookup" or "history"), class and diagonal (None: from the history) of the copy
        # being verified
        self._copy_round: tuple[str, int, int | None] = ("lookup", 0, 0)
        self._sure = 0  # whether the target was sure of the last tokens when this round was planned
        self._reply: dict[tuple[str, int, int], ReplyAcceptance] = {}  # this reply's evidence, by class
        self.probe_every = probe_every
        self.probe_max = probe_max
        self._probe_interval = probe_every
        self._since_model = 0
        self._probing = False
        self.refresh_plain = refresh_plain
        self._since_plain = 0
        self._rounds = 0  # rounds planned (for fading the evidence by class)
        # A probe makes the draft catch up with everything it has not seen. It is worth it only when
        # drafting could pay at all (even at an ``optimistic`` acceptance rate), and when the catch-up
        # costs less than what finding out could gain over the rest of this reply, discounted by the
        # ``probe_odds`` that drafting turns out to pay.
        self.probe_odds = probe_odds
        self._rest = 0  # tokens this reply is expected to produce still (see REPLY_MIN)
        self._prompt_len = 0
        self._optimistic = Acceptance(n_max, prior=optimistic, weight=1e12)
        self._sync_cost = Window(15)
        # A model round takes longer than its parts timed alone (the two models evict each other's
        # weights from the CPU caches, the draft's Python): the median ratio of what model rounds
        # took to what the cost model predicted corrects its plans.
        self._overrun = Window(15)
        # What rounds really delivered, by kind: the cost model predicts, this checks. A drafter whose
        # recent rounds gave fewer tokens/s than plain rounds is paused whatever the model predicts
        # (costs it does not see: logits rows, cache effects, a busy machine).
        # (prompt lookup is judged per class of match: coincidences losing must not stop copies)
        self._realized = {"none": Realized(16)}
        self._realized.update({f"model{c}": Realized(6) for c in range(len(MODEL_CLASSES))})
        self._copy_kinds = [
            *(f"lookup{c}" for c in range(len(self.lookup_acc))),
            *(f"history{c}" for c in range(len(self.history_acc))),
        ]
        self._realized.update({kind: Realized(6) for kind in self._copy_kinds})
        self._copy_skip = dict.fromkeys(self._copy_kinds, 0)
        self._copy_every = dict.fromkeys(self._copy_kinds, 1)

    def begin(self, prompt: Sequence[int]) -> float:
        self._target_conf.clear()
        self._reply.clear()
        self._class_share = [1 / len(MODEL_CLASSES)] * len(MODEL_CLASSES)
        self._copy_share = 0.0
        for n in self._runs:
            self._served.add(n)
        self._runs.clear()
        # prompt lookup is judged per reply (its cost is just a batch; what differs between replies
        # is acceptance, which is learned per reply too): a class losing in code must not pause it
        # in the JSON reply that follows
        for kind in self._copy_kinds:
            self._realized[kind].rounds.clear()
        # so is the draft model: a reply explores it from its first rounds wherever the timed costs
        # say it could pay at a plausible acceptance, and keeps it while its measured return holds
        for c in range(len(MODEL_CLASSES)):
            self._realized[f"model{c}"].rounds.clear()
        self._probe_interval = self.probe_every
        self._copy_skip = dict.fromkeys(self._copy_kinds, 0)
        self._copy_every = dict.fromkeys(self._copy_kinds, 1)
        self._copy_diagonal = None
        self._breaks.begin()
        self._undrafted = None
        self._prompt_len = len(prompt)
        t = self.lookup.begin(prompt)
        if self.history is not None:
            t += self.history.begin(prompt)
        if self.model is not None:
            # The draft evaluates the prompt now, batched with the target's prompt processing as in
            # speculative mode, while it is in play; otherwise it catches up only if it drafts again.
            t += self.model.begin(prompt, evaluate=self._model_in_play())
        return t

    def _model_in_play(self) -> bool:
        """The draft model could pay on this machine at a plausible acceptance: the best its classes
        have shown (learned, or their priors until learned)."""
        d, v1 = self.costs.draft_step(), self.costs.verify(1)
        if self.model is None or d is None or v1 is None:
            return self.model is not None
        plausible = max(max(a.prior, a.overall()) for a in self.model_acc)
        acc = Acceptance(self.n_max, prior=plausible, weight=1e12)
        return best_length(acc, self.costs, d, self.n_max, self.margin).k > 0

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
        self._rest = min(k + 1, max(len(tokens) - self._prompt_len, REPLY_MIN))
        limit = min(k, self.n_max)
        self._probing = False
        if k <= 0:
            return _no_draft(Action.NO_ROOM, 0.0)
        self._since_plain += 1
        if self._since_plain > self.refresh_plain:  # keep the plain-decoding baseline current
            return _no_draft(Action.MEASURE, 0.0)
        t0 = time.perf_counter()
        self._rounds += 1
        if self._rounds % RELAX_EVERY == 0:  # in steps of a few rounds: it touches every class's arrays
            copies = (*self.lookup_acc, *self.history_acc)
            for acc in (*(a for pair in copies for a in pair), *self.model_acc):
                acc.relax(RELAX**RELAX_EVERY)
        self._sure = int(model_class(self._target_conf) == len(MODEL_CLASSES) - 1)
        self._breaks.check(tokens)
        if self._undrafted is not None:
            self._follow_undrafted(tokens)
        room = min(k, self.lookup_max)
        if grammar is None:
            found = self.lookup.propose(tokens, room, params, rng)
        else:  # a copy cut before what the grammar forbids (a shorter match's where its first token is)
            found = self.lookup.propose(tokens, room, params, rng, grammar=grammar)
        if self.history is not None:  # the user's history may offer another copy than the context
            earlier = within(self.history.propose(tokens, min(k, self.lookup_max), params, rng), grammar)
            if earlier.tokens and (not found.tokens or self._history_better(tokens, found, earlier)):
                found = earlier
        declined = None  # a copy prompt lookup or the history found and auto did not draft
        if found.tokens:
            copied, declined = self._plan_copy(tokens, found, t0, self._model_rate(tokens, limit))
            if copied is not None:
                return copied
        if self.model is None:
            return _no_draft(Action.DECLINED if declined else Action.NO_MATCH, t0, declined)
        return self._plan_model(tokens, limit, params, rng, t0, declined, grammar)

    def _copy_class(self, tokens: Sequence[int], found: Proposal) -> tuple[str, int, int | None]:
        """The kind, class and diagonal (None: from the history) of a copy offered this round."""
        if found.source is Source.LOOKUP:
            diagonal = len(tokens) - found.origin
            return "lookup", self._lookup_class(found.match, diagonal), diagonal
        return "history", lookup_class(found.match), None

    def _copy_plan(
        self, tokens: Sequence[int], found: Proposal, at_breaks: frozenset[int] = frozenset()
    ) -> Plan:
        """The best draft of this copy at its class's acceptance (tokens copied from where this reply
        departed from a copy of itself, ``at_breaks``, judged at the rate such tokens held)."""
        kind, c, _ = self._copy_class(tokens, found)
        acc = self._estimate(kind, c)
        view = AtBreaks(acc, at_breaks, self._breaks.rate()) if at_breaks else acc
        first = acc.trials[0] or found.match >= COPYING  # a copy in progress is not capped
        room = len(found.tokens) if first else min(len(found.tokens), FIRST_LOOKUP)
        return best_length(view, self.costs, 0.0, room, self.margin)

    def _history_better(self, tokens: Sequence[int], context: Proposal, history: Proposal) -> bool:
        """The history's copy is another text than the context's and is expected to pay more.

        Where both copy the same text (one is the start of the other) the context's is taken: it
        knows where the copy is in the text, by which a copy resumed after an edit and the places
        where this reply departed from it are found."""
        n = min(len(history.tokens), len(context.tokens))
        if history.tokens[:n] == context.tokens[:n]:
            return False
        return self._copy_rate(tokens, history) > self._copy_rate(tokens, context)

    def _copy_rate(self, tokens: Sequence[int], found: Proposal) -> float:
        """The tokens per second drafting this copy is expected to deliver (plain's if it does not pay)."""
        at_breaks = self._breaks.at(found) if found.source is Source.LOOKUP else frozenset()
        return self._copy_plan(tokens, found, at_breaks).rate

    def _model_rate(self, tokens: Sequence[int], limit: int) -> float:
        """The tokens per second a draft model round is expected to deliver now (0: none in play)."""
        d = self.costs.draft_step()
        if self.model is None or d is None or self.costs.verify(2) is None:
            return 0.0
        c = model_class(self._target_conf)
        if self._losing(f"model{c}") or self._model_cannot_pay(d, limit):
            return 0.0
        saved, self._model_class = self._model_class, c
        acc = self._estimate("model", c)
        plan = best_length(
            acc, self.costs, d, limit, self.margin, self._catch_up(tokens, d), self._model_overrun()
        )
        self._model_class = saved
        return plan.rate if plan.k else 0.0

    def _plan_copy(
        self, tokens: Sequence[int], found: Proposal, t0: float, beat: float = 0.0
    ) -> tuple[Proposal | None, Declined | None]:
        """Draft (part of) the copy prompt lookup or the history found, or decline it (also where a
        draft model round is expected to deliver more: ``beat`` tokens per second). A copy from the
        history is judged by its match length in classes of its own (it has no diagonal here)."""
        kind, c, diagonal = self._copy_round = self._copy_class(tokens, found)
        at_breaks = self._breaks.offer(tokens, found) if diagonal is not None else frozenset()
        plan = self._copy_plan(tokens, found, at_breaks)
        if plan.k and plan.rate <= beat:
            plan = Plan(0, plan.rate, plan.plain_rate)
        key = f"{kind}{c}"
        losing = plan.k > 0 and self._losing(key)
        if losing:  # try again only now and then, with back-off
            self._copy_skip[key] += 1
            if self._copy_skip[key] < self._copy_every[key]:
                plan = Plan(0, plan.rate, plan.plain_rate)
            else:
                self._copy_skip[key] = 0
                self._copy_every[key] = min(64, self._copy_every[key] * 2)
        elif plan.k > 0:
            self._copy_every[key] = 1
        if plan.k == 0:
            if self._undrafted is None:
                self._undrafted = (kind, c, self._sure, diagonal, len(tokens), found.tokens)
            return None, Declined(found.source, found.match, losing)
        n = plan.k
        if self._undrafted is not None:
            self._follow_undrafted(tokens, end=True)
        self._copy_share = 0.9 * self._copy_share + 0.1
        decision = Decision(
            Action.DRAFT,
            Policy.AUTO,
            found.source,
            k=n,
            match=found.match,
            resumes_copy=c == RESUME,
            copy_broke_at=min(at_breaks) + 1 if at_breaks else 0,
            expected_speedup=plan.rate / plan.plain_rate,
            measured_speedup=self._measured(key),
        )
        drafted = replace(
            found,
            tokens=found.tokens[:n],
            q=found.q[:n],
            confidence=found.confidence[:n],
            decision=decision,
            t=time.perf_counter() - t0,
        )
        return drafted, None

    def _plan_model(
        self,
        tokens: Sequence[int],
        limit: int,
        params: SamplingParams,
        rng: np.random.Generator,
        t0: float,
        declined: Declined | None,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """Draft with the draft model, probe it, measure it, or pause."""
        assert self.model is not None
        d = self.costs.draft_step()
        self._since_model += 1
        self._copy_share *= 0.9
        c = self._model_class = model_class(self._target_conf)
        self._amortized = 1.0  # until this round's catch-up is planned (none while measuring)
        self._class_share = [0.9 * x + 0.1 * (i == c) for i, x in enumerate(self._class_share)]
        acc = self._estimate("model", c)
        if d is None or self.costs.verify(2) is None:
            if self.costs.verify(1) is None:
                return _no_draft(Action.MEASURE, t0, declined)
            plan = Plan(min(2, limit), 0.0, 0.0)
            decision = Decision(Action.MEASURE, Policy.AUTO, Source.MODEL, k=plan.k)
        elif self._model_cannot_pay(d, limit):
            return _no_draft(Action.PAUSED, t0, declined)
        else:
            plan = best_length(
                acc, self.costs, d, limit, self.margin, self._catch_up(tokens, d), self._model_overrun()
            )
            sure = min(self._target_conf, default=0.0)
            decision = Decision(
                Action.DRAFT,
                Policy.AUTO,
                Source.MODEL,
                k=plan.k,
                target_sure=sure if sure >= CONFIDENCE_FLOOR else None,
                sure_floor=CONFIDENCE_FLOOR,
                acceptance=acc.overall(),
                expected_speedup=plan.rate / plan.plain_rate,
                measured_speedup=self._measured(f"model{c}"),
            )
            if plan.k > 0 and self._losing(f"model{c}"):
                plan = Plan(0, plan.rate, plan.plain_rate)
            if plan.k == 0:
                if not self._probe_due(tokens, d, limit):
                    return _no_draft(Action.PAUSED, t0, declined)
                plan = Plan(min(PROBE_K, limit), 0.0, plan.plain_rate)
                decision = Decision(Action.PROBE, Policy.AUTO, Source.MODEL, k=plan.k)
                self._probing = True
        if plan.k == 0:
            return _no_draft(Action.NO_ROOM, t0, declined)
        self._since_model = 0
        # a probe stays short; a real round drafts on while the draft's confidence says it pays
        room = plan.k if self._probing else limit
        keep_going = continue_rule(self.costs, self.acc["model"], acc, self.costs.draft_step() or 0.0, room)
        if grammar is None:  # (a grammar only where there is one: a replayed model takes none)
            prop = self.model.propose(tokens, room, params, rng, keep_going=keep_going)
        else:
            prop = self.model.propose(tokens, room, params, rng, keep_going=keep_going, grammar=grammar)
        return replace(prop, decision=replace(decision, k=plan.k), t=time.perf_counter() - t0)

    def _measured(self, kind: str) -> float | None:
        """What recent rounds of ``kind`` delivered over plain rounds (None: too few of either)."""
        mine, plain = self._realized[kind], self._realized["none"]
        if mine.n < 3 or plain.n < 3 or plain.rate() <= 0:
            return None
        return mine.rate() / plain.rate()

    def _follow_undrafted(self, tokens: Sequence[int], end: bool = False) -> None:
        """Check the undrafted copy against the text that followed it; once it broke or ran out (or
        at ``end``: this round drafts), count what drafting it would have got as evidence."""
        kind, c, sure, diagonal, start, copy = self._undrafted  # type: ignore[misc]
        n = min(len(copy), len(tokens) - start)
        held = 0
        while held < n and copy[held] == tokens[start + held]:
            held += 1
        if held == n and n < len(copy) and not end:
            return  # holding so far: follow it on
        self._undrafted = None
        drafted = held if held == n and end else n
        if drafted == 0:
            return
        self._estimate(kind, c, sure).observe(drafted, held)
        if held and diagonal is not None:
            self._copy_diagonal = diagonal  # a copy in progress: a short match after an edit resumes it

    def _model_cannot_pay(self, draft_cost: float, limit: int) -> bool:
        """Even a draft that is always right, with nothing to catch up, would not beat plain decoding.

        Then there is nothing to plan or probe: a plan (acceptance at most 1, a catch-up at least 0,
        its round's cost scaled by the overrun) and a probe's hope (at most ``optimistic``, unscaled)
        are bounded by this one, so the answer is the same, for a third of the Python per round (on
        a CPU where the draft model never pays, most rounds ask it).
        """
        scale = min(1.0, self._model_overrun())
        return best_length(ALWAYS, self.costs, draft_cost, limit, self.margin, scale=scale).k == 0

    def _lookup_class(self, match: int, diagonal: int) -> int:
        """The class of a lookup draft copied after a ``match``-token match on this ``diagonal``."""
        last = self._copy_diagonal
        if match < RESUME_BELOW and last is not None and abs(diagonal - last) <= RESUME_SHIFT:
            return RESUME
        return lookup_class(match)

    def _copy_acc(self, source: str) -> list[tuple[Acceptance, Acceptance]]:
        """The pooled acceptance of copies from ``source`` ("lookup" or "history"), by class."""
        return self.lookup_acc if source == "lookup" else self.history_acc

    def _estimate(self, source: str, c: int, sure: int | None = None) -> ReplyAcceptance:
        """Acceptance in this reply for a class of ``source`` ("lookup" and "history": also by the
        target's sureness, this round's unless ``sure`` is given; or "model")."""
        copies = source != "model"
        sure = (self._sure if sure is None else sure) if copies else 0
        key = (source, c, sure)
        est = self._reply.get(key)
        if est is None:
            pooled = self._copy_acc(source)[c][sure] if copies else self.model_acc[c]
            est = self._reply[key] = ReplyAcceptance(pooled, REPLY_WEIGHT[copies], copies=copies)
        return est

    def _model_overrun(self) -> float:
        """What model rounds really took over what the cost model predicted (1.0 until measured)."""
        return min(2.0, max(0.8, self._overrun.value)) if self._overrun.n >= 3 else 1.0

    def _sync_per_token(self, draft_cost: float) -> float:
        """The draft's seconds per token when catching up (a batch: cheaper than drafting)."""
        return self._sync_cost.value if self._sync_cost.n else 0.35 * draft_cost

    def _catch_up(self, tokens: Sequence[int], draft_cost: float) -> float:
        """A round's share of what catching the draft up with the text costs (0 when it kept up).

        The draft falls behind by every token decoded without it. Catching up serves the model
        rounds that follow in this reply too, until the draft falls behind again, so a round is
        charged its share over the fewer of: the rounds of the same class expected in what is left
        of the reply (how often this reply has been in the class, times the rounds left at a few
        tokens each; the rest of the reply is expected to be as long as the reply so far, see
        ``REPLY_MIN``, and counted as ``HORIZON`` tokens at most); the model rounds a
        catch-up has served lately in this reply (once it has had a few; until then in earlier
        replies); and the rounds expected before prompt lookup drafts again (one in 1 / its share of
        this reply's recent rounds), which leaves the draft behind as plain decoding does. In a JSON
        reply or a code edit where copies and model rounds take turns, each model round needs its
        own catch-up.
        """
        # up to 2 are a drafted round's own (its last draft token and the target's), the rest is lag
        behind = self.model.pending(tokens) - 2 if self.model is not None else 0
        if behind <= 0:
            self._amortized = 1.0
            return 0.0
        rounds_left = min(self._rest, HORIZON) / TOKENS_PER_ROUND
        spread = self._class_share[self._model_class] * rounds_left
        if len(self._runs) > SERVED_RUNS:  # the last run is still going on
            spread = min(spread, statistics.median(list(self._runs)[:-1]))
        elif self._served.n >= SERVED_RUNS + 1:  # until then: what catch-ups served in earlier replies
            spread = min(spread, self._served.value)
        if self._copy_share > 0:  # prompt lookup's rounds leave the draft behind again
            spread = min(spread, 1.0 / self._copy_share)
        self._amortized = max(1.0, spread)
        return behind * self._sync_per_token(draft_cost) / self._amortized

    def _losing(self, source: str) -> bool:
        """Recent rounds drafted by ``source`` delivered fewer tokens/s than plain rounds did."""
        mine, plain = self._realized[source], self._realized["none"]
        return mine.n >= 3 and plain.n >= 3 and mine.rate() < plain.rate()

    def _probe_optimism(self) -> Acceptance:
        """The acceptance a probe hopes for in the current class: halfway from what the class is
        known for (its prior, or its evidence if better) to always right. Where the target hesitates
        the draft agrees with it 75 % of the time, so on a CPU a probe there cannot find a draft that
        pays, and each probe costs a catch-up and a batch (2-3 decode steps for 1-2 tokens)."""
        known = self.model_acc[self._model_class]
        hope = max(known.prior, known.overall())
        hope = min(self._optimistic.prior, hope + (1.0 - hope) * PROBE_HOPE)
        return Acceptance(self.n_max, prior=hope, weight=1e12)

    def _probe_due(self, tokens: Sequence[int], draft_cost: float, limit: int) -> bool:
        """A probe is worth its price: the catch-up, and what its own round is expected to lose
        against a plain step at the acceptance this class has shown (a probe drafts ``PROBE_K``
        tokens for a batch of up to ``PROBE_K + 1``), must be less than what finding out could gain
        over the rest of the reply, discounted by the odds that drafting turns out to pay."""
        if self.model is None or self._since_model < self._probe_interval:
            return False
        best = best_length(self._probe_optimism(), self.costs, draft_cost, limit, self.margin)
        if best.k == 0 or best.plain_rate <= 0:
            return False  # the draft model cannot pay here even if this class turns out much better
        catch_up = self.model.pending(tokens) * self._sync_per_token(draft_cost)
        k = min(PROBE_K, limit)
        known = self._estimate("model", self._model_class)
        reach, expected = 1.0, 1.0
        for i in range(k):
            reach *= known.alpha(i)
            expected += reach
        verify = self.costs.verify(k + 1)
        own = (k * draft_cost + (verify or 0.0)) * self._model_overrun() - expected / best.plain_rate
        rest_of_reply = self._rest / best.plain_rate  # seconds, decoding plainly
        gain = self.probe_odds * (best.rate / best.plain_rate - 1) * rest_of_reply
        return catch_up + max(0.0, own) <= gain

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        self.costs.observe_verify(outcome.batch, outcome.t_verify)
        self._target_conf.extend(outcome.confidence)
        if not proposal.tokens:
            kind = "none"
        elif proposal.source in (Source.LOOKUP, Source.HISTORY):
            kind = f"{self._copy_round[0]}{self._copy_round[1]}"
        else:
            kind = f"model{self._model_class}"
        if kind in self._realized and not self._probing:  # a probe is short on purpose: not a sample
            seconds, charged = outcome.t_round, 0.0
            if proposal.n_sync > 2:  # the round's share of catching up, as the plan charged it
                catch_up = proposal.t_sync * (proposal.n_sync - 2) / proposal.n_sync
                charged = catch_up / self._amortized
                seconds -= catch_up - charged
            self._realized[kind].add(outcome.n_accepted + 1, seconds)
            d, v = self.costs.draft_step(), self.costs.verify(outcome.batch)
            if kind.startswith("model") and d and v:
                self._overrun.add(seconds / (outcome.n_drafted * d + v + charged))
        if outcome.batch == 1:
            self._since_plain = 0
        if proposal.source is Source.MODEL and proposal.n_steps:
            self.costs.observe_draft(proposal.n_steps, proposal.t_steps)
        if proposal.source is Source.MODEL and proposal.n_sync > 2:
            self._sync_cost.add(proposal.t_sync / proposal.n_sync)
        if proposal.source is Source.MODEL and proposal.tokens:
            if proposal.n_sync > 2 or not self._runs:
                self._runs.append(1)  # a catch-up: a new run of model rounds
            else:
                self._runs[-1] += 1
        if proposal.source in (Source.LOOKUP, Source.HISTORY):
            source, c, diagonal = self._copy_round
            if outcome.n_accepted and diagonal is not None:
                self._copy_diagonal = diagonal
            pooled = self._copy_acc(source)[c][self._sure]
            pooled.observe(outcome.n_drafted, outcome.n_accepted, proposal.confidence)
            self._estimate(source, c).observe(outcome.n_drafted, outcome.n_accepted)
        elif proposal.source is Source.MODEL:
            for acc in (self.acc["model"], self.model_acc[self._model_class]):
                acc.observe(outcome.n_drafted, outcome.n_accepted, proposal.confidence)
            self._estimate("model", self._model_class).observe(outcome.n_drafted, outcome.n_accepted)
        if self._probing:
            acc = self._estimate("model", self._model_class)
            plan = best_length(acc, self.costs, self.costs.draft_step() or 0.0, self.n_max, self.margin)
            if plan.k:  # drafting pays again: judge the next real rounds afresh
                self._probe_interval = self.probe_every
                self._realized[f"model{self._model_class}"].rounds.clear()
            else:
                self._probe_interval = min(self.probe_max, self._probe_interval * 2)

    def close(self) -> None:
        self.lookup.close()


def _no_draft(action: Action, t0: float, declined: Declined | None = None) -> Proposal:
    """A round that drafts nothing, and why (``t0``: when planning began; 0.0 for no time spent)."""
    t = time.perf_counter() - t0 if t0 else 0.0
    return Proposal((), (), (), Source.NONE, t, decision=Decision(action, Policy.AUTO, declined=declined))
