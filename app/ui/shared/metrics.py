"""Live figures of a reply, computed from the engine's Step events (no Qt).

Speedup is an *estimate*: the engine reports each round's time but not what plain decoding would have
cost, so the cost of one plain step is taken as the median ``t_round`` of rounds that drafted nothing and
made one token (this pair, this machine: auto mode's plain rounds, plain replies, or the short plain
calibration run after loading). A plain round's whole time is used, not only its ``t_verify``, so the
per-round overhead both modes pay is on both sides. The speedup is ``tokens / sum(t_round) * plain_step``.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.engine import Action, Decision, Finished, FinishReason, Source, Started, Step
from app.ui.shared.saved import SavedReply

RATE_WINDOW = 8  # rounds in the moving window of the tokens/s plot
ROLLING_REPLIES = 10


def draft_share(step: Step) -> int:
    """Characters of ``step.text`` attributed to accepted draft tokens.

    The engine reports tokens, not each token's text, so the text is split in proportion to token
    counts: the accepted draft tokens come first in a round, so their share is a prefix of its text.
    """
    n = len(step.tokens)
    accepted = sum(step.from_draft)
    if not n or not accepted or not step.text:
        return 0
    return min(len(step.text), round(len(step.text) * accepted / n))


@dataclass
class PlainCost:
    """Median seconds of a plain decoding step (rounds with nothing drafted), over recent rounds."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    def observe(self, steps: Iterable[Step]) -> None:
        for s in steps:
            plain = s.n_drafted == 0 and s.decision.action is not Action.PROMPT  # a round of its own
            if plain and len(s.tokens) == 1 and s.t_round > 0:
                self.samples.append(s.t_round)

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if len(self.samples) >= 3 else None


@dataclass
class ReplyMeter:
    """Figures of the reply being generated, updated step by step."""

    t_sent: float = 0.0  # perf_counter() when the request was sent
    ttft: float | None = None  # seconds from sending to the first visible text
    n_prompt: int = 0
    n_prompt_cached: int = 0
    t_prompt: float = 0.0
    n_tokens: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    rounds: int = 0
    rounds_drafted: int = 0
    n_first: int = 0  # tokens read with the prompt's batch, before the first round
    t_decode: float = 0.0  # sum of t_round
    rates: list[tuple[float, float]] = field(default_factory=list)  # (decode time, tokens/s) plot
    last: Decision | None = None  # the last round's decision
    drafted: Decision | None = None  # the decision of the last round that drafted
    draft_spans: list[tuple[int, int]] = field(default_factory=list)  # character ranges of draft text
    n_chars: int = 0
    finished: Finished | None = None
    _window: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    def started(self, ev: Started) -> None:
        self.n_prompt, self.n_prompt_cached, self.t_prompt = (
            ev.n_prompt_tokens,
            ev.n_prompt_cached,
            ev.t_prompt,
        )

    def add(self, step: Step, now: float) -> None:
        if self.ttft is None and step.text:
            self.ttft = now - self.t_sent
        share = draft_share(step)
        if share:
            if self.draft_spans and self.draft_spans[-1][1] == self.n_chars:
                self.draft_spans[-1] = (self.draft_spans[-1][0], self.n_chars + share)
            else:
                self.draft_spans.append((self.n_chars, self.n_chars + share))
        self.n_chars += len(step.text)
        self.n_tokens += len(step.tokens)
        if step.decision.action is Action.PROMPT:  # the first token, read with the prompt: no round
            self.n_first += len(step.tokens)
            self.t_decode += step.t_round
            return
        self.n_drafted += step.n_drafted
        self.n_accepted += step.n_accepted
        self.rounds += 1
        self.rounds_drafted += step.n_drafted > 0
        self.t_decode += step.t_round
        if not step.tokens:  # a remote server's text: its counts come with Finished
            return
        self._window.append((len(step.tokens), step.t_round))
        t = sum(dt for _, dt in self._window)
        if t > 0 and len(self._window) >= min(RATE_WINDOW, 4):  # a single round's rate is mostly noise
            self.rates.append((self.t_decode, sum(k for k, _ in self._window) / t))
        self.last = step.decision
        if step.n_drafted:
            self.drafted = step.decision

    def finish(self, fin: Finished) -> None:
        self.finished = fin
        s = fin.stats
        if not self.n_tokens and s.n_generated:  # a remote server's reply: its steps carried text only
            self.n_tokens, self.n_drafted, self.n_accepted = s.n_generated, s.n_drafted, s.n_accepted
            self.rounds_drafted = s.rounds_drafted

    # -- figures ------------------------------------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def tokens_per_second(self) -> float | None:
        if self.finished is not None and self.finished.stats.decode_tokens_per_second:
            return self.finished.stats.decode_tokens_per_second
        return self.n_tokens / self.t_decode if self.t_decode > 0 else None

    @property
    def mean_accepted(self) -> float | None:
        """Accepted draft tokens per round that drafted."""
        return self.n_accepted / self.rounds_drafted if self.rounds_drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        return (self.n_tokens - self.n_first) / self.rounds if self.rounds else None

    def speedup(self, plain_step: float | None) -> float | None:
        """Estimated speedup over plain decoding, given the cost of one plain step."""
        if not plain_step or self.t_decode <= 0 or not self.n_tokens:
            return None
        return (self.n_tokens / self.t_decode) * plain_step

    @property
    def paused(self) -> bool:
        return self.last is not None and self.last.action is Action.PAUSED

    @property
    def draft_source(self) -> Source:
        """Where the last round that drafted got its draft (``Source.NONE``: none has)."""
        return self.drafted.source if self.drafted is not None else Source.NONE

    def saved(self, reason: FinishReason | None = None) -> SavedReply:
        """What is saved with the message (the engine's Stats plus what the UI measured); ``reason``
        instead of the finished reply's."""
        fin = self.finished
        return SavedReply(
            reason=reason or (fin.reason if fin is not None else None),
            stats=fin.stats if fin is not None else None,
            ttft_ui_s=self.ttft,
            draft_spans=tuple(self.draft_spans),
        )


@dataclass
class Rolling:
    """Acceptance over the last few replies."""

    replies: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=ROLLING_REPLIES))

    def add(self, meter: ReplyMeter) -> None:
        if meter.n_drafted:
            self.replies.append((meter.n_accepted, meter.n_drafted))

    def acceptance(self, current: ReplyMeter | None = None) -> float | None:
        acc = sum(a for a, _ in self.replies) + (current.n_accepted if current else 0)
        drafted = sum(d for _, d in self.replies) + (current.n_drafted if current else 0)
        return acc / drafted if drafted else None

    @property
    def count(self) -> int:
        return len(self.replies)
