"""Auto mode's copies: whether to draft (part of) the copy prompt lookup or the history offers.

A copy is judged by its class (the length of the match it was copied after, or a short match that
resumes the last accepted copy after a small edit) at this reply's estimate of that class; tokens
copied from where this reply once departed from a copy of itself are judged at the rate such tokens
held (:class:`CopyBreaks`). A copy offered and not drafted is followed against the text as it comes:
what drafting it would have got counts as this reply's evidence for its class (without it a class
whose prior does not pay is never drafted, so never learned). A class whose rounds deliver less than
plain rounds is tried again only now and then, with back-off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from app.engine.auto.acceptance import AtBreaks, CopyBreaks, ReplyAcceptance, lookup_class
from app.engine.auto.costs import CostModel
from app.engine.auto.evidence import COPIERS, Evidence, Kind
from app.engine.auto.planner import Plan, best_length
from app.engine.auto.priors import (
    AMBIGUOUS,
    AMBIGUOUS_BELOW,
    COPYING,
    COVERED_SHARE,
    FIRST_LOOKUP,
    RESUME,
    RESUME_BELOW,
    RESUME_SHIFT,
)
from app.engine.drafting.base import Outcome, Proposal
from app.engine.events import Action, Decision, Declined, Policy, Source

BACK_OFF_MAX = 64  # a losing class is tried again at most this many offers apart


class CopyRounds:
    """Plans the rounds that draft a copy, and learns from them (part of :class:`AutoDrafter`)."""

    def __init__(self, costs: CostModel, evidence: Evidence, margin: float):
        self.costs, self.evidence, self.margin = costs, evidence, margin
        self.breaks = CopyBreaks()  # where this reply departed from copies of itself
        self.share = 0.0  # this reply's rounds drafted by a copy (recent ones weigh more)
        self.diagonal: int | None = None  # context index minus copied index of the last copy
        # the copy being verified: its kind and diagonal (None: from the history)
        self.round: tuple[Kind, int | None] = ((Source.LOOKUP, 0), 0)
        # A copy offered and not drafted, followed against the text as it comes: (kind, copying,
        # diagonal, context index where it starts, the copy).
        self.undrafted: tuple[Kind, int, int | None, int, tuple[int, ...]] | None = None
        self.begin()

    def begin(self) -> None:
        """A new reply. Copies are judged per reply (their cost is just a batch; what differs between
        replies is acceptance): a class losing in code must not pause it in the JSON reply that follows."""
        self.evidence.forget_realized(COPIERS)
        kinds = list(self.evidence.kinds(COPIERS))
        self._skip = dict.fromkeys(kinds, 0)
        self._every = dict.fromkeys(kinds, 1)
        self.share = 0.0
        self.diagonal = None
        self.breaks.begin()
        self.undrafted = None
        self.covered = 0  # tokens of this reply that a copy offered before them held to
        self._covered_to = 0  # the context index up to which they were counted

    def check(self, tokens: Sequence[int], reply: int) -> int:
        """Check the last copy offered against the text that followed it; whether this reply is
        copying (of its ``reply`` tokens so far, at least ``COVERED_SHARE`` held to a copy offered
        before them: the split of each copy class's evidence)."""
        start, held = self.breaks.check(tokens)
        if held:
            begin = max(start, self._covered_to)
            self.covered += max(0, start + held - begin)
            self._covered_to = max(self._covered_to, start + held)
        return int(self.covered >= COVERED_SHARE * reply)

    def kind(self, tokens: Sequence[int], found: Proposal) -> tuple[Kind, int | None]:
        """The kind and diagonal (None: from the history) of a copy offered this round."""
        if found.source is Source.LOOKUP:
            diagonal = len(tokens) - found.origin
            return (Source.LOOKUP, self.lookup_class(found.match, diagonal, found.ambiguous)), diagonal
        return (found.source, lookup_class(found.match)), None

    def lookup_class(self, match: int, diagonal: int, ambiguous: bool = False) -> int:
        """The class of a lookup draft copied after a ``match``-token match on this ``diagonal``
        (``ambiguous``: other occurrences matching as far go on differently)."""
        last = self.diagonal
        if match < RESUME_BELOW and last is not None and abs(diagonal - last) <= RESUME_SHIFT:
            return RESUME
        return AMBIGUOUS if ambiguous and match < AMBIGUOUS_BELOW else lookup_class(match)

    def plan(self, tokens: Sequence[int], found: Proposal, at_breaks: frozenset[int] = frozenset()) -> Plan:
        """The best draft of this copy at its class's acceptance (tokens copied from where this reply
        departed from a copy of itself, ``at_breaks``, judged at the rate such tokens held)."""
        (source, c), _ = self.kind(tokens, found)
        acc = self.evidence.estimate(source, c)
        view = AtBreaks(acc, at_breaks, self.breaks.rate()) if at_breaks else acc
        return best_length(view, self.costs, 0.0, self.room(acc, found), self.margin)

    @staticmethod
    def room(acc: ReplyAcceptance, found: Proposal) -> int:
        """How much of a copy may be drafted: the first of its class in a reply is capped (a copy in
        progress is not)."""
        first = acc.trials[0] or found.match >= COPYING
        return len(found.tokens) if first else min(len(found.tokens), FIRST_LOOKUP)

    def better(self, tokens: Sequence[int], context: Proposal, history: Proposal) -> bool:
        """The history's copy is another text than the context's and is expected to pay more.

        Where both copy the same text (one is the start of the other) the context's is taken: it
        knows where the copy is in the text, by which a copy resumed after an edit and the places
        where this reply departed from it are found."""
        n = min(len(history.tokens), len(context.tokens))
        if history.tokens[:n] == context.tokens[:n]:
            return False
        return self._rate(tokens, history) > self._rate(tokens, context)

    def _rate(self, tokens: Sequence[int], found: Proposal) -> float:
        """The tokens per second drafting this copy is expected to deliver (plain's if it does not pay)."""
        at_breaks = self.breaks.at(found) if found.source is Source.LOOKUP else frozenset()
        return self.plan(tokens, found, at_breaks).rate

    def propose(
        self, tokens: Sequence[int], found: Proposal, t0: float, beat: float = 0.0
    ) -> tuple[Proposal | None, Declined | None]:
        """Draft (part of) the copy prompt lookup or the history found, or decline it (also where a
        draft model round is expected to deliver more: ``beat`` tokens per second)."""
        kind, diagonal = self.round = self.kind(tokens, found)
        at_breaks = self.breaks.offer(tokens, found) if diagonal is not None else frozenset()
        plan = self.plan(tokens, found, at_breaks)
        if plan.k and plan.rate <= beat:
            plan = Plan(0, plan.rate, plan.plain_rate)
        losing = plan.k > 0 and self.evidence.losing(kind)
        if losing:  # try again only now and then, with back-off
            self._skip[kind] += 1
            if self._skip[kind] < self._every[kind]:
                plan = Plan(0, plan.rate, plan.plain_rate)
            else:
                self._skip[kind] = 0
                self._every[kind] = min(BACK_OFF_MAX, self._every[kind] * 2)
        elif plan.k > 0:
            self._every[kind] = 1
        if plan.k == 0:
            if self.undrafted is None:
                self.undrafted = (kind, self.evidence.copying, diagonal, len(tokens), found.tokens)
            return None, Declined(found.source, found.match, losing)
        n = plan.k
        if self.undrafted is not None:
            self.follow(tokens, end=True)
        self.share = 0.9 * self.share + 0.1
        decision = Decision(
            Action.DRAFT,
            Policy.AUTO,
            found.source,
            k=n,
            match=found.match,
            resumes_copy=kind[1] == RESUME and kind[0] is Source.LOOKUP,
            copy_broke_at=min(at_breaks) + 1 if at_breaks else 0,
            expected_speedup=plan.rate / plan.plain_rate,
            measured_speedup=self.evidence.measured(kind),
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

    def follow(self, tokens: Sequence[int], end: bool = False) -> None:
        """Check the undrafted copy against the text that followed it; once it broke or ran out (or
        at ``end``: this round drafts), count what drafting it would have got as evidence."""
        if self.undrafted is None:
            return
        (source, c), copying, diagonal, start, copy = self.undrafted
        n = min(len(copy), len(tokens) - start)
        held = 0
        while held < n and copy[held] == tokens[start + held]:
            held += 1
        if held == n and n < len(copy) and not end:
            return  # holding so far: follow it on
        self.undrafted = None
        drafted = held if held == n and end else n
        if drafted == 0:
            return
        self.evidence.estimate(source, c, copying).observe(drafted, held)
        if held and diagonal is not None:
            self.diagonal = diagonal  # a copy in progress: a short match after an edit resumes it

    def after(
        self, tokens: Sequence[int], k: int, found: Proposal
    ) -> tuple[Kind, int, AtBreaks | ReplyAcceptance, int]:
        """The kind, diagonal, acceptance estimate and room of a copy ``found`` to follow a draft of
        ``k`` tokens after ``tokens`` (judged as a copy at that place, given the draft was right)."""
        diagonal = len(tokens) + k - found.origin
        kind: Kind = (Source.LOOKUP, self.lookup_class(found.match, diagonal, found.ambiguous))
        acc = self.evidence.estimate(*kind)
        at_breaks = self.breaks.at(found)
        view = AtBreaks(acc, at_breaks, self.breaks.rate()) if at_breaks else acc
        return kind, diagonal, view, self.room(acc, found)

    def observe_after(self, kind: Kind, diagonal: int, n_drafted: int, n_accepted: int) -> None:
        """Learn from a copy verified after a draft that was accepted whole."""
        self.evidence.pooled(*kind, self.evidence.copying).observe(n_drafted, n_accepted, ())
        self.evidence.estimate(*kind).observe(n_drafted, n_accepted)
        if n_accepted:
            self.diagonal = diagonal

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        """Learn from a round that drafted a copy."""
        (source, c), diagonal = self.round
        if outcome.n_accepted and diagonal is not None:
            self.diagonal = diagonal
        pooled = self.evidence.pooled(source, c, self.evidence.copying)
        pooled.observe(outcome.n_drafted, outcome.n_accepted, proposal.confidence)
        self.evidence.estimate(source, c).observe(outcome.n_drafted, outcome.n_accepted)
