"""Draft-length policies: how many tokens to draft in the next round, and why."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from app.engine.events import Action, Decision, Policy


@dataclass(frozen=True, slots=True)
class Choice:
    k: int
    decision: Decision


class DraftPolicy(Protocol):
    def choose(self, limit: int) -> Choice:
        """Draft length for the next round, at most ``limit``."""
        ...

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """The outcome of the round just verified."""
        ...


class PlainPolicy:
    """Never draft: plain decoding through the same loop (the A/B baseline)."""

    def choose(self, limit: int) -> Choice:
        return Choice(0, Decision(Action.PLAIN, Policy.PLAIN))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        pass


class NoRollbackPolicy:
    """Plain decoding because the target's memory cannot undo a rejected draft."""

    def choose(self, limit: int) -> Choice:
        return Choice(0, Decision(Action.NO_ROLLBACK, Policy.PLAIN))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        pass


class PassPolicy:
    """Hand the whole room to the drafter (auto mode's drafter chooses k itself)."""

    def choose(self, limit: int) -> Choice:
        return Choice(limit, Decision(Action.DRAFT, Policy.AUTO, k=limit))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        pass


class FixedPolicy:
    """Always draft ``n_max`` tokens (the drafter may stop earlier on low confidence)."""

    def __init__(self, n_max: int):
        self.n_max = n_max

    def choose(self, limit: int) -> Choice:
        k = min(self.n_max, limit)
        action = Action.DRAFT if k else Action.NO_ROOM
        return Choice(k, Decision(action, Policy.FIXED, k=k, n_max=self.n_max, capped=k < self.n_max))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        pass


class AdaptivePolicy:
    """Draft length between ``n_min`` and ``n_max`` from the recent per-token acceptance rate.

    With a per-token acceptance rate ``a``, the i-th draft token is only verified usefully when the
    i-1 before it were accepted, which happens with probability a**(i-1). Drafting stops where that
    chance falls under ``threshold``: k = ceil(log(threshold) / log(a)). ``a`` is an exponentially
    weighted estimate over recent rounds (counting each accepted token and the first rejection).
    """

    def __init__(
        self, n_min: int, n_max: int, *, threshold: float = 0.3, decay: float = 0.8, prior: float = 0.7
    ):
        if not 0 <= n_min <= n_max:
            raise ValueError(f"need 0 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.threshold = threshold
        self.decay = decay
        self._hits = prior * 4.0
        self._trials = 4.0

    @property
    def acceptance(self) -> float:
        return self._hits / self._trials

    def choose(self, limit: int) -> Choice:
        a = min(max(self.acceptance, 0.01), 0.99)
        k = math.ceil(math.log(self.threshold) / math.log(a))
        k = max(self.n_min, min(self.n_max, k, limit))
        action = Action.DRAFT if k else Action.NO_ROOM if limit == 0 else Action.DECLINED
        return Choice(k, Decision(action, Policy.ADAPTIVE, k=k, n_max=self.n_max, recent_acceptance=a))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        self._hits = self.decay * self._hits + n_accepted
        self._trials = self.decay * self._trials + n_accepted + (1 if n_accepted < n_drafted else 0)
