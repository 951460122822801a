"""Auto mode: draft only when it pays, measured online for this pair on this machine.

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
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from app.engine.drafters import LookupDrafter, ModelDrafter, Proposal
from app.engine.sampling import SamplingParams

PAUSED = "drafting paused: verifying costs more than it saves on this machine"


def is_paused(reason: str) -> bool:
    """A round's reason says auto mode paused drafting (it may go on to say what prompt lookup found)."""
    return reason.startswith(PAUSED)


# Prompt lookup: (shortest match length, prior acceptance where the target has been sure of the last
# tokens, and where it has not) of each class of match. A short match is often a coincidence; a long
# one is a copy of the input in progress. Each prior is (first token, each later token given the ones
# before it were accepted): a draft is either a copy, and then it goes on, or a coincidence that fails
# at once. Teacher-forced over the benchmark's 16 replies, a 2-token match where the target was sure
# was right 50 % of the time, and then its next tokens 86-89 %; a flat 50 % per token would never
# draft it. Where the target hesitates, short matches continue a coincidence more often.
LOOKUP_CLASSES = (
    (0, (0.5, 0.85), (0.45, 0.7)),
    (3, (0.85, 0.78), (0.65, 0.68)),
    (6, (0.85, 0.8), (0.75, 0.8)),
    (9, (0.9, 0.93), (0.9, 0.93)),
)
# A short match that lies on the diagonal of the last accepted copy (where the reply's position minus
# the copied text's position is the same, give or take RESUME_SHIFT tokens) resumes that copy after a
# small edit: a reply that rewrites its input picks the copy up again with a 2-token match. In the
# benchmark's replies such matches were right 3 times in 4; other 2-token matches 2 times in 5.
RESUME = len(LOOKUP_CLASSES)  # the class of a short match that resumes the last copy
RESUME_PRIOR = (0.75, 0.85)
RESUME_SHIFT = 2  # tokens the edit may have inserted or deleted
RESUME_BELOW = LOOKUP_CLASSES[2][0]  # matches this long are judged as copies in their own right
RELAX = 0.995  # per round: evidence by class fades toward the prior (re-tries a class in time)
RELAX_EVERY = 8  # rounds between two fadings (by RELAX to that power)

# The draft model: (lowest target confidence, prior acceptance per token) of each class of stretch. The
# target's confidence is the smallest top-token probability it gave the last few tokens; where it was
# sure of each, the draft model nearly always agrees (JSON, copied values, boilerplate), where it
# hesitated the draft often picks another word. Measured on Qwen2.5-Coder 1.5B + 0.5B: first draft token
# accepted 74 % below 0.5, 84-88 % from 0.5 to 0.95, 92 % from 0.95 and 99 % from 0.99.
MODEL_CLASSES = ((0.0, 0.75), (0.9, 0.88), (0.99, 0.97))
CONFIDENCE_WINDOW = 3  # target tokens the class looks back over
# Below the lowest class threshold how sure the target was does not matter: the loop may report an
# upper bound from its two largest logits instead (no pass of exp over the vocabulary). In chat
# replies on an AMD EPYC half the target's tokens were below it, and took 65-75 us instead of 185
# (right after a decode Python runs on cold caches: the weights streamed through them).
CONFIDENCE_FLOOR = min(c for c, _ in MODEL_CLASSES if c > 0)
# A batch size whose cost rests on fewer than EXPLORE_SAMPLES timings (one at load, or none:
# interpolated) is planned EXPLORE cheaper, so a size that one slow timing made look dear is tried
# and measured when it is nearly the best choice. Without it a batch of 4 timed slow once at load
# could stay dear for good: traced, every lookup draft of a reply went to 4 tokens (a batch of 5,
# 2.2 decode steps here) instead of 3 (a batch of 4, 1.7).
EXPLORE = 0.1
EXPLORE_SAMPLES = 3
# Prompt lookup in a reply: positions not yet drafted follow the deepest one drafted this many times
# (see ReplyAcceptance). Its copies run 8-15 tokens, and auto drafted 3 at a time: code_edit went
# from 1.275x to 1.349x replayed (same replies and costs), from 1.25x to 1.39x measured (medians of
# three and five benchmark runs); structured moved 1.305x -> 1.292x replayed.
BORROW_TRIALS = 2
PROBE_HOPE = 0.5  # a probe hopes for its class's acceptance this far on the way to 1
# A probe drafts this many tokens at most. Its own round is charged what it is expected to lose at
# the acceptance its class has shown: traced over the 16 benchmark prompts, probes at a reply's
# first token (the draft stopping after one unsure token) took 143-193 ms for one token against
# 83-99 ms for a plain step; in a 26-token reply one such probe costs 3 % of its speed. Measured in
# an A/B on the real pair (three runs) the rule made no difference that noise let through (0.996x,
# standard error 0.009); replayed in six orders (``bench.replay``, no noise) it took translate from
# 0.953x to 0.987x of plain decoding, code_edit 1.487x -> 1.503x, math 1.123x -> 1.108x, all
# 1.176x -> 1.178x.
PROBE_K = 2
# Prompt lookup drafts cost nothing to make, so their length is bounded by what verifying them costs
# rather than by n_max: on a CPU a batch of 16 can cost less per token than a batch of 4 (the kernels
# change with the batch size), which pays in a long copy the target keeps accepting.
LOOKUP_MAX = 15
# The first draft of a class of match in a reply (and of the target's sureness) copies at most
# FIRST_LOOKUP tokens; once this reply has tried the class, its evidence sizes the drafts. A class's
# pooled estimate comes from other replies: a 10-token match in a code reply looks like one in a
# code edit, where copies run on, and a long draft that fails at its first token costs a whole batch
# for one token (5.8 decode steps for a batch of 16 on an AMD EPYC, against 3.0 on the Xeon).
# Replayed in six orders (``bench.replay``): with the EPYC's costs 1.003x -> 1.011x over all,
# ``code`` 0.979x -> 0.994x, ``math`` 0.982x -> 1.000x, ``summarize`` 1.249x -> 1.198x (one copy
# started with 3 tokens instead of 15); with the Xeon's 1.1646x -> 1.1671x.
FIRST_LOOKUP = 3
# A reply of records (JSON objects, table rows, repeated code) copies its earlier records up to the
# values that change, and the copy of a record breaks where that record itself broke from an earlier
# copy. A lookup token copied from such a break is judged at the rate copies held there in this reply
# (BREAK_PRIOR, as if seen BREAK_WEIGHT times, until the reply has its own evidence), not at its
# class's. Replayed (same replies and costs): structured 1.292x -> 1.378x (drafting 8 tokens at
# every match: 1.344x); every other category unchanged; all 1.102x -> 1.106x. Measured (medians of
# five runs): structured 1.28x against fixed lookup's 1.26x (session 7: 1.38x against 1.46x).
BREAK_PRIOR = 0.2
BREAK_WEIGHT = 2.0
HORIZON = 256  # tokens of a reply counted on when spreading a catch-up of the draft
# A catch-up serves the model rounds that follow it until the draft falls behind again (a lookup or
# plain round between). Once a reply has SERVED_RUNS such runs of model rounds behind it, a catch-up
# is spread over no more rounds than the median of its last SERVED_RUNS.
SERVED_RUNS = 2
TOKENS_PER_ROUND = 3.0  # about what a drafted round delivers, for counting rounds left
# How much of a reply is left is unknown: a 26-token translation and a 600-token essay look alike at
# their start. Auto mode expects the rest of a reply to be as long as the reply so far (a reply n
# tokens long is as likely to be past its middle as not), at least REPLY_MIN tokens and at most the
# token budget. A catch-up of the draft, or a probe, is worth it only if that rest pays it back.
# Counting the whole budget as the rest, a 26-token translation paid for catch-ups and probes it
# ended before recovering (0.94x of plain decoding over five runs, 0.98-1.05x where it drafted
# nothing), and a long chat reply under a budget of thousands of tokens would probe at any lag.
REPLY_MIN = 16


def _also(reason: str, declined: str) -> str:
    return f"{reason}; {declined}" if declined else reason


def lookup_class(match: int) -> int:
    return max(i for i, (m, _, _) in enumerate(LOOKUP_CLASSES) if match >= m)


def model_class(target_confidence: Sequence[float]) -> int:
    """The model class of a stretch whose last tokens the target gave these top probabilities."""
    if not target_confidence:
        return 0
    low = min(target_confidence)
    return max(i for i, (c, _) in enumerate(MODEL_CLASSES) if low >= c)


class CostModel(Protocol):
    """Seconds a round's parts cost (measured, or synthetic in tests)."""

    def verify(self, batch: int) -> float | None:
        """The target's seconds to evaluate a batch of ``batch`` tokens (None: not known yet)."""
        ...

    def draft_step(self) -> float | None:
        """The draft model's seconds per drafted token (None: not known yet)."""
        ...

    def observe_verify(self, batch: int, seconds: float) -> None: ...

    def observe_draft(self, n_tokens: int, seconds: float) -> None: ...


class _Window:
    """Recent samples; their median resists the spikes a busy machine puts into timings."""

    __slots__ = ("_median", "samples")

    def __init__(self, size: int):
        self.samples: deque[float] = deque(maxlen=size)
        self._median: float | None = None

    def add(self, x: float) -> None:
        self.samples.append(x)
        self._median = None

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def value(self) -> float:
        if self._median is None:  # read every round, changed by few: computed once per change
            self._median = statistics.median(self.samples)
        return self._median


class MeasuredCosts:
    """Online estimates of the target's verify cost by batch size and the draft's cost per token.

    A shared machine speeds up and slows down; the cost of a batch *relative to one decode step*
    measured at about the same time depends mostly on the model and the hardware, and moves much
    less (every drafted round updates it). So
    one decode step's cost is tracked as the median of recent plain rounds, every other batch size
    (and the draft's step) as the median of its recent ratios to it, and an estimate is the two
    multiplied. Unmeasured batch sizes are interpolated between the nearest measured ones; past the
    largest, its mean slope from one token continues (with only one size measured, a prior slope:
    the relative cost of each extra batch token, CPU-like by default).
    """

    def __init__(self, *, prior_slope: float = 0.35, window: int = 15):
        self.prior_slope = prior_slope
        self.window = window
        self._step = _Window(window)  # seconds for a batch of 1
        self._ratio: dict[int, _Window] = {}  # batch size -> its cost / one step's
        self._draft = _Window(window)  # the draft's seconds per token / one target step's
        self._pending: list[tuple[int, float]] = []  # samples taken before any step was timed
        self._cache: dict[int, float | None] = {}
        self._known: dict[int, float] | None = None  # batch size -> median ratio, until a change

    def observe_verify(self, batch: int, seconds: float) -> None:
        self._cache.clear()
        self._known = None
        if batch <= 1:
            self._step.add(seconds)
            pending, self._pending = self._pending, []
            for b, t in pending:
                self._add_relative(b, t)
        else:
            self._add_relative(batch, seconds)

    def _add_relative(self, batch: int, seconds: float) -> None:
        if not self._step.n:
            self._pending.append((batch, seconds))
            return
        step = self._step.value
        if batch == 0:
            self._draft.add(seconds / step)
        else:
            self._ratio.setdefault(batch, _Window(self.window)).add(seconds / step)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            self._cache.clear()
            self._add_relative(0, seconds / n_tokens)  # batch 0: the draft's step

    def ratio(self, batch: int) -> float:
        """A batch's cost relative to one decode step (1.0 for a batch of 1)."""
        if batch <= 1:
            return 1.0
        if self._known is None:
            self._known = {b: w.value for b, w in self._ratio.items() if w.n}
        known = self._known
        if batch in known:
            return known[batch]
        below = max((b for b in known if b < batch), default=1)
        above = min((b for b in known if b > batch), default=None)
        r_below = known.get(below, 1.0)
        if above is not None:
            return r_below + (known[above] - r_below) * (batch - below) / (above - below)
        slope = (r_below - 1.0) / (below - 1) if below > 1 else self.prior_slope
        return r_below + max(slope, 0.0) * (batch - below)

    def verify(self, batch: int) -> float | None:
        if not self._step.n:
            return None
        if batch not in self._cache:
            self._cache[batch] = self._step.value * self.ratio(batch)
        return self._cache[batch]

    def draft_step(self) -> float | None:
        if not self._draft.n or not self._step.n:
            return None
        return self._draft.value * self._step.value

    def samples(self, batch: int) -> int:
        """How many timings the estimate for a batch of ``batch`` rests on (0: interpolated)."""
        if batch <= 1:
            return self._step.n
        w = self._ratio.get(batch)
        return w.n if w is not None else 0


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

    def observe(self, n_drafted: int, n_accepted: int, confidence: Sequence[float]) -> None:
        if n_drafted == 0:
            return
        self._overall = None
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

    def relax(self, factor: float) -> None:
        """Fade the evidence toward the prior, so a pessimistic estimate is tried again in time."""
        for a in (self.hits, self.trials, self.bin_hits, self.bin_trials):
            a *= factor
        self._overall = None

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
        base = self._base(i)
        if i >= len(self.hits):
            return base
        return float((self.hits[i] + base * self.weight) / (self.trials[i] + self.weight))

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

    def check(self, tokens: Sequence[int]) -> None:
        """Compare the last copy offered with the text that followed it (call before each lookup)."""
        offered, self._offered = self._offered, None
        if offered is None or len(tokens) < offered[0]:
            return
        start, origin, match, copy = offered
        for i in range(min(len(copy), len(tokens) - start)):
            held = copy[i] == tokens[start + i]
            if origin + i in self.breaks:
                self.trials += 1
                self.hits += held
            if not held:
                if i or match >= RESUME_BELOW:
                    self.breaks.add(start + i)
                return

    def offer(self, tokens: Sequence[int], found: Proposal) -> frozenset[int]:
        """Remember a copy to check next round; the offsets of its tokens copied from breaks."""
        self._offered = (len(tokens), found.origin, found.match, found.tokens)
        if not self.breaks:
            return frozenset()
        return frozenset(i for i in range(len(found.tokens)) if found.origin + i in self.breaks)

    def rate(self) -> float:
        """P(a copied token from a break is right), from this reply's copies."""
        return (self.hits + BREAK_PRIOR * BREAK_WEIGHT) / (self.trials + BREAK_WEIGHT)


class _AtBreaks:
    """A lookup class's estimate, with the draft's tokens copied from breaks judged at their rate."""

    __slots__ = ("acc", "offsets", "rate")

    def __init__(self, acc: ReplyAcceptance, offsets: frozenset[int], rate: float):
        self.acc, self.offsets, self.rate = acc, offsets, rate

    def alpha(self, i: int) -> float:
        return self.rate if i in self.offsets else self.acc.alpha(i)

    def overall(self) -> float:
        return self.acc.overall()


class _Always:
    """The acceptance of a draft that is always right: a bound on what any draft can deliver."""

    def alpha(self, i: int) -> float:
        return 1.0


ALWAYS = _Always()


@dataclass(frozen=True, slots=True)
class Plan:
    k: int
    rate: float  # expected tokens per second
    plain_rate: float


def best_length(
    acc: Acceptance | ReplyAcceptance | _AtBreaks | _Always,
    costs: CostModel,
    draft_cost: float,
    limit: int,
    margin: float,
    overhead: float = 0.0,
    scale: float = 1.0,
) -> Plan:
    """The draft length in 0..limit with the highest expected tokens/s.

    ``overhead`` is a fixed cost in seconds of drafting at all this round (the draft catching up);
    ``scale`` corrects a drafted round's predicted cost by what such rounds really took.
    Drafting must beat plain decoding by ``margin`` (so a near-tie never costs speed); among draft
    lengths, the best rate wins and ties go to the shorter draft.
    """
    v1 = costs.verify(1)
    if v1 is None or v1 <= 0:
        return Plan(0, 0.0, 0.0)
    plain = 1.0 / v1
    best = Plan(0, plain, plain)
    samples = getattr(costs, "samples", None)
    expected, reach = 1.0, 1.0  # E[tokens | k] = 1 + sum_{i<k} prod_{j<=i} alpha(j), one k at a time
    for k in range(1, limit + 1):
        vk = costs.verify(k + 1)
        if vk is None:
            break
        if samples is not None and samples(k + 1) < EXPLORE_SAMPLES:
            vk *= 1.0 - EXPLORE  # a batch size timed once or never: try it when it is nearly the best
        reach *= acc.alpha(k - 1)
        expected += reach
        rate = expected / ((k * draft_cost + vk + overhead) * scale)
        if rate > best.rate and rate > plain * (1 + margin):
            best = Plan(k, rate, plain)
    return best


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the loop tells a drafter after verification."""

    source: str
    n_drafted: int
    n_accepted: int
    batch: int
    t_verify: float
    t_round: float = 0.0  # the whole round so far: drafting, verification and its Python
    # the target's top-token probability for the last tokens the round added (when the drafter asks)
    confidence: tuple[float, ...] = ()


class _Realized:
    """Tokens per second that recent rounds of one kind actually delivered (pooled, not averaged)."""

    __slots__ = ("rounds",)

    def __init__(self, size: int):
        self.rounds: deque[tuple[int, float]] = deque(maxlen=size)

    def add(self, tokens: int, seconds: float) -> None:
        if seconds > 0:
            self.rounds.append((tokens, seconds))

    @property
    def n(self) -> int:
        return len(self.rounds)

    def rate(self) -> float:
        seconds = sum(s for _, s in self.rounds)
        return sum(n for n, _ in self.rounds) / seconds if seconds else 0.0


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
        self._served = _Window(15)  # model rounds per catch-up, earlier replies
        # prompt lookup's acceptance, by how long the match its draft was copied from is
        # (and by whether the target was sure of the last tokens: index 1 if so, 0 if not)
        self.lookup_acc = [
            (
                Acceptance(self.lookup_max, prior=unsure[0], prior_rest=unsure[1], weight=3.0),
                Acceptance(self.lookup_max, prior=sure[0], prior_rest=sure[1], weight=3.0),
            )
            for _, sure, unsure in (*LOOKUP_CLASSES, (0, RESUME_PRIOR, RESUME_PRIOR))
        ]
        self._copy_diagonal: int | None = None  # context index minus copied index of the last copy
        self._breaks = CopyBreaks()  # where this reply departed from copies of itself
        # A copy prompt lookup offered and auto did not draft, followed against the text as it comes:
        # (class, sureness, diagonal, context index where it starts, the copy). What drafting it
        # would have got (at temperature 0 exactly what verifying it would have accepted) counts as
        # this reply's evidence for its class, and a copy that held is the copy an edit resumes.
        # Without it a class whose prior does not pay is never drafted, so never learned: on an AMD
        # EPYC (a batch of 3 costs 2.3-2.7 steps) a JSON reply drafted nothing past its first
        # records. Replayed in six orders with three cost tables measured there: all 1.010x ->
        # 1.021-1.026x, structured 1.000-1.101x -> 1.089-1.149x, code_edit 1.006-1.041x ->
        # 1.069-1.127x; with the Xeon's, 1.1671x -> 1.1675x.
        self._undrafted: tuple[int, int, int, int, tuple[int, ...]] | None = None
        self._lookup_round = (0, 0)  # the class and diagonal of the lookup round being verified
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
        self._sync_cost = _Window(15)
        # A model round takes longer than its parts timed alone (the two models evict each other's
        # weights from the CPU caches, the draft's Python): the median ratio of what model rounds
        # took to what the cost model predicted corrects its plans.
        self._overrun = _Window(15)
        # What rounds really delivered, by kind: the cost model predicts, this checks. A drafter whose
        # recent rounds gave fewer tokens/s than plain rounds is paused whatever the model predicts
        # (costs it does not see: logits rows, cache effects, a busy machine).
        # (prompt lookup is judged per class of match: coincidences losing must not stop copies)
        self._realized = {"none": _Realized(16)}
        self._realized.update({f"model{c}": _Realized(6) for c in range(len(MODEL_CLASSES))})
        self._realized.update({f"lookup{c}": _Realized(6) for c in range(len(self.lookup_acc))})
        self._lookup_skip = [0] * len(self.lookup_acc)
        self._lookup_every = [1] * len(self.lookup_acc)

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
        for c in range(len(self.lookup_acc)):
            self._realized[f"lookup{c}"].rounds.clear()
        self._lookup_skip = [0] * len(self.lookup_acc)
        self._lookup_every = [1] * len(self.lookup_acc)
        self._copy_diagonal = None
        self._breaks.begin()
        self._undrafted = None
        self._prompt_len = len(prompt)
        t = self.lookup.begin(prompt)
        if self.model is not None:
            # The draft evaluates the prompt now, batched with the target's prompt processing as in
            # speculative mode, while it is in play; otherwise it catches up only if it drafts again.
            t += self.model.begin(prompt, evaluate=self._model_in_play())
        return t

    def _model_in_play(self) -> bool:
        """The draft model could pay on this machine and has not been losing lately."""
        d, v1 = self.costs.draft_step(), self.costs.verify(1)
        if self.model is None or d is None or v1 is None:
            return self.model is not None
        if best_length(self._optimistic, self.costs, d, self.n_max, self.margin).k == 0:
            return False
        return not all(self._losing(f"model{c}") for c in range(len(MODEL_CLASSES)))

    def _continue_rule(self, acc: Acceptance | ReplyAcceptance, limit: int):
        """Keep drafting while a longer draft is expected to deliver more tokens per second.

        After ``n`` draft tokens whose chances of acceptance come from the draft's own confidence, the
        round is worth ``E_n / (n * draft + verify(n + 1))`` tokens per second; the draft goes on while
        some longer draft (future tokens at their measured acceptance) is expected to beat that. Verify
        costs are not convex on a CPU (a batch of 4 can cost what a batch of 3 does), so every length
        up to ``limit`` is compared, not just the next one.
        """
        costs = self.costs
        calibration = self.acc["model"]
        d = costs.draft_step() or 0.0

        def keep_going(j: int, confidences: Sequence[float]) -> bool:
            n = j + 1  # tokens drafted so far
            v = [costs.verify(b) for b in range(n + 1, limit + 2)]
            if any(x is None for x in v):
                return True
            reach, expected = 1.0, 1.0
            for c in confidences:
                reach *= calibration.calibrated(c)
                expected += reach
            now = expected / (n * d + v[0])  # type: ignore[operator]
            for m in range(n + 1, limit + 1):
                reach *= acc.alpha(m - 1)
                expected += reach
                if expected / (m * d + v[m - n]) > now:  # type: ignore[operator]
                    return True
            return False

        return keep_going

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        self._rest = min(k + 1, max(len(tokens) - self._prompt_len, REPLY_MIN))
        limit = min(k, self.n_max)
        self._probing = False
        if k <= 0:
            return Proposal((), (), (), "none", 0.0, reason="no room to draft", planned=0)
        self._since_plain += 1
        if self._since_plain > self.refresh_plain:  # keep the plain-decoding baseline current
            return Proposal((), (), (), "none", 0.0, reason="measuring plain decoding", planned=0)
        t0 = time.perf_counter()
        self._rounds += 1
        if self._rounds % RELAX_EVERY == 0:  # in steps of a few rounds: it touches every class's arrays
            for acc in (*(a for pair in self.lookup_acc for a in pair), *self.model_acc):
                acc.relax(RELAX**RELAX_EVERY)
        self._sure = int(model_class(self._target_conf) == len(MODEL_CLASSES) - 1)
        self._breaks.check(tokens)
        if self._undrafted is not None:
            self._follow_undrafted(tokens)
        found = self.lookup.propose(tokens, min(k, self.lookup_max), params, rng)
        declined = ""  # a match prompt lookup found and auto did not draft, named in the reason
        if found.tokens:
            diagonal = len(tokens) - found.origin
            c = self._lookup_class(found.match, diagonal)
            self._lookup_round = (c, diagonal)
            acc = self._estimate("lookup", c)
            at_breaks = self._breaks.offer(tokens, found)
            view = _AtBreaks(acc, at_breaks, self._breaks.rate()) if at_breaks else acc
            room = len(found.tokens) if acc.trials[0] else min(len(found.tokens), FIRST_LOOKUP)
            plan = best_length(view, self.costs, 0.0, room, self.margin)
            losing = plan.k > 0 and self._losing(f"lookup{c}")
            if losing:  # try again only now and then, with back-off
                self._lookup_skip[c] += 1
                if self._lookup_skip[c] < self._lookup_every[c]:
                    plan = Plan(0, plan.rate, plan.plain_rate)
                else:
                    self._lookup_skip[c] = 0
                    self._lookup_every[c] = min(64, self._lookup_every[c] * 2)
            elif plan.k > 0:
                self._lookup_every[c] = 1
            if plan.k == 0:
                declined = (
                    f"prompt lookup: a {found.match}-token match, "
                    f"{'losing lately' if losing else 'too likely to break to pay'}"
                )
                if self._undrafted is None:
                    self._undrafted = (c, self._sure, diagonal, len(tokens), found.tokens)
            if plan.k > 0:
                n = plan.k
                if self._undrafted is not None:
                    self._follow_undrafted(tokens, end=True)
                self._copy_share = 0.9 * self._copy_share + 0.1
                return replace(
                    found,
                    tokens=found.tokens[:n],
                    q=found.q[:n],
                    confidence=found.confidence[:n],
                    planned=n,
                    reason=f"prompt lookup: {found.match}-token match"
                    f"{', resuming the copy' if c == RESUME else ''}"
                    f"{f', copy broke at token {min(at_breaks) + 1} before' if at_breaks else ''}, "
                    f"{plan.rate / plan.plain_rate:.2f}x expected",
                    t=time.perf_counter() - t0,
                )
        if self.model is None:
            reason = declined or "no n-gram match"
            return Proposal((), (), (), "none", time.perf_counter() - t0, reason=reason, planned=0)
        d = self.costs.draft_step()
        self._since_model += 1
        self._copy_share *= 0.9
        c = self._model_class = model_class(self._target_conf)
        self._amortized = 1.0  # until this round's catch-up is planned (none while measuring)
        self._class_share = [0.9 * x + 0.1 * (i == c) for i, x in enumerate(self._class_share)]
        acc = self._estimate("model", c)
        if d is None or self.costs.verify(2) is None:
            plan = Plan(min(2, limit), 0.0, 0.0) if self.costs.verify(1) is not None else Plan(0, 0.0, 0.0)
            reason = "measuring the draft model" if plan.k else "measuring plain decoding"
        elif self._model_cannot_pay(d, limit):
            reason = _also(PAUSED, declined)
            return Proposal((), (), (), "none", time.perf_counter() - t0, reason=reason, planned=0)
        else:
            plan = best_length(
                acc, self.costs, d, limit, self.margin, self._catch_up(tokens, d), self._model_overrun()
            )
            sure = min(self._target_conf, default=0.0)
            how_sure = f"{sure:.0%}" if sure >= CONFIDENCE_FLOOR else f"under {CONFIDENCE_FLOOR:.0%}"
            reason = (
                f"draft model: target {how_sure} sure, {acc.overall():.0%} acceptance, "
                f"{plan.rate / plan.plain_rate:.2f}x expected"
            )
            if plan.k > 0 and self._losing(f"model{c}"):
                plan = Plan(0, plan.rate, plan.plain_rate)
            if plan.k == 0:
                if not self._probe_due(tokens, d, limit):
                    reason = _also(PAUSED, declined)
                    return Proposal((), (), (), "none", time.perf_counter() - t0, reason=reason, planned=0)
                plan = Plan(min(PROBE_K, limit), 0.0, plan.plain_rate)
                reason = "probing: re-measuring whether drafting pays"
                self._probing = True
        if plan.k == 0:
            reason = _also(reason, declined)
            return Proposal((), (), (), "none", time.perf_counter() - t0, reason=reason, planned=0)
        self._since_model = 0
        # a probe stays short; a real round drafts on while the draft's confidence says it pays
        room = plan.k if self._probing else limit
        prop = self.model.propose(tokens, room, params, rng, keep_going=self._continue_rule(acc, room))
        return replace(prop, planned=plan.k, reason=reason, t=time.perf_counter() - t0)

    def _follow_undrafted(self, tokens: Sequence[int], end: bool = False) -> None:
        """Check the undrafted copy against the text that followed it; once it broke or ran out (or
        at ``end``: this round drafts), count what drafting it would have got as evidence."""
        c, sure, diagonal, start, copy = self._undrafted  # type: ignore[misc]
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
        self._estimate("lookup", c, sure).observe(drafted, held)
        if held:
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

    def _estimate(self, source: str, c: int, sure: int | None = None) -> ReplyAcceptance:
        """Acceptance in this reply for a class of ``source`` ("lookup": also by the target's sureness,
        this round's unless ``sure`` is given)."""
        sure = (self._sure if sure is None else sure) if source == "lookup" else 0
        key = (source, c, sure)
        est = self._reply.get(key)
        if est is None:
            pooled = self.lookup_acc[c][sure] if source == "lookup" else self.model_acc[c]
            est = self._reply[key] = ReplyAcceptance(pooled, copies=source == "lookup")
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
        own catch-up: replayed (``bench.replay``, six orders), charging it so made ``code_edit``
        1.400x -> 1.487x and all 1.162x -> 1.176x.
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
        kind = proposal.source if proposal.tokens else "none"
        if kind == "lookup":
            kind = f"lookup{self._lookup_round[0]}"
        elif kind == "model":
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
        if proposal.source == "model" and proposal.n_steps:
            self.costs.observe_draft(proposal.n_steps, proposal.t_steps)
        if proposal.source == "model" and proposal.n_sync > 2:
            self._sync_cost.add(proposal.t_sync / proposal.n_sync)
        if proposal.source == "model" and proposal.tokens:
            if proposal.n_sync > 2 or not self._runs:
                self._runs.append(1)  # a catch-up: a new run of model rounds
            else:
                self._runs[-1] += 1
        if proposal.source == "lookup":
            c, diagonal = self._lookup_round
            if outcome.n_accepted:
                self._copy_diagonal = diagonal
            self.lookup_acc[c][self._sure].observe(outcome.n_drafted, outcome.n_accepted, proposal.confidence)
            self._estimate("lookup", c).observe(outcome.n_drafted, outcome.n_accepted)
        elif proposal.source == "model":
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
