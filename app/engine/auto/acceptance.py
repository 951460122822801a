"""Acceptance estimates: how likely each draft token is to be accepted, by class of situation, pooled
over replies and followed within each reply."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.engine.auto.priors import (
    BORROW_TRIALS,
    BREAK_PRIOR,
    BREAK_WEIGHT,
    LOOKUP_CLASSES,
    MODEL_CLASSES,
    RESUME_BELOW,
)
from app.engine.drafting.base import Proposal


def lookup_class(match: int) -> int:
    """The class of a prompt lookup draft copied after a ``match``-token match."""
    return max(i for i, (m, _, _) in enumerate(LOOKUP_CLASSES) if match >= m)


def model_class(target_confidence: Sequence[float]) -> int:
    """The model class of a stretch whose last tokens the target gave these top probabilities."""
    if not target_confidence:
        return 0
    low = min(target_confidence)
    return max(i for i, (c, _) in enumerate(MODEL_CLASSES) if low >= c)


class Acceptance:
    """Per-position conditional acceptance of one drafter, and calibration by draft confidence."""

    BINS = 10

    def __init__(
        self,
        n_max: int,
        *,
        prior: float = 0.6,
        weight: float = 2.0,
        decay: float = 0.97,
        prior_rest: float | None = None,
    ):
        """``prior``: acceptance per token before evidence. With ``prior_rest`` each position is
        judged on its own: ``prior`` is the first token's prior, ``prior_rest`` each later one's (given
        the ones before it were accepted). A copy ends at the next edit, so success at positions 1-2
        (where drafts of 3 are tested) says little about positions 10-15: no pooling across them."""
        self.prior, self.weight, self.decay = prior, weight, decay
        self.prior_rest = prior_rest
        self.hits = np.zeros(n_max)
        self.trials = np.zeros(n_max)
        self.bin_hits = np.zeros(self.BINS)
        self.bin_trials = np.zeros(self.BINS)
        self._overall: float | None = None
        self._alphas: list[float] | None = None  # alpha(i) for every position, until the evidence changes

    def observe(self, n_drafted: int, n_accepted: int, confidence: Sequence[float]) -> None:
        if n_drafted == 0:
            return
        self._overall = self._alphas = None
        self.hits *= self.decay
        self.trials *= self.decay
        self.bin_hits *= self.decay
        self.bin_trials *= self.decay
        for i in range(min(n_drafted, n_accepted + 1, len(self.hits))):  # tokens actually judged
            ok = i < n_accepted
            self.hits[i] += ok
            self.trials[i] += 1
            if i < len(confidence):
                b = min(int(confidence[i] * self.BINS), self.BINS - 1)
                self.bin_hits[b] += ok
                self.bin_trials[b] += 1

    def judge(self, i: int, ok: bool, confidence: float) -> None:
        """One more judged token at position ``i`` (one the round did not verify: see
        :meth:`~.model_rounds.ModelRounds.judge_cut`), without fading the rest."""
        if i >= len(self.hits):
            return
        self._overall = self._alphas = None
        self.hits[i] += ok
        self.trials[i] += 1
        b = min(int(confidence * self.BINS), self.BINS - 1)
        self.bin_hits[b] += ok
        self.bin_trials[b] += 1

    def state(self) -> dict[str, list[float]]:
        """The evidence, for :class:`~app.engine.auto.memory.AutoMemory`."""
        arrays = ("hits", "trials", "bin_hits", "bin_trials")
        return {name: [round(float(x), 4) for x in getattr(self, name)] for name in arrays}

    def restore(self, state: object) -> bool:
        """Take a saved :meth:`state`'s evidence (only if every array has this estimate's shape)."""
        from app.engine.auto.memory import floats

        if not isinstance(state, dict):
            return False
        arrays = {name: floats(state.get(name), len(getattr(self, name))) for name in self.state()}
        if any(a is None for a in arrays.values()):
            return False
        for name, values in arrays.items():
            getattr(self, name)[:] = values
        self._overall = self._alphas = None
        return True

    def relax(self, factor: float) -> None:
        """Fade the evidence toward the prior, so a pessimistic estimate is tried again in time."""
        for a in (self.hits, self.trials, self.bin_hits, self.bin_trials):
            a *= factor
        self._overall = self._alphas = None

    def overall(self) -> float:
        if self._overall is None:
            hits, trials = self.hits.sum(), self.trials.sum()
            self._overall = float((hits + self.prior * self.weight) / (trials + self.weight))
        return self._overall

    def _base(self, i: int) -> float:
        """Position ``i``'s estimate before its own evidence (pooled over positions without split)."""
        if self.prior_rest is None:
            return self.overall()
        return self.prior if i == 0 else self.prior_rest

    def alpha(self, i: int) -> float:
        """P(draft token i is accepted | the ones before it were), 0-based."""
        alphas = self._alphas
        if alphas is None:  # the planner asks every position of every class in every round
            base = np.full(len(self.hits), self._base(1))
            base[:1] = self._base(0)
            alphas = self._alphas = ((self.hits + base * self.weight) / (self.trials + self.weight)).tolist()
        return alphas[i] if i < len(alphas) else self._base(i)

    def calibrated(self, confidence: float) -> float:
        """P(accepted | the draft's own probability for the token was ``confidence``).

        Until a bin has evidence, its estimate is the draft's own probability (the bin's middle):
        a draft's probabilities track whether a larger model of its family agrees fairly well.
        """
        b = min(int(confidence * self.BINS), self.BINS - 1)
        prior = (b + 0.5) / self.BINS
        return float((self.bin_hits[b] + prior * self.weight) / (self.bin_trials[b] + self.weight))


class ReplyAcceptance:
    """This reply's own evidence on top of a pooled :class:`Acceptance` (its prior).

    A pooled estimate learns over many replies, so a reply that differs from the rest (prose where
    short n-gram matches keep failing, a JSON reply the draft gets right every time) would take many
    rounds to move it. Here each position's estimate starts at the pooled one and follows this
    reply's outcomes with the weight of ``weight`` pooled samples.

    With ``copies`` (prompt lookup), a position this reply has not drafted yet takes the higher of
    its pooled estimate and what the deepest position drafted at least ``BORROW_TRIALS`` times has
    shown. A copy that has gone on at positions 1-2 in this reply tends to go on further; without
    this, later positions stay at the pooled value, short drafts stay the best bet, and the reply
    never tests whether its copies run on.
    """

    __slots__ = ("_deepest", "copies", "hits", "pooled", "trials", "weight")

    def __init__(self, pooled: Acceptance, weight: float = 4.0, *, copies: bool = False):
        self.pooled, self.weight, self.copies = pooled, weight, copies
        self.hits = [0.0] * len(pooled.hits)
        self.trials = [0.0] * len(pooled.hits)
        self._deepest = 0  # the deepest position past the first drafted BORROW_TRIALS times (0: none)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        for i in range(min(n_drafted, n_accepted + 1, len(self.hits))):
            self.hits[i] += i < n_accepted
            self.trials[i] += 1
            if i > self._deepest and self.trials[i] >= BORROW_TRIALS:
                self._deepest = i

    def judge(self, i: int, ok: bool) -> None:
        """One more judged token at position ``i`` (see :meth:`Acceptance.judge`)."""
        if i < len(self.hits):
            self.hits[i] += ok
            self.trials[i] += 1

    def overall(self) -> float:
        prior = self.pooled.overall()
        return (sum(self.hits) + prior * self.weight) / (sum(self.trials) + self.weight)

    def alpha(self, i: int) -> float:
        prior = self.pooled.alpha(i)
        if i < len(self.hits) and self.trials[i]:
            return (self.hits[i] + prior * self.weight) / (self.trials[i] + self.weight)
        j = self._deepest
        if not self.copies or not j or j >= i:
            return prior
        return max(prior, (self.hits[j] + prior) / (self.trials[j] + 1))  # shrunk by one pooled sample


class Upper:
    """A :class:`ReplyAcceptance` read ``errors`` standard errors above its estimate at each position
    (the pooled prior counted as its ``weight`` samples): what this reply's acceptance could still
    turn out to be."""

    __slots__ = ("acc", "errors")

    def __init__(self, acc: ReplyAcceptance, errors: float):
        self.acc, self.errors = acc, errors

    def alpha(self, i: int) -> float:
        a = self.acc.alpha(i)
        n = (self.acc.trials[i] if i < len(self.acc.trials) else 0.0) + self.acc.weight
        return min(1.0, a + self.errors * (a * (1.0 - a) / (n + 1.0)) ** 0.5)


class CopyBreaks:
    """Where this reply departed from the copies prompt lookup offered it, and how often later
    copies held at those places.

    Every continuation the lookup drafter finds is checked against the text that actually followed,
    drafted or not (free: the text is known by the next round). The first position where the reply
    differed is a break (in a list of JSON records: the value after a key) if the copy had held
    there: past its first token, or after a match long enough to be a copy in its own right (a short
    match failing at once was a coincidence). A later copy of that stretch reaches the break at the
    same offset, where it is likely to fail again.
    """

    __slots__ = ("_offered", "breaks", "hits", "trials")

    def __init__(self) -> None:
        self.begin()

    def begin(self) -> None:
        self.breaks: set[int] = set()  # context indexes where the reply departed from a copy
        self.hits = self.trials = 0.0  # copied tokens that came from a break, and how many held
        self._offered: tuple[int, int, int, tuple[int, ...]] | None = None  # (length, origin, match, copy)

    def check(self, tokens: Sequence[int]) -> tuple[int, int]:
        """Compare the last copy offered with the text that followed it (call before each lookup):
        where it started in the context and how many of its tokens the text has so far held to."""
        offered, self._offered = self._offered, None
        if offered is None or len(tokens) < offered[0]:
            return 0, 0
        start, origin, match, copy = offered
        n = min(len(copy), len(tokens) - start)
        for i in range(n):
            held = copy[i] == tokens[start + i]
            if origin + i in self.breaks:
                self.trials += 1
                self.hits += held
            if not held:
                if i or match >= RESUME_BELOW:
                    self.breaks.add(start + i)
                return start, i
        return start, n

    def offer(self, tokens: Sequence[int], found: Proposal) -> frozenset[int]:
        """Remember a copy to check next round; the offsets of its tokens copied from breaks."""
        self._offered = (len(tokens), found.origin, found.match, found.tokens)
        return self.at(found)

    def at(self, found: Proposal) -> frozenset[int]:
        """The offsets of a copy's tokens copied from breaks."""
        if not self.breaks:
            return frozenset()
        return frozenset(i for i in range(len(found.tokens)) if found.origin + i in self.breaks)

    def rate(self) -> float:
        """P(a copied token from a break is right), from this reply's copies."""
        return (self.hits + BREAK_PRIOR * BREAK_WEIGHT) / (self.trials + BREAK_WEIGHT)


class AtBreaks:
    """A lookup class's estimate, with the draft's tokens copied from breaks judged at their rate."""

    __slots__ = ("acc", "offsets", "rate")

    def __init__(self, acc: ReplyAcceptance, offsets: frozenset[int], rate: float):
        self.acc, self.offsets, self.rate = acc, offsets, rate

    def alpha(self, i: int) -> float:
        return self.rate if i in self.offsets else self.acc.alpha(i)

    def overall(self) -> float:
        return self.acc.overall()


class Always:
    """The acceptance of a draft that is always right: a bound on what any draft can deliver."""

    def alpha(self, i: int) -> float:
        return 1.0


ALWAYS = Always()
