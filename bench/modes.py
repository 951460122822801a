"""The benchmarks' one table of generation modes, their warm-up, and a reply's events collected.

``tandem bench`` (:mod:`bench.run`), :mod:`bench.multiturn` and the agent benchmark name modes from
:data:`MODES`. The *fixed settings* (:data:`FIXED`: plain decoding, speculative decoding at a fixed
draft length, prompt lookup) are what auto mode is held to: each benchmark reports, per category,
the best of the fixed settings it ran and auto mode's ratio to it (:func:`best_fixed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the fixed draft lengths a benchmark runs by default (all of 1..8 are known by name: ``spec<n>``)
SPEC_N = (1, 2, 3, 4, 6, 8)


@dataclass(frozen=True, slots=True)
class Mode:
    """One benchmarked setting: the engine's mode and its draft length (``adaptive``: the engine's
    adaptive policy from ``n_max`` down; else fixed); ``history``: the request is kept in the drafting
    history under its conversation (auto mode with the history drafter)."""

    name: str
    mode: str
    n_max: int = 8
    adaptive: bool = True
    history: bool = False

    @property
    def fixed(self) -> bool:
        """A fixed setting: what a user could pick instead of auto mode."""
        return self.mode != "auto" and not (self.mode == "speculative" and self.adaptive)

    def settings(self, max_tokens: int, **extra: Any) -> Any:
        """The engine's :class:`GenerationSettings` for one greedy reply in this mode."""
        from app.engine.settings import GenerationSettings

        return GenerationSettings(
            mode=self.mode, max_tokens=max_tokens, n_max=self.n_max, adaptive=self.adaptive, **extra
        )


MODES: dict[str, Mode] = {
    "plain": Mode("plain", "plain"),
    **{f"spec{n}": Mode(f"spec{n}", "speculative", n, False) for n in range(1, 9)},
    "adaptive": Mode("adaptive", "speculative", 8, True),
    "lookup": Mode("lookup", "lookup", 8, True),
    "auto": Mode("auto", "auto", 8, True),
    "auto-history": Mode("auto-history", "auto", 8, True, history=True),
}
FIXED = tuple(name for name, m in MODES.items() if m.fixed)


def parse_modes(text: str, allowed: Iterable[str] | None = None) -> list[Mode]:
    """Comma-separated mode names to modes (``spec`` alone: every length in :data:`SPEC_N`);
    an unknown name ends the program with the names it knows."""
    names: list[str] = []
    for name in (x.strip() for x in text.split(",")):
        if name == "spec":
            names += [f"spec{n}" for n in SPEC_N]
        elif name:
            names.append(name)
    known = list(allowed) if allowed is not None else list(MODES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown modes: {', '.join(unknown)} (choose from {', '.join(known)}, or spec)")
    return [MODES[n] for n in dict.fromkeys(names)]


def best_fixed(speeds: Mapping[str, float]) -> tuple[str, float] | None:
    """The fastest fixed setting among ``speeds`` (mode name -> tokens/s), or None if none ran."""
    fixed = [(speeds[n], n) for n in FIXED if n in speeds]
    if not fixed:
        return None
    speed, name = max(fixed)
    return name, speed


def warm_up(engine: Any, prompt: Sequence[int], modes: Iterable[Mode]) -> None:
    """One short untimed reply per model the modes use, before measuring: the first replies after a
    load run slowly (pages of the weights still being faulted in, caches cold) and would penalize
    whichever mode the order puts first."""
    from app.engine.settings import GenerationSettings

    kinds = ["plain"]
    if engine.draft is not None and any(m.mode in ("speculative", "auto") for m in modes):
        kinds.append("speculative")
    for mode in kinds:
        engine.reset()
        engine.run(list(prompt), GenerationSettings(mode=mode, max_tokens=16, n_max=3, adaptive=False))
    engine.reset()


def collect(events: Iterable[Any]) -> tuple[list[Any], Any]:
    """A reply's :class:`Step` events and its :class:`Finished` event (told apart by type)."""
    from app.engine.events import Finished, Step

    steps: list[Step] = []
    finished: Finished | None = None
    for ev in events:
        if isinstance(ev, Step):
            steps.append(ev)
        elif isinstance(ev, Finished):
            finished = ev
    if finished is None:
        raise RuntimeError("the reply ended without a Finished event")
    return steps, finished


def reply_record(steps: Sequence[Any], finished: Any) -> dict[str, Any]:
    """What a benchmark keeps of one reply: its statistics, tokens, finish reason, mean draft length
    and rounds per drafter."""
    from app.engine.events import Action

    # the rounds: not a first token read with the prompt's batch
    rounds = [s for s in steps if s.decision.action is not Action.PROMPT]
    drafters: dict[str, int] = {}
    for s in rounds:
        drafters[s.drafter.value] = drafters.get(s.drafter.value, 0) + 1
    return {
        "stats": finished.stats.to_dict(),
        "tokens": list(finished.tokens),
        "text": finished.text,
        "finish": str(getattr(finished.reason, "value", finished.reason)),
        "mean_k": sum(s.k for s in rounds) / max(1, len(rounds)),
        "drafters": drafters,
    }
