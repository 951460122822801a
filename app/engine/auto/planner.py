"""The planner: the draft length with the highest expected tokens per second, and when a draft in
progress should go on. Pure functions of acceptance estimates and costs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.engine.auto.costs import CostModel
from app.engine.auto.priors import EXPLORE, EXPLORE_SAMPLES


class Estimate(Protocol):
    """Acceptance of each draft position given the ones before it were accepted."""

    def alpha(self, i: int) -> float: ...


@dataclass(frozen=True, slots=True)
class Plan:
    k: int
    rate: float  # expected tokens per second
    plain_rate: float


def best_length(
    acc: Estimate,
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
    best_k, best_rate = 0, plain
    verify, alpha, samples = costs.verify, acc.alpha, getattr(costs, "samples", None)
    expected, reach = 1.0, 1.0  # E[tokens | k] = 1 + sum_{i<k} prod_{j<=i} alpha(j), one k at a time
    for k in range(1, limit + 1):
        vk = verify(k + 1)
        if vk is None:
            break
        if samples is not None and samples(k + 1) < EXPLORE_SAMPLES:
            vk *= 1.0 - EXPLORE  # a batch size timed once or never: try it when it is nearly the best
        reach *= alpha(k - 1)
        expected += reach
        rate = expected / ((k * draft_cost + vk + overhead) * scale)
        if rate > best_rate and rate > plain * (1 + margin):
            best_k, best_rate = k, rate
    return Plan(best_k, best_rate, plain)


def best_extension(
    reach: float, expected: float, spent: float, k: int, acc: Estimate, costs: CostModel, room: int
) -> int:
    """How many copied tokens to verify after a draft of ``k`` tokens that is all accepted with
    probability ``reach`` and delivers ``expected`` tokens, for ``spent`` seconds of drafting: the
    number with the highest expected tokens per second (0: the draft alone)."""
    v = costs.verify(k + 1)
    if v is None:
        return 0
    best, best_rate = 0, expected / (spent + v)
    for m in range(1, room + 1):
        vm = costs.verify(k + m + 1)
        if vm is None:
            break
        reach *= acc.alpha(m - 1)
        expected += reach
        if expected / (spent + vm) > best_rate:
            best, best_rate = m, expected / (spent + vm)
    return best


class Calibration(Protocol):
    def calibrated(self, confidence: float) -> float: ...


def continue_rule(
    costs: CostModel, calibration: Calibration, acc: Estimate, draft_cost: float, limit: int
) -> Callable[[int, Sequence[float]], bool]:
    """Keep drafting while a longer draft is expected to deliver more tokens per second.

    After ``n`` draft tokens whose chances of acceptance come from the draft's own confidence
    (``calibration``), the round is worth ``E_n / (n * draft + verify(n + 1))`` tokens per second; the
    draft goes on while some longer draft (future tokens at their estimated acceptance ``acc``) is
    expected to beat that. Verify costs are not convex on a CPU (a batch of 4 can cost what a batch of
    3 does), so every length up to ``limit`` is compared, not just the next one.
    """
    d = draft_cost

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


def memo_plan(costs: CostModel, key: tuple[Any, ...], plan: Callable[[], Plan]) -> Plan:
    """``plan()``, kept with ``costs`` where they keep plans (see :class:`~.costs.Optimistic`)."""
    memo = getattr(costs, "memo", None)
    if memo is None:
        return plan()
    found = memo.get(key)
    if found is None:
        found = memo[key] = plan()
    return found
