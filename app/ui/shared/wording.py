"""The app's words for the engine's decisions (the engine reports them as data; no Qt here)."""

from __future__ import annotations

from app.engine import (
    Action,
    Decision,
    Declined,
    FinishReason,
    MemoryKind,
    Mode,
    ModelInfo,
    Policy,
    Rollback,
    Source,
)
from app.gguf.arch import ArchFacts
from app.ui.shared.metrics import ReplyMeter
from models_registry.drafting import pair_drafting

SOURCE_NAMES = {
    Source.MODEL: "the draft model",
    Source.LOOKUP: "prompt lookup",
    Source.HISTORY: "your earlier conversations",
    Source.MTP: "the model's own MTP head",
    Source.EAGLE3: "the EAGLE-3 head",
    Source.ASSISTANT: "the Gemma 4 assistant",
    Source.NONE: "nothing",
}
PREDICTOR_NAMES = {
    Source.MODEL: "draft model",
    Source.MTP: "MTP head",
    Source.EAGLE3: "EAGLE-3 head",
    Source.ASSISTANT: "Gemma 4 assistant",
}
COPY_NAMES = {Source.LOOKUP: "prompt lookup", Source.HISTORY: "history"}
# a reply's mode and why it ended, in a message's footer
MODE_NAMES = {
    Mode.AUTO: "auto",
    Mode.SPECULATIVE: "draft model",
    Mode.LOOKUP: "prompt lookup",
    Mode.MTP: "MTP",
    Mode.PLAIN: "plain",
    Mode.REMOTE: "remote",
}
REASON_NAMES = {
    FinishReason.LENGTH: "stopped at the token limit",
    FinishReason.CANCELLED: "stopped",
    FinishReason.CONTEXT: "context full",
}


def describe_declined(d: Declined) -> str:
    """A draft auto mode did not use, e.g. "prompt lookup: a 2-token match, too likely to break to pay"."""
    why = "losing lately" if d.losing else "too likely to break to pay"
    return f"{COPY_NAMES.get(d.source, 'prompt lookup')}: a {d.match}-token match, {why}"


def _speedups(d: Decision) -> str:
    parts = []
    if d.expected_speedup is not None:
        parts.append(f"{d.expected_speedup:.2f}x expected")
    if d.measured_speedup is not None:
        parts.append(f"{d.measured_speedup:.2f}x lately")
    return ", ".join(parts)


def _drafting(d: Decision) -> str:
    if d.policy is Policy.FIXED:
        return f"capped at {d.k} by the context" if d.capped else f"fixed n_max={d.n_max}"
    if d.policy is Policy.ADAPTIVE:
        acc = d.recent_acceptance
        return f"adaptive: recent acceptance {acc:.0%}" if acc is not None else "adaptive"
    if d.source in COPY_NAMES:
        text = f"{COPY_NAMES[d.source]}: {d.match}-token match"
        if d.resumes_copy:
            text += ", resuming the copy"
        if d.copy_broke_at:
            text += f", copy broke at token {d.copy_broke_at} before"
    else:
        sure = f"{d.target_sure:.0%}" if d.target_sure is not None else f"under {d.sure_floor:.0%}"
        text = f"{PREDICTOR_NAMES.get(d.source, 'draft model')}: target {sure} sure"
        if d.acceptance is not None:
            text += f", {d.acceptance:.0%} acceptance"
        if d.copied:
            text += f", then {d.copied} tokens copied after a {d.match}-token match"
    speed = _speedups(d)
    return f"{text}, {speed}" if speed else text


def describe_decision(d: Decision, where: str = "this machine") -> str:
    """Why a round drafted what it did, in a few words (no final period)."""
    a = d.action
    if a is Action.DRAFT:
        text = _drafting(d)
    elif a is Action.PLAIN:
        text = "plain decoding"
    elif a is Action.PROMPT:
        text = "the first token, read with the prompt"
    elif a is Action.NO_ROOM:
        text = "no room to draft"
    elif a is Action.NO_ROLLBACK:
        text = "plain decoding: this model's memory cannot undo a rejected draft"
    elif a is Action.NO_MATCH:
        text = "no n-gram match"
    elif a is Action.MEASURE:
        name = PREDICTOR_NAMES.get(d.source)
        text = f"measuring the {name}" if name else "measuring plain decoding"
    elif a is Action.PROBE:
        text = "probing: re-measuring whether drafting pays"
        if d.expected_speedup is not None and d.acceptance is not None:
            text += f" ({d.expected_speedup:.2f}x if the draft is {d.acceptance:.0%} right)"
    elif a is Action.PAUSED:
        text = f"drafting paused: verifying costs more than it saves on {where}"
        if d.source is Source.MTP:
            text = f"MTP head paused: its drafts cost more than they save on {where}"
    elif d.declined is not None:  # DECLINED, with what was on offer
        return describe_declined(d.declined)
    else:
        acc = d.recent_acceptance
        return f"not drafting: recent acceptance {acc:.0%}" if acc is not None else "not drafting"
    if d.declined is not None:
        text += f"; {describe_declined(d.declined)}"
    return text


def status_text(meter: ReplyMeter, backend: str, mode: Mode | None) -> str:
    """The gauges' one-line status for the reply so far."""
    if mode is Mode.REMOTE:
        if meter.finished is None:
            return "A remote server writes this reply: its speed and acceptance come with its end."
        if meter.n_drafted:
            return "A remote server wrote this reply; the acceptance is from the draft counts it reported."
        return "A remote server wrote this reply; it reported no draft counts (no acceptance to show)."
    last = meter.last
    if meter.paused and last is not None:
        where = f"this {backend}" if backend else "this machine"
        text = f"Drafting paused: verifying costs more than it saves on {where}"
        if last.source is Source.MTP:
            text = f"The MTP head is paused: its drafts cost more than they save on {where}"
        return f"{text} ({describe_declined(last.declined)})." if last.declined else text + "."
    if not meter.rounds or last is None:
        return ""
    if mode is Mode.PLAIN:
        return "Plain decoding (speculation is off)."
    if last.action is Action.NO_ROLLBACK:
        return "Plain decoding: this model's memory cannot undo a rejected draft, so it cannot speculate."
    drafted = meter.drafted
    if drafted is None:
        return f"Not drafting: {describe_decision(last)}."
    text = f"Drafting with {SOURCE_NAMES[drafted.source]}, up to {drafted.k} tokens a round"
    if drafted.policy is Policy.FIXED and not drafted.capped:
        return text + "."
    return f"{text} ({describe_decision(drafted)})."


def describe_memory(m: ModelInfo) -> str:
    """What a loaded model keeps of the text, and how a rejected draft is undone on it."""
    kind = {
        MemoryKind.ATTENTION: "attention",
        MemoryKind.SLIDING_WINDOW: "sliding-window attention",
        MemoryKind.HYBRID: "hybrid (recurrent + attention)",
        MemoryKind.RECURRENT: "recurrent",
    }[m.memory]
    moe = f", {m.experts_used} of {m.experts} experts a token" if m.experts > 1 and m.experts_used else ""
    how = {
        Rollback.TRIM: "a rejected draft is trimmed from its cache",
        Rollback.SNAPSHOT: f"a rejected draft is undone by per-token snapshots (up to {m.snapshots} "
        "tokens), longer ones by a checkpoint",
        Rollback.CHECKPOINT: "a rejected draft is undone by a checkpoint and the accepted tokens again",
        Rollback.NONE: "it cannot undo a rejected draft, so it decodes plainly",
    }[m.rollback]
    arch = f"{m.architecture}: " if m.architecture else ""
    return f"{arch}{kind}{moe}; {how}"


def describe_pair_drafting(target: ArchFacts, draft: ArchFacts) -> str:
    """What drafting a pair supports, from its GGUF headers: "Drafting: draft model, prompt lookup, ...;
    target rolls back by ..." (the Custom pair tab; `tandem check` prints the same)."""
    words = pair_drafting(target, draft).words
    return words[:1].upper() + words[1:]
