"""What a round's parts cost, measured online: the target's verify cost by batch size, the draft's cost
per token, and what rounds of each kind actually delivered."""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Protocol

# A batch costs at least one step; one timed this many times faster than every recent step says the
# steps are stale (timing noise on a quiet machine is a few percent; another program loading beside
# this one on a 2-core CPU slows every timing 30-100x).
STALE = 2.0


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


class Window:
    """Recent samples; their median resists the spikes a busy machine puts into timings."""

    __slots__ = ("_median", "samples")

    def __init__(self, size: int):
        self.samples: deque[float] = deque(maxlen=size)
        self._median: float | None = None

    def add(self, x: float) -> None:
        self.samples.append(x)
        self._median = None

    def clear(self) -> None:
        self.samples.clear()
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
    less (every drafted round updates it). So one decode step's cost is tracked as the median of
    recent plain rounds, every other batch size (and the draft's step) as the median of its recent
    ratios to it, and an estimate is the two multiplied. A batch timed in half the time of every recent
    step says those steps were timed on a busier machine: they are dropped and the step is timed again.
    Unmeasured batch sizes are interpolated between the nearest measured ones; past the largest,
    its mean slope from one token continues (with only one size measured, a prior slope: the
    relative cost of each extra batch token, CPU-like by default).
    """

    def __init__(self, *, prior_slope: float = 0.35, window: int = 15):
        self.prior_slope = prior_slope
        self.window = window
        self._step = Window(window)  # seconds for a batch of 1
        self._ratio: dict[int, Window] = {}  # batch size -> its cost / one step's
        self._draft = Window(window)  # the draft's seconds per token / one target step's
        self._pending: list[tuple[int, float]] = []  # samples taken before any step was timed
        self._cache: dict[int, float | None] = {}
        self._known: dict[int, float] | None = None  # batch size -> median ratio, until a change
        self._ratios: dict[int, float] = {}  # batch size -> ratio (interpolated too), until a change
        self._low: Optimistic | None = None  # the optimistic reading, until a change

    def observe_verify(self, batch: int, seconds: float) -> None:
        self._cache.clear()  # a step moves every estimate in seconds; a batch's ratio, only its own
        if batch <= 1:
            self._step.add(seconds)
            if self._low is not None and self._low._step != min(self._step.samples):
                self._low = None  # (the lowest costs stand while the lowest step does)
            pending, self._pending = self._pending, []
            for b, t in pending:
                self._add_relative(b, t)
        else:
            self._low = None
            if self._step.n and seconds * STALE < min(self._step.samples):
                # A batch costs at least one step: one in half the time of every recent step says
                # they were timed on a busier machine (another program loading beside this one). The
                # step is timed again (auto mode's next round is plain); this batch is kept till then.
                self._step.clear()
            self._add_relative(batch, seconds)

    def _add_relative(self, batch: int, seconds: float) -> None:
        if not self._step.n:
            self._pending.append((batch, seconds))
            return
        step = self._step.value
        if batch == 0:
            self._draft.add(seconds / step)
        else:  # a batch costs at least one step and at most its tokens' steps one by one
            self._known = None
            self._ratios.clear()
            self._low = None
            self._ratio.setdefault(batch, Window(self.window)).add(
                min(max(seconds / step, 1.0), float(batch))
            )

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            self._cache.clear()
            self._low = None
            self._add_relative(0, seconds / n_tokens)  # batch 0: the draft's step

    def ratio(self, batch: int) -> float:
        """A batch's cost relative to one decode step (1.0 for a batch of 1)."""
        if batch <= 1:
            return 1.0
        ratio = self._ratios.get(batch)
        if ratio is None:
            ratio = self._ratios[batch] = self._interpolated(batch)
        return ratio

    def _interpolated(self, batch: int) -> float:
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

    def optimistic(self) -> Optimistic:
        """The same costs at the lowest recent timing of each (see :class:`Optimistic`)."""
        if self._low is None:
            self._low = Optimistic(self)
        return self._low

    def state(self) -> dict[str, Any]:
        """The relative costs learned, for :class:`~app.engine.auto.memory.AutoMemory`: each batch size's
        median cost in decode steps, and the draft's step in decode steps of the target."""
        return {
            "ratios": {str(b): round(w.value, 4) for b, w in sorted(self._ratio.items()) if w.n},
            "draft": round(self._draft.value, 4) if self._draft.n else None,
        }

    def restore(self, state: dict[str, Any], weight: int = 2) -> None:
        """Start from a saved :meth:`state`: each saved figure counts as ``weight`` timings, so a single
        timing at load that a busy machine slowed cannot move the median; live timings replace them as
        the window fills. Figures that are not positive numbers are skipped."""
        ratios = state.get("ratios")
        items = list(ratios.items()) if isinstance(ratios, dict) else []
        for key, value in [*items, ("0", state.get("draft"))]:
            try:
                batch, ratio = int(key), float(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
            if not 0.0 < ratio < 1e4 or batch < 0 or batch == 1:
                continue
            if batch > 1:  # a batch costs at least one step
                ratio = max(ratio, 1.0)
            window = self._draft if batch == 0 else self._ratio.setdefault(batch, Window(self.window))
            for _ in range(weight):
                window.add(ratio)
        self._cache.clear()
        self._known = None
        self._ratios.clear()
        self._low = None

    def samples(self, batch: int) -> int:
        """How many timings the estimate for a batch of ``batch`` rests on (0: interpolated)."""
        if batch <= 1:
            return self._step.n
        w = self._ratio.get(batch)
        return w.n if w is not None else 0


class DraftCosts:
    """Another drafter's view of a :class:`MeasuredCosts`: the target's verify costs are shared, the
    drafter's cost per token is its own (the MTP head's step is not the draft model's), kept the same
    way: the median of its recent ratios to one decode step."""

    def __init__(self, base: MeasuredCosts):
        self.base = base
        self._draft = Window(base.window)
        self._low: tuple[Optimistic, Optimistic] | None = None  # (the base's, this drafter's)

    def verify(self, batch: int) -> float | None:
        return self.base.verify(batch)

    def samples(self, batch: int) -> int:
        return self.base.samples(batch)

    def draft_step(self) -> float | None:
        step = self.base._step
        return self._draft.value * step.value if self._draft.n and step.n else None

    def observe_verify(self, batch: int, seconds: float) -> None:
        self.base.observe_verify(batch, seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        step = self.base._step
        if n_tokens > 0 and step.n:
            self._draft.add(seconds / n_tokens / step.value)
            self._low = None

    def optimistic(self) -> Optimistic:
        """The shared costs at their lowest recent timings, with this drafter's step at its lowest."""
        base = self.base.optimistic()
        if self._low is None or self._low[0] is not base:
            low = Optimistic(self.base)
            low.draft = self._draft
            self._low = (base, low)
        return self._low[1]

    def state(self) -> dict[str, Any]:
        return {"draft": round(self._draft.value, 4) if self._draft.n else None}

    def restore(self, state: dict[str, Any], weight: int = 2) -> None:
        try:
            ratio = float(state.get("draft"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return
        if 0.0 < ratio < 1e4:
            for _ in range(weight):
                self._draft.add(ratio)
            self._low = None


class Realized:
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

    def error(self) -> float:
        """The standard error of :meth:`rate`, from the rounds' spread about it (a ratio of sums:
        rounds that deliver 1-4 tokens, timed on a shared machine, make a few rounds' rate noisy)."""
        k = len(self.rounds)
        seconds = sum(s for _, s in self.rounds)
        if k < 2 or seconds <= 0:
            return float("inf")
        r = self.rate()
        spread = sum((n - r * s) ** 2 for n, s in self.rounds) / (k - 1)
        return (spread / k) ** 0.5 / (seconds / k)


class Optimistic:
    """A :class:`MeasuredCosts` read at each batch size's (and the draft's) lowest recent timing.

    Costs are timed only in the rounds that use them: a draft length (or the draft model) ruled out by
    timings a busy moment inflated is never run again, so never timed again. Asked whether the draft
    could pay at its lowest recent timings, auto mode probes it now and then, which times it again;
    on a quiet machine the lowest timing is about the median, and nothing changes.
    """

    def __init__(self, costs: MeasuredCosts):
        self.costs = costs
        self.draft = costs._draft  # the drafter's step ratios (another drafter's, for a DraftCosts)
        step = costs._step
        self._step = min(step.samples) if step.n else None
        self._low = {b: min(w.samples) for b, w in costs._ratio.items() if w.n}
        self._verify: dict[int, float] = {}
        # plans made on these costs (by what they assumed), kept as long as the costs are: while a
        # drafter is paused, whether it could pay at all is asked every round and changes seldom
        self.memo: dict[tuple[Any, ...], Any] = {}

    def verify(self, batch: int) -> float | None:
        if self._step is None:
            return None
        if batch <= 1:
            return self._step
        seconds = self._verify.get(batch)
        if seconds is None:
            low = self._low.get(batch)
            ratio = low if low is not None else self.costs.ratio(batch)
            seconds = self._verify[batch] = self._step * min(ratio, self.costs.ratio(batch))
        return seconds

    def draft_step(self) -> float | None:
        draft = self.draft
        return min(draft.samples) * self._step if draft.n and self._step is not None else None

    def observe_verify(self, batch: int, seconds: float) -> None:
        self.costs.observe_verify(batch, seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        self.costs.observe_draft(n_tokens, seconds)
