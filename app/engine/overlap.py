"""Queuing the next token's evaluation before the round is planned, where the target runs on a GPU.

A GPU backend queues a batch and returns; the CPU is free until the logits are read. In a round that
drafts nothing the batch is the pending token alone, known as soon as the round before it has been
verified. Queued then, before the next round is planned, its evaluation hides what the CPU does between
two batches (auto mode's planning, prompt lookup and the history's index, the reply's text, the event
sent to the client) behind the GPU's step. Where the round drafts after all, the queued step is wasted:
the token is removed and evaluated again at the head of the draft's batch, as in any round.

So the loop queues where it is expected to pay, on measured figures: the CPU time between two batches
it would hide (``gap``, rounds without a draft), the step a wasted evaluation costs (``step``, a plain
round's), and how often a round drafts after one like the last (``p``, counted over recent rounds,
apart after a round that drafted and one that did not):

    queue  <=>  (1 - p) * gap > p * step

Plain decoding queues every token; a drafter that drafts every round never does; auto mode with a
draft that does not pay queues once its rounds stop drafting. On a CPU evaluation is not queued (the
call returns when it is done), so the loop is not asked.
"""

from __future__ import annotations

from collections import deque

from app.engine.auto.costs import Window

RECENT = 32  # rounds each drafting frequency is counted over


class Overlap:
    """Whether to queue the pending token before the next round is planned (one per mode and engine)."""

    def __init__(self, *, always: bool = False):
        self.always = always  # queue whenever the reply goes on (tests: the mechanics on a CPU)
        self.gap = Window(15)  # seconds of CPU work between a round's logits reads and the next batch
        self.step = Window(15)  # seconds of a plain round's evaluation
        # whether each recent round drafted, after a round that did not [0] and one that did [1]
        self.drafted: tuple[deque[bool], deque[bool]] = (deque(maxlen=RECENT), deque(maxlen=RECENT))
        self.queued = 0  # evaluations queued before their round was planned
        self.wasted = 0  # of them, those whose round drafted after all

    def drafting_odds(self, after_draft: bool) -> float:
        """How likely the round after one that drafted (or not) drafts: Laplace's rule over the last
        rounds of that kind (a half before any)."""
        seen = self.drafted[after_draft]
        return (sum(seen) + 1) / (len(seen) + 2)

    def should_queue(self, drafted: bool, drafts: bool) -> bool:
        """Queue the next pending token now, after a round that ``drafted`` (or not); ``drafts``:
        whether the loop has a drafter at all (without one every round is plain)."""
        if self.always or not drafts:
            return True
        if not self.gap.n or not self.step.n:
            return False
        p = self.drafting_odds(drafted)
        return (1.0 - p) * self.gap.value > p * self.step.value

    def observe(self, after_draft: bool | None, drafted: bool) -> None:
        """A round drafted (or not) after one that did (``after_draft``; None: the reply's first)."""
        if after_draft is not None:
            self.drafted[after_draft].append(drafted)
