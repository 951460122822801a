"""The drafter interface: what the loop asks of a drafter, and the records they exchange.

A drafter proposes the next few tokens (:class:`Proposal`); the loop verifies them with the target
and tells the drafter how it went (:class:`Outcome`). The loop depends on this module only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from app.engine import sampling
from app.engine.events import Decision, Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.grammar import Grammar


@dataclass(frozen=True, slots=True)
class Proposal:
    """Drafted tokens with the draft distribution each was drawn from (None: deterministic)."""

    tokens: tuple[int, ...]
    q: tuple[np.ndarray | None, ...]
    confidence: tuple[float, ...]  # the drafter's own probability of each token (1.0 for lookup)
    source: Source
    t: float  # seconds spent drafting
    t_llama: float = 0.0  # of which inside llama_decode
    n_steps: int = 0  # single-token draft decodes (the per-token cost sample for auto mode)
    t_steps: float = 0.0  # seconds those took
    n_sync: int = 0  # tokens the draft evaluated to catch up with the text before drafting
    t_sync: float = 0.0  # seconds that took
    decision: Decision | None = None  # what the drafter decided (None: the policy's choice stands)
    match: int = 0  # lookup: how many tokens of the context's end matched where the draft was copied
    origin: int = -1  # lookup: the context index the draft was copied from
    # lookup: earlier occurrences that match as far back disagree on the next token (a coin flip
    # between texts, not a copy in progress)
    ambiguous: bool = False
    # tokens at the end copied where a model's draft ends (prompt lookup going on after it; their
    # ``match`` and ``origin`` are the copy's)
    copied: int = 0


EMPTY = Proposal((), (), (), Source.NONE, 0.0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the loop tells a drafter after verification."""

    source: Source
    n_drafted: int
    n_accepted: int
    batch: int
    t_verify: float
    t_round: float = 0.0  # the whole round so far: drafting, verification and its Python
    # the target's top-token probability for the last tokens the round added (when the drafter asks)
    confidence: tuple[float, ...] = ()
    # whether t_verify times the evaluation: a batch queued before its round was planned is not timed
    # where the CPU took longer than it (see app.engine.overlap)
    timed: bool = True


class Drafter(Protocol):
    """Proposes tokens for the target to verify. Every drafter implements all of it."""

    name: str
    # how many of each round's last tokens the loop reports the target's confidence in (0: none),
    # exact at or above ``target_confidence_floor`` and an upper bound below it
    wants_target_confidence: int
    target_confidence_floor: float

    def begin(self, prompt: Sequence[int]) -> float:
        """A new request with this prompt; returns seconds spent (prompt processing)."""
        ...

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """Up to ``k`` tokens likely to follow ``tokens``. With a ``grammar`` (structured output; the loop
        passes it only then, in the state after ``tokens``), preferably tokens it allows: the loop
        rejects the others. The drafter must leave the grammar's state as it found it."""
        ...

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        """The outcome of verifying ``proposal``."""
        ...

    def close(self) -> None: ...


def within(proposal: Proposal, grammar: Grammar | None) -> Proposal:
    """A deterministic draft (a copy) cut before the first token ``grammar`` forbids."""
    if grammar is None or not proposal.tokens:
        return proposal
    n = grammar.valid_prefix(proposal.tokens)
    if n == len(proposal.tokens):
        return proposal
    return replace(proposal, tokens=proposal.tokens[:n], q=proposal.q[:n], confidence=proposal.confidence[:n])


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, given that the first ``start`` items agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def draft_token(
    logits: np.ndarray,
    history: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    walk: Grammar | None,
    p_min: float,
) -> tuple[int, np.ndarray | None, float] | None:
    """One drafted token from a draft's logits: ``(token, q, confidence)``, or None where the draft's
    top probability is under ``p_min``. Greedy: the argmax (a point mass, ``q`` None) among what the
    grammar walk allows; sampling: drawn from the distribution ``q`` under the same settings, which
    verification needs for exact rejection sampling."""
    if params.greedy:
        x = sampling.penalized(logits, history, params)
        if walk is not None and not walk.allows(int(x.argmax())):
            x = sampling.masked(x, walk)
        top = sampling.top_probability(x)
        return (int(x.argmax()), None, top) if top >= p_min else None
    q = sampling.distribution(logits, history, params, walk)
    if float(q.max()) < p_min:
        return None
    tok = sampling.sample(q, rng)
    return tok, q, float(q[tok])
