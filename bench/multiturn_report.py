"""The multi-turn benchmark's figures (:mod:`bench.multiturn`): per group of turns and mode, the pooled
decode speed, its speedup over plain decoding, the spread over turns, and auto's ratio to the best fixed
setting of the run, on decode time and on generation time (the drafter's prompt work too); printed as
markdown."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bench.modes import MODES, best_fixed
from bench.summary import pooled


def mode_label(mode: str, pass_no: int) -> str:
    return mode if pass_no == 1 else f"{mode} (pass 2)"


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and range of ``values``."""
    xs = sorted(values)
    if not xs:
        return {}
    q1, q3 = (statistics.quantiles(xs, n=4, method="inclusive")[i] for i in (0, 2)) if len(xs) > 1 else xs * 2
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1], "n": len(xs)}


def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per group (``first``, ``revision``, ``all``, and ``<kind>/first``, ``<kind>/revision``) and mode
    (``auto``; ``auto (pass 2)`` for the second pass): decode tok/s over the pooled tokens and time,
    its speedup over plain in the same pass, and the spread of the speedup over turns (each turn's
    speedup against plain decoding of the same turn in the same repeat, its median over repeats)."""
    runs = data["runs"]
    plain_speed = {
        (r["id"], r["repeat"], r["pass"]): r["stats"]["decode_tokens_per_second"]
        for r in runs
        if r["mode"] == "plain"
    }
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        label = mode_label(r["mode"], r["pass"])
        for g in (r["category"], "all", f"{r['kind']}/{r['category']}"):
            groups[(g, label)].append(r)
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (group, label), rs in groups.items():
        per_turn: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            base = plain_speed.get((r["id"], r["repeat"], r["pass"]))
            if base:
                per_turn[r["id"]].append(r["stats"]["decode_tokens_per_second"] / base)
        drafters: dict[str, int] = defaultdict(int)
        for r in rs:
            for k, v in r["drafters"].items():
                drafters[k] += v
        v: dict[str, Any] = {
            **pooled(rs),
            "drafters": dict(drafters),
            "turns": len(per_turn),
            "speedup_over_turns": spread([statistics.median(x) for x in per_turn.values()]),
        }
        out[group][label] = v
    for modes in out.values():
        for x in ("", "_gen"):  # on decode time, and on generation time (the drafter's prompt work too)
            for label, v in modes.items():
                plain = modes.get(mode_label("plain", 2 if label.endswith("(pass 2)") else 1), {})
                base = plain.get(f"tok_s{x}")
                v[f"speedup{x}"] = v[f"tok_s{x}"] / base if base else float("nan")
            best = best_fixed({label: v[f"tok_s{x}"] for label, v in modes.items() if "(pass" not in label})
            for label, v in modes.items():
                if best is not None and best[1] and not MODES[label.split(" ")[0]].fixed:
                    v[f"best_fixed{x}"], v[f"vs_best{x}"] = best[0], v[f"tok_s{x}"] / best[1]
    return dict(out)


def best_fixed_lines(summary: dict[str, dict[str, dict[str, Any]]], groups: Sequence[str]) -> list[str]:
    """Per group, each auto mode's ratio to the best fixed setting of the run (first pass)."""
    out = []
    for g in groups:
        for label, v in summary.get(g, {}).items():
            if "best_fixed" in v:
                best = summary[g][v["best_fixed"]]
                line = (
                    f"{g}: {label} {v['speedup']:.2f}x of plain, {v['vs_best']:.2f}x of the best fixed "
                    f"setting ({v['best_fixed']}, {best['speedup']:.2f}x of plain)"
                )
                if "best_fixed_gen" in v:  # the drafter's prompt work counted too
                    gen = summary[g][v["best_fixed_gen"]]
                    line += (
                        f"; on generation time {v['speedup_gen']:.2f}x, {v['vs_best_gen']:.2f}x of "
                        f"{v['best_fixed_gen']} ({gen['speedup_gen']:.2f}x)"
                    )
                out.append(line)
    return out


def _spread_cell(s: dict[str, float]) -> str:
    if not s:
        return "-"
    return f"{s['median']:.2f}x [{s['q1']:.2f}-{s['q3']:.2f}] ({s['min']:.2f}-{s['max']:.2f})"


def markdown_table(summary: dict[str, dict[str, dict[str, Any]]], groups: Sequence[str]) -> str:
    """Markdown: per mode and group, tok/s, pooled speedup, the speedup over turns (median
    [quartiles] (range)), acceptance, tokens per round, and replies equal to plain's (+ ties)."""
    labels = sorted(
        {label for g in groups for label in summary.get(g, {})},
        key=lambda x: (x.endswith("(pass 2)"), list(MODES).index(x.split(" ")[0])),
    )
    lines = [
        "| mode | turns | tok/s | speedup | speedup over turns: median [quartiles] (range) | acceptance "
        "| tokens/round | same as plain + ties |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        for g in groups:
            v = summary.get(g, {}).get(label)
            if not v:
                continue
            plain = label.startswith("plain")
            same = f"{v['lossless']} + {v['ties']} / {v['compared']}" if v["compared"] else "-"
            over_turns = "-" if plain else _spread_cell(v["speedup_over_turns"])
            acceptance = "-" if plain else f"{v['acceptance']:.0%}"
            lines.append(
                f"| {label} | {g} ({v['turns']}) | {v['tok_s']:.2f} | {v['speedup']:.2f}x | {over_turns} "
                f"| {acceptance} | {v['tokens_per_round']:.2f} | {same} |"
            )
    return "\n".join(lines)


def second_pass_check(summary: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Whether auto-history was faster in the second pass than in the first, per group."""
    out = []
    for g in ("first", "revision", "all"):
        a = summary.get(g, {}).get("auto-history")
        b = summary.get(g, {}).get("auto-history (pass 2)")
        if a and b:
            verdict = "faster" if b["speedup"] > a["speedup"] else "NOT faster"
            out.append(
                f"auto-history, {g} turns: {b['speedup']:.2f}x in the second pass against "
                f"{a['speedup']:.2f}x in the first ({verdict})"
            )
    return out


def history_timing_line(data: dict[str, Any]) -> str:
    """What the history's calls cost per call, against a decode step of plain decoding in this run."""
    t = data["history_timing"]
    plain = [r["stats"]["decode_tokens_per_second"] for r in data["runs"] if r["mode"] == "plain"]
    step = f"; a decode step here: {1e3 / statistics.median(plain):.1f} ms" if plain else ""
    return (
        f"history, per call on a {t['tokens']:,}-token index: add a token {t['add']:.1f} us, lookup "
        f"{t['lookup']:.1f} us (not found {t['lookup_miss']:.1f}, common {t['lookup_common']:.1f}), "
        f"continuation {t['continuation']:.1f} us (common {t['continuation_common']:.1f}){step}"
    )
