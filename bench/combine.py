"""Combine repeated ``tandem bench`` runs: median speedup per category and mode, and the targets.

One run on a shared machine is noisy (a category of one or two short replies moves by ±10 % between
runs), so the figures that matter are medians over repeated runs, each speedup taken against plain
decoding *in the same run*::

    python -m bench.combine bench/results/a.json bench/results/b.json bench/results/c.json

Prints Markdown: the median speedup per category and mode with its range over runs, then auto mode
against its targets (at least 0.97x plain in every category, within 5 % of the best fixed mode, and
at least 1.3x on ``code_edit`` for lookup or auto). Then the same per prompt: each prompt's pair of
replies (a mode's and plain decoding's, from one run) is taken from the run where that prompt's
speedup was the median, and a category pools its prompts' pairs. A slowdown on a shared machine
usually hits one prompt of one run; a category's median over runs still shows it when it hit
different prompts of a category in two runs, a prompt's median does not. Last, every repeat of every
run pooled (tokens over seconds, with the range over repeats), on decode time and again on generation
time (decode plus the drafter's own work on the prompt, which a draft model that evaluates the prompt
up front does before decode time starts; see :mod:`bench.summary`), and auto mode's replies that
drafted nothing against plain's in the same repeat: the same llama.cpp work, so their spread is the
machine's noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.summary import TIE_GAP, summarize, tok_s

FIXED = ("spec3", "spec5", "spec8", "lookup")  # the modes auto mode is held against
EARLY = 24  # a reply that leaves plain decoding's text before this token is mostly a different text


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Each run's summary, with ``_diverged``: (prompt id, category, mode, first difference) of the
    replies that left plain decoding's text at a numerical tie."""
    runs = []
    for p in paths:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read benchmark results {p}: {e}") from None
        if not isinstance(data, dict) or "runs" not in data:
            raise SystemExit(f"{p} is not a file written by tandem bench")
        summary = dict(data.get("summary") or summarize(data))
        summary["_runs"] = data["runs"]
        summary["_diverged"] = [
            (r["id"], r["category"], r["mode"], r["first_difference"])
            for r in data["runs"]
            if r.get("same_as_plain") is False
            and "first_difference" in r
            and r.get("top2_gap_at_difference", 99.0) < TIE_GAP
        ]
        runs.append(summary)
    # A run of only some categories (``--categories``) adds to their medians, but its "all" pools
    # fewer prompts than a full run's, so it does not count toward "all".
    every = {c for r in runs for c in r if not c.startswith("_") and c != "all"}
    for r in runs:
        if {c for c in r if not c.startswith("_") and c != "all"} != every:
            r.pop("all", None)
    return runs


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """category -> mode -> speedups over runs (modes missing from a run are skipped)."""
    out: dict[str, dict[str, list[float]]] = {}
    for summary in runs:
        for cat, modes in summary.items():
            if cat.startswith("_"):
                continue
            for mode, v in modes.items():
                out.setdefault(cat, {}).setdefault(mode, []).append(v["speedup"])
    return out


def per_prompt(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """category -> mode -> speedup pooled over the category's prompts, each prompt's pair of replies
    (the mode's and plain decoding's, from one run) taken from the run with its median speedup."""
    pairs: dict[tuple[str, str, str], list[tuple[float, dict[str, Any], dict[str, Any]]]] = {}
    for summary in runs:
        recs = {(r["id"], r["mode"]): r for r in summary["_runs"]}
        for (pid, mode), r in recs.items():
            plain = recs.get((pid, "plain"))
            if plain is None or not plain["stats"]["t_decode_s"] or not r["stats"]["t_decode_s"]:
                continue
            speedup = tok_s([r]) / tok_s([plain])
            pairs.setdefault((pid, r["category"], mode), []).append((speedup, r, plain))
    chosen: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for (_, cat, mode), xs in sorted(pairs.items()):
        xs.sort(key=lambda x: x[0])
        _, r, plain = xs[(len(xs) - 1) // 2]  # the median run (the lower middle of an even count)
        for c in (cat, "all"):
            chosen.setdefault((c, mode), []).append((r, plain))
    out: dict[str, dict[str, float]] = {}
    for (cat, mode), prs in chosen.items():
        out.setdefault(cat, {})[mode] = tok_s([r for r, _ in prs]) / tok_s([p for _, p in prs])
    return out


def pooled(runs: list[dict[str, Any]], gen: bool = False) -> dict[str, dict[str, tuple[float, float, float]]]:
    """category -> mode -> (speedup over plain pooled over every repeat of every run, lowest and
    highest over the repeats), on decode time or (``gen``) generation time. A mode missing from some
    runs pools the repeats it ran in, against plain decoding in the same repeats."""
    groups: dict[tuple[str, str, tuple[int, int]], list[dict[str, Any]]] = {}
    for i, summary in enumerate(runs):
        for r in summary["_runs"]:
            for c in (r["category"], "all"):
                groups.setdefault((c, r["mode"], (i, r.get("repeat", 0))), []).append(r)
    pairs: dict[tuple[str, str], list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = {}
    for (c, mode, rep), recs in sorted(groups.items()):
        plain = groups.get((c, "plain", rep))
        if plain:
            pairs.setdefault((c, mode), []).append((recs, plain))
    table: dict[str, dict[str, tuple[float, float, float]]] = {}
    for (c, mode), reps in pairs.items():
        by_rep = [tok_s(recs, gen) / tok_s(plain, gen) for recs, plain in reps]
        mine = [r for recs, _ in reps for r in recs]
        theirs = [r for _, plain in reps for r in plain]
        table.setdefault(c, {})[mode] = (tok_s(mine, gen) / tok_s(theirs, gen), min(by_rep), max(by_rep))
    return table


def undrafted(runs: list[dict[str, Any]]) -> list[float]:
    """Auto mode's speed over plain decoding's in the same repeat, for each reply where auto drafted
    nothing (the same llama.cpp calls as plain decoding: what is left is the machine's noise and auto
    mode's Python)."""
    out = []
    for summary in runs:
        recs = {(r["id"], r.get("repeat", 0), r["mode"]): r for r in summary["_runs"]}
        for (pid, rep, mode), r in recs.items():
            plain = recs.get((pid, rep, "plain"))
            if mode == "auto" and plain is not None and r["stats"].get("n_drafted", 1) == 0:
                out.append(tok_s([r]) / tok_s([plain]))
    return out


def targets(table: dict[str, dict[str, float]], cats: list[str]) -> list[str]:
    """Auto mode against its targets, from one speedup per category and mode."""
    lines = [
        "| category | auto | best fixed mode | auto / best | auto >= 0.97x | within 5 % |",
        "|---|---|---|---|---|---|",
    ]
    for c in cats:
        auto = table[c]["auto"]
        fixed = {m: table[c][m] for m in FIXED if m in table[c]}
        fixed["plain"] = 1.0
        best = max(fixed, key=lambda m: fixed[m])
        ratio = auto / fixed[best]
        lines.append(
            f"| {c} | {auto:.2f}x | {best} {fixed[best]:.2f}x | {ratio:.2f} "
            f"| {'yes' if auto >= 0.97 else 'no'} | {'yes' if ratio >= 0.95 else 'no'} |"
        )
    if "code_edit" in table:
        best_edit = max(table["code_edit"][m] for m in ("lookup", "auto") if m in table["code_edit"])
        lines += ["", f"code_edit, best of lookup and auto: {best_edit:.2f}x (target 1.3x)"]
    return lines


def _cell(xs: list[float]) -> str:
    med = statistics.median(xs)
    return f"{med:.2f}x" if len(xs) == 1 else f"{med:.2f}x ({min(xs):.2f}-{max(xs):.2f})"


def report(runs: list[dict[str, Any]]) -> str:
    table = medians(runs)
    cats = [*sorted(c for c in table if c != "all"), "all"]
    modes = [m for m in ("spec3", "spec5", "spec8", "lookup", "auto") if any(m in table[c] for c in cats)]
    plain = {c: statistics.median(r[c]["plain"]["tok_s"] for r in runs if c in r) for c in cats}
    bound = {
        c: statistics.median(xs)
        for c in cats
        if (xs := [r[c]["plain"]["lookup_bound"] for r in runs if c in r and "lookup_bound" in r[c]["plain"]])
    }
    counts = {c: sum(c in r for r in runs) for c in cats}
    uneven = ", ".join(f"{c} {n}" for c, n in counts.items() if n != len(runs))
    lines = [
        f"Median over {len(runs)} runs (range in brackets); speedup against plain in the same run."
        + (f" Runs per category where fewer: {uneven}." if uneven else ""),
        "",
        "| category | plain tok/s | " + " | ".join(modes) + (" | lookup bound |" if bound else " |"),
        "|" + "---|" * (len(modes) + 2 + bool(bound)),
    ]
    for c in cats:
        cells = [_cell(table[c][m]) if m in table[c] else "-" for m in modes]
        if bound:
            cells.append(f"{bound[c]:.2f}x" if c in bound else "-")
        lines.append(f"| {c} | {plain[c]:.2f} | " + " | ".join(cells) + " |")
    if bound:
        lines += [
            "",
            "lookup bound: the speedup an all-knowing prompt-lookup policy (drafting exactly as far as "
            "the target accepts) would reach with the verify costs measured in the run.",
        ]
    if "auto" in modes:
        med = {c: {m: statistics.median(xs) for m, xs in table[c].items()} for c in cats}
        lines += ["", *targets(med, cats)]
        prompt_table = per_prompt(runs)
        if len(runs) > 1 and all("auto" in prompt_table.get(c, {}) for c in cats):
            lines += [
                "",
                "Per prompt: each prompt's pair of replies (the mode's and plain's, from one run) from the "
                "run where its speedup was the median of the runs it was in; a category pools its prompts.",
                "",
                "| category | " + " | ".join(modes) + " |",
                "|" + "---|" * (len(modes) + 1),
            ]
            for c in cats:
                cells = [f"{prompt_table[c][m]:.2f}x" if m in prompt_table[c] else "-" for m in modes]
                lines.append(f"| {c} | " + " | ".join(cells) + " |")
            lines += ["", *targets(prompt_table, cats)]
    pool = pooled(runs)
    if "auto" in modes and all("auto" in pool.get(c, {}) for c in cats):
        n_reps = len({(i, r.get("repeat", 0)) for i, s in enumerate(runs) for r in s["_runs"]})
        for gen, table_ in ((False, pool), (True, pooled(runs, gen=True))):
            lines += [
                "",
                (
                    "The same on generation time: decode time plus the drafter's own work on the prompt "
                    "(a draft model evaluating it before the first token)."
                    if gen
                    else f"Pooled over all {n_reps} repeats of the runs: tokens over seconds, speedup "
                    "against plain in the same repeats (range over the repeats)."
                ),
                "",
                "| category | " + " | ".join(modes) + " |",
                "|" + "---|" * (len(modes) + 1),
            ]
            for c in cats:
                cells = [
                    f"{table_[c][m][0]:.2f}x ({table_[c][m][1]:.2f}-{table_[c][m][2]:.2f})"
                    if m in table_[c]
                    else "-"
                    for m in modes
                ]
                lines.append(f"| {c} | " + " | ".join(cells) + " |")
            lines += ["", *targets({c: {m: v[0] for m, v in table_[c].items()} for c in cats}, cats)]
        alike = undrafted(runs)
        if len(alike) > 1:
            mean = statistics.fmean(alike)
            sd = statistics.stdev(alike)
            se = sd / len(alike) ** 0.5
            lines += [
                "",
                f"Where auto drafted nothing ({len(alike)} replies: plain decoding's llama.cpp calls), "
                f"its speed over plain's in the same repeat: {mean:.3f}x (standard error {se:.3f}; "
                f"one reply's standard deviation {sd:.1%}, range {min(alike):.2f}-{max(alike):.2f}x).",
            ]
    early: dict[tuple[str, str], dict[str, int]] = {}
    for r in runs:
        for pid, cat, mode, first in r["_diverged"]:
            if first < EARLY:
                early.setdefault((pid, cat), {})[mode] = first
    if early:
        lines += [
            "",
            f"Replies that left plain decoding's text within the first {EARLY} tokens, at a numerical "
            "tie (batched and one-token evaluation round differently), so their tok/s compare different "
            "texts: "
            + "; ".join(
                f"{pid} ({cat}): " + ", ".join(f"{m} at {t}" for m, t in sorted(modes.items()))
                for (pid, cat), modes in sorted(early.items())
            )
            + ".",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.combine", description=__doc__)
    p.add_argument("results", nargs="+", type=Path, help="JSON files written by tandem bench")
    args = p.parse_args(argv)
    print(report(load(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
