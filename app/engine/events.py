"""Immutable records the generation loop yields, and the statistics summary built from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Word(str, Enum):
    """A value with a fixed set of words: compared as the enum, its text (str(), f-strings, JSON) the
    word itself, as ``enum.StrEnum`` does from Python 3.11."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Mode(Word):
    """How a reply is drafted."""

    AUTO = "auto"  # whatever pays on this machine, round by round
    SPECULATIVE = "speculative"  # the draft model
    PLAIN = "plain"  # no drafting
    LOOKUP = "lookup"  # prompt lookup: copies of earlier text
    MTP = "mtp"  # the target's own multi-token-prediction head
    REMOTE = "remote"  # a remote server's reply (its Stats only: not a mode to ask for)


class FinishReason(Word):
    """Why a reply ended."""

    EOG = "eog"  # the model ended its turn
    STOP = "stop"  # a stop string
    LENGTH = "length"  # the token budget
    CONTEXT = "context"  # the context is full
    CANCELLED = "cancelled"  # stopped by the caller
    ERROR = "error"  # it broke off (the app saves what was written with this reason)


class Source(str, Enum):
    """Where a round's draft came from."""

    NONE = "none"  # nothing was drafted
    MODEL = "model"  # the draft model
    LOOKUP = "lookup"  # prompt lookup: a copy of earlier text
    HISTORY = "history"  # a copy from the user's earlier conversations
    MTP = "mtp"  # the target's own multi-token-prediction head
    EAGLE3 = "eagle3"  # an EAGLE-3 head trained for the target
    ASSISTANT = "assistant"  # Gemma 4's assistant model, drafting from the target's cache


class Action(str, Enum):
    """What was decided for a round."""

    PLAIN = "plain"  # plain mode: no drafter
    PROMPT = "prompt"  # the reply's first token, read with the prompt's batch (no round of its own)
    DRAFT = "draft"  # draft ``k`` tokens (fixed, adaptive or auto mode)
    PROBE = "probe"  # auto: a short draft to re-measure whether drafting pays
    MEASURE = "measure"  # auto: a round that measures a cost (plain decoding, or the draft model)
    PAUSED = "paused"  # auto: verifying costs more than drafting saves on this machine
    DECLINED = "declined"  # drafting would not pay now (auto: the draft on offer is ``Decision.declined``)
    NO_MATCH = "no_match"  # nothing to draft from: prompt lookup found no match
    NO_ROOM = "no_room"  # the token budget or the context leaves no room to draft
    NO_ROLLBACK = "no_rollback"  # the target's memory cannot undo a rejected draft: plain decoding


class Policy(str, Enum):
    """How the draft length is chosen."""

    PLAIN = "plain"
    FIXED = "fixed"  # always ``n_max`` (the draft may stop early on low confidence)
    ADAPTIVE = "adaptive"  # from the recent acceptance rate
    AUTO = "auto"  # auto mode: from measured costs and acceptance, per round


@dataclass(frozen=True, slots=True)
class Declined:
    """A draft a source offered that auto mode did not use."""

    source: Source
    match: int  # prompt lookup: the length of the match the copy came from
    losing: bool  # its class of draft delivered less than plain decoding lately (else: too likely to break)


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a round drafted what it did: the choice, its source and the numbers behind it."""

    action: Action
    policy: Policy
    source: Source = Source.NONE
    k: int = 0  # draft length planned (0: plain decoding)
    n_max: int = 0  # fixed and adaptive: the longest draft allowed
    capped: bool = False  # fixed: ``k`` was cut short by the token budget or the context
    recent_acceptance: float | None = None  # adaptive: the per-token acceptance it followed
    match: int = 0  # prompt lookup: tokens of the context's end that matched where the copy came from
    # draft model: tokens copied where its draft ends (prompt lookup going on after it, after a
    # ``match``-token match)
    copied: int = 0
    resumes_copy: bool = False  # prompt lookup: the match resumes the last copy after a small edit
    copy_broke_at: int = 0  # prompt lookup: an earlier copy of this text broke at this token (1-based)
    # draft model: the least sure the target was of its last few tokens; None when under ``sure_floor``
    target_sure: float | None = None
    sure_floor: float = 0.0
    acceptance: float | None = None  # draft model: the acceptance per token auto mode expects
    expected_speedup: float | None = None  # over plain decoding, as planned
    measured_speedup: float | None = None  # what recent rounds of this kind delivered over plain ones
    declined: Declined | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """The prompt has been evaluated; generation begins."""

    n_prompt_tokens: int
    n_prompt_cached: int  # prompt tokens whose KV was reused from the previous request
    t_prompt: float  # seconds spent evaluating the rest of the prompt (target and draft)


@dataclass(frozen=True, slots=True)
class Step:
    """One speculative round: what was drafted, what the target accepted, and what it cost."""

    text: str  # new text that is safe to show (complete UTF-8, stop strings held back)
    tokens: tuple[int, ...]  # tokens this round added to the reply
    from_draft: tuple[bool, ...]  # per token: True if it was a drafted token the target accepted
    n_drafted: int
    n_accepted: int
    k: int  # draft length the policy chose for this round (0 = plain decoding)
    drafter: Source
    decision: Decision  # why the round drafted what it did
    t_draft: float  # seconds drafting
    t_verify: float  # seconds in the target's batched evaluation
    t_round: float  # seconds for the whole round
    t_llama: float  # seconds inside llama_decode (both models) this round
    # time.monotonic() when the round began, after its cancel check: a system-wide clock, so a
    # client in another process can tell which rounds began after it cancelled
    began: float = 0.0


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of one reply. Rates are per second; times in seconds."""

    mode: Mode
    n_prompt_tokens: int
    n_prompt_cached: int
    n_generated: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float
    rounds: int
    rounds_drafted: int
    mean_accepted_length: float  # accepted draft tokens per round that drafted
    tokens_per_round: float
    accepted_length_histogram: tuple[int, ...]  # rounds that accepted 0, 1, 2, ... draft tokens
    acceptance_by_position: tuple[float, ...]  # P(accept) of the i-th draft token, when it was drafted
    t_prompt_s: float
    t_decode_s: float
    t_draft_s: float
    t_verify_s: float
    t_llama_s: float
    ttft_s: float
    prompt_tokens_per_second: float
    decode_tokens_per_second: float
    python_share: float  # share of decode wall time not spent inside llama_decode
    # why a reply asked to draft decoded plainly throughout (Action.NO_ROLLBACK), else None
    drafting_off: Action | None = None
    # per source that drafted: (source, rounds, tokens drafted, tokens accepted), in order of first use
    # (a copy appended where a model's draft ends is prompt lookup's: that round counts for both)
    drafted_by: tuple[tuple[Source, int, int, int], ...] = ()
    # rounds whose evaluation was queued before they were planned (a GPU: app.engine.overlap), and of
    # them those that drafted after all (the queued step wasted)
    n_queued: int = 0
    n_wasted: int = 0
    # of t_prompt_s, the drafter's own work on the prompt (a draft model evaluating it, prompt
    # lookup's index): what drafting adds to the time to the first token
    t_draft_prompt_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Finished:
    """The reply is complete, and why."""

    reason: FinishReason
    text: str
    tokens: tuple[int, ...]
    stats: Stats


@dataclass
class StatsBuilder:
    """Accumulates rounds into a :class:`Stats` (mutable on purpose; the result is frozen)."""

    mode: Mode
    n_prompt_tokens: int = 0
    n_prompt_cached: int = 0
    t_prompt: float = 0.0
    t_draft_prompt: float = 0.0
    ttft: float = 0.0
    steps: list[Step] = field(default_factory=list)
    n_queued: int = 0
    n_wasted: int = 0

    def add(self, step: Step) -> None:
        self.steps.append(step)

    def build(self, t_decode: float, n_generated: int | None = None) -> Stats:
        steps = self.steps
        n_gen = sum(len(s.tokens) for s in steps) if n_generated is None else n_generated
        # the rounds: not a first token read with the prompt's batch (Action.PROMPT)
        rounds = [s for s in steps if s.decision.action is not Action.PROMPT]
        n_first = sum(len(s.tokens) for s in steps if s.decision.action is Action.PROMPT)
        n_drafted = sum(s.n_drafted for s in steps)
        n_accepted = sum(s.n_accepted for s in steps)
        drafted_rounds = [s for s in steps if s.n_drafted]
        longest = max((s.n_drafted for s in steps), default=0)
        hist = [0] * (longest + 1)
        tried = [0] * longest
        passed = [0] * longest
        for s in drafted_rounds:
            hist[s.n_accepted] += 1
            for i in range(s.n_drafted):
                tried[i] += 1
                if i < s.n_accepted:
                    passed[i] += 1
        t_llama = sum(s.t_llama for s in steps)
        by: dict[Source, list[int]] = {}
        for s in drafted_rounds:
            # a copy prompt lookup appended where a model's draft ends is prompt lookup's (its
            # tokens count as drafted, and as accepted once the target took them)
            copied = min(s.decision.copied, s.n_drafted)
            own = s.n_drafted - copied
            for src, n, acc in (
                (s.drafter, own, min(s.n_accepted, own)),
                (Source.LOOKUP, copied, s.n_accepted - own),
            ):
                if n:
                    counts = by.setdefault(src, [0, 0, 0])
                    counts[0] += 1
                    counts[1] += n
                    counts[2] += max(0, acc)
        return Stats(
            mode=self.mode,
            n_prompt_tokens=self.n_prompt_tokens,
            n_prompt_cached=self.n_prompt_cached,
            n_generated=n_gen,
            n_drafted=n_drafted,
            n_accepted=n_accepted,
            acceptance_rate=_ratio(n_accepted, n_drafted),
            rounds=len(rounds),
            rounds_drafted=len(drafted_rounds),
            mean_accepted_length=_ratio(n_accepted, len(drafted_rounds)),
            tokens_per_round=_ratio(n_gen - n_first, len(rounds)),
            accepted_length_histogram=tuple(hist) if drafted_rounds else (),
            acceptance_by_position=tuple(_ratio(a, b) for a, b in zip(passed, tried, strict=True)),
            t_prompt_s=self.t_prompt,
            t_draft_prompt_s=self.t_draft_prompt,
            t_decode_s=t_decode,
            t_draft_s=sum(s.t_draft for s in steps),
            t_verify_s=sum(s.t_verify for s in steps),
            t_llama_s=t_llama,
            ttft_s=self.ttft,
            prompt_tokens_per_second=_ratio(self.n_prompt_tokens - self.n_prompt_cached, self.t_prompt),
            decode_tokens_per_second=_ratio(n_gen, t_decode),
            python_share=max(0.0, 1.0 - _ratio(t_llama, t_decode)) if t_decode > 0 else 0.0,
            drafting_off=Action.NO_ROLLBACK
            if rounds and all(s.decision.action is Action.NO_ROLLBACK for s in rounds)
            else None,
            drafted_by=tuple((src, *counts) for src, counts in by.items()),  # type: ignore[misc]
            n_queued=self.n_queued,
            n_wasted=self.n_wasted,
        )


def _ratio(a: float, b: float) -> float:
    return float(a) / b if b else 0.0
