"""What ``bench.replay`` prints: modeled speedups per category and policy, and auto mode against the best
fixed setting."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Result = dict[str, tuple[int, float]]  # category -> (tokens, cost in decode steps)
Table = dict[str, list[Result]]  # policy -> its result in each order replayed


def speedup(results: Sequence[Result], cats: Sequence[str]) -> float:
    """Geometric mean over orders of tokens / cost in steps, pooled over ``cats``."""
    logs = []
    for r in results:
        n = sum(r[c][0] for c in cats if c in r)
        cost = sum(r[c][1] for c in cats if c in r)
        if not cost:
            return 0.0
        logs.append(math.log(n / cost))
    return math.exp(sum(logs) / len(logs)) if logs else 0.0


def table(rows: Table | dict[str, Result], measured: dict[str, dict[str, float]] | None = None) -> str:
    """Markdown: modeled speedup (tokens / cost in steps) per category for each policy; ``measured``:
    columns of speedups a run measured (policy -> category -> speedup), printed after them."""
    runs: Table = {k: v if isinstance(v, list) else [v] for k, v in rows.items()}
    measured = measured or {}
    names = list(runs)
    cats = sorted({c for rs in runs.values() for r in rs for c in r})
    head = [*names, *(f"{m} (measured)" for m in measured)]
    lines = ["| category | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for c in [*cats, "all"]:
        pick = cats if c == "all" else [c]
        cells = [f"{speedup(runs[name], pick):.3f}x" for name in names]
        cells += [f"{m[c]:.2f}x" if c in m else "-" for m in measured.values()]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_fixed_table(fixed: dict[str, Result], auto: Sequence[Result]) -> str:
    """Markdown: per category (and "all"), the best of the ``fixed`` settings' replays, its speedup, and
    ``auto``'s speedup (geometric mean over its orders) and ratio to it."""
    cats = sorted({c for r in fixed.values() for c in r})
    lines = ["| category | best fixed | its speedup | auto | auto / best fixed |", "|---|---|---|---|---|"]
    for c in [*cats, "all"]:
        pick = cats if c == "all" else [c]
        speeds = {n: speedup([r], pick) for n, r in fixed.items()}
        best = max(speeds, key=lambda n: speeds[n])
        a = speedup(auto, pick)
        lines.append(f"| {c} | {best} | {speeds[best]:.3f}x | {a:.3f}x | {a / speeds[best]:.3f} |")
    return "\n".join(lines)


def measured_speedups(data: dict[str, Any], modes: Sequence[str]) -> dict[str, dict[str, float]]:
    """What the run itself measured for ``modes`` (speedup against plain, per category)."""
    from bench.summary import summarize

    summary = data.get("summary") or summarize(data)
    out: dict[str, dict[str, float]] = {}
    for m in modes:
        col = {c: row[m]["speedup"] for c, row in summary.items() if m in row and "speedup" in row[m]}
        if col:
            out[m] = col
    return out
