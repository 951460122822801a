""" "Does speculation pay here?": plain decoding against a drafting mode on a few of the user's own
prompts, interleaved, on the loaded pair. No Qt; the app runs it on its engine thread.

Each prompt runs in both modes, greedy (so both write the same text and only the speed differs), in
alternating order (plain first, then the mode first for the next prompt), so a machine that slows
down or warms up during the check weighs on both sides. The result is the median of the per-prompt
speed ratios with their spread, and the acceptance rate of the drafted tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine import EngineClient, Finished, FinishReason, GenerationSettings, Mode, SamplingParams

Messages = list[dict[str, Any]]

BUILT_IN_PROMPTS: tuple[str, ...] = (
    "Write a Python function that reads a CSV file and returns the rows as dictionaries.",
    "Rewrite this function with type hints and a docstring, and show the whole function:\n\n"
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n",
    "Explain in a short paragraph what a hash table is.",
    'Turn this into JSON with the keys name, city and age: "Ana lives in Porto and is 34; Ben, 27, '
    'lives in Oslo; Chen is 41 and lives in Lima."',
)
MAX_TOKENS = 96


@dataclass(frozen=True)
class CheckResult:
    """The mode's speed over plain decoding's on the same prompts."""

    mode: Mode
    speedup: float  # median over prompts of (mode tokens/s) / (plain tokens/s)
    low: float  # the smallest and largest per-prompt ratio
    high: float
    acceptance: float | None  # drafted tokens accepted (None: nothing was drafted)
    plain_tokens_per_second: float  # median
    mode_tokens_per_second: float  # median
    ratios: tuple[float, ...]
    own_prompts: bool  # the user's own prompts (else the built-in handful)


def recent_prompts(messages: Sequence[str], n: int = 4) -> list[str]:
    """The last ``n`` distinct non-empty prompts, newest first."""
    out: list[str] = []
    for text in messages:
        text = text.strip()
        if text and text not in out:
            out.append(text)
        if len(out) == n:
            break
    return out


def run_check(
    client: EngineClient,
    settings: GenerationSettings,
    prompts: Sequence[str] = (),
    *,
    max_tokens: int = MAX_TOKENS,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> CheckResult | None:
    """Run plain decoding and ``settings.mode`` on each prompt (the built-in ones when none are
    given); None when cancelled or when no prompt produced text in both modes."""
    own = bool(prompts)
    texts = list(prompts) or list(BUILT_IN_PROMPTS)
    mode = settings.mode if settings.mode is not Mode.PLAIN else Mode.AUTO
    greedy = replace(settings, mode=mode, max_tokens=max_tokens, sampling=SamplingParams(), stop=())
    plain = replace(greedy, mode=Mode.PLAIN)
    ratios: list[float] = []
    plain_tps: list[float] = []
    mode_tps: list[float] = []
    drafted = accepted = 0
    total = 2 * len(texts)
    for i, text in enumerate(texts):
        messages: Messages = [{"role": "user", "content": text}]
        order = (plain, greedy) if i % 2 == 0 else (greedy, plain)
        speeds: dict[Mode, float] = {}
        for j, gs in enumerate(order):
            if cancelled():
                return None
            fin = _finished(client, messages, gs)
            if progress is not None:
                progress(2 * i + j + 1, total)
            if fin is None:
                return None
            speeds[gs.mode] = fin.stats.decode_tokens_per_second
            if gs.mode is not Mode.PLAIN:
                drafted += fin.stats.n_drafted
                accepted += fin.stats.n_accepted
        if speeds.get(Mode.PLAIN) and speeds.get(mode):
            ratios.append(speeds[mode] / speeds[Mode.PLAIN])
            plain_tps.append(speeds[Mode.PLAIN])
            mode_tps.append(speeds[mode])
    if not ratios:
        return None
    return CheckResult(
        mode=mode,
        speedup=statistics.median(ratios),
        low=min(ratios),
        high=max(ratios),
        acceptance=accepted / drafted if drafted else None,
        plain_tokens_per_second=statistics.median(plain_tps),
        mode_tokens_per_second=statistics.median(mode_tps),
        ratios=tuple(ratios),
        own_prompts=own,
    )


def _finished(client: EngineClient, messages: Messages, settings: GenerationSettings) -> Finished | None:
    last: Finished | None = None
    for event in client.generate(messages=messages, settings=settings):
        if isinstance(event, Finished):
            last = event
    if last is None or last.reason is FinishReason.CANCELLED:
        return None
    return last


def describe(result: CheckResult) -> str:
    """One line for the app, e.g. "auto: 1.12x plain decoding (0.98-1.31x over 4 of your recent
    prompts), 64% of drafted tokens accepted; too close to call."."""
    where = "your recent prompts" if result.own_prompts else "built-in prompts"
    text = (
        f"{result.mode}: {result.speedup:.2f}x plain decoding "
        f"({result.low:.2f}-{result.high:.2f}x over {len(result.ratios)} of {where})"
    )
    if result.acceptance is not None:
        text += f", {result.acceptance:.0%} of drafted tokens accepted"
    if result.low > 1.0:
        verdict = "speculation pays here"
    elif result.high < 1.0:
        verdict = "it does not pay here"
    else:
        verdict = "too close to call"
    return f"{text}; {verdict}."
