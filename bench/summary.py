"""What a benchmark run adds up to: per category and mode, pooled figures, the speedup over plain,
the best fixed setting of the run and each mode's ratio to it (with ranges over repeats), and the
tables ``tandem bench`` prints.

Each is figured twice: on decode time alone, and on *generation* time, decode plus the drafter's own
work on the prompt (a draft model evaluating it up front, ``t_draft_prompt_s``). Decode time leaves
that work out, so it flatters a setting that evaluates the prompt with a draft model it may then
barely use; generation time charges every setting for all it adds to the reply, and leaves out only
the target's prompt processing, the same in every mode."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bench.modes import best_fixed

TIE_GAP = 0.5  # logits: a first difference where the target's top two are closer is a numerical tie


def pooled(rs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a group of runs adds up to: tok/s over the pooled tokens and decode time, acceptance,
    tokens per round, the Python share, how many matched plain decoding, and the lookup bound."""
    tokens = sum(r["stats"]["n_generated"] for r in rs)
    t = sum(r["stats"]["t_decode_s"] for r in rs)
    drafted = sum(r["stats"]["n_drafted"] for r in rs)
    accepted = sum(r["stats"]["n_accepted"] for r in rs)
    rounds = sum(r["stats"].get("rounds", 0) for r in rs)  # (older records lack it)
    llama = sum(r["stats"]["t_llama_s"] for r in rs)
    compared = [r for r in rs if r["same_as_plain"] is not None]
    out: dict[str, Any] = {
        # seconds to process the prompts (target and draft), and to the whole replies with them
        "t_prompt": sum(r["stats"].get("t_prompt_s", 0.0) for r in rs),
        "t_reply": sum(r["stats"].get("t_prompt_s", 0.0) + r["stats"]["t_decode_s"] for r in rs),
        "tok_s": tokens / t if t else 0.0,
        "tok_s_gen": tok_s(rs, gen=True),
        "tokens": tokens,
        "acceptance": accepted / drafted if drafted else 0.0,
        "tokens_per_round": tokens / rounds if rounds else 0.0,
        "mean_k": sum(r["mean_k"] for r in rs) / len(rs),
        "python_share": 1 - llama / t if t else 0.0,
        "lossless": sum(bool(r["same_as_plain"]) for r in compared),
        "ties": sum(r.get("top2_gap_at_difference", 99.0) < TIE_GAP for r in compared),
        "compared": len(compared),
        "n": len(rs),
    }
    bounds = [r["lookup_bound"] for r in rs if r.get("lookup_bound")]
    if bounds:
        out["lookup_bound"] = sum(n for n, _ in bounds) / sum(c for _, c in bounds)
    return out


def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per category (and "all") and mode: tok/s over the pooled tokens and decode time, and more."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in data["runs"]:
        groups[(r["category"], r["mode"])].append(r)
        groups[("all", r["mode"])].append(r)
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (cat, mode), rs in groups.items():
        accepted = sum(r["stats"]["n_accepted"] for r in rs)
        rounds_drafted = sum(r["stats"]["rounds_drafted"] for r in rs)
        out[cat][mode] = {
            **pooled(rs),
            "mean_accepted": accepted / rounds_drafted if rounds_drafted else 0.0,
            "max_gap_at_difference": max((r.get("top2_gap_at_difference", 0.0) for r in rs), default=0.0),
        }
    for modes in out.values():
        plain = modes.get("plain", {})
        base = plain.get("tok_s")
        for v in modes.values():
            v["speedup"] = v["tok_s"] / base if base else float("nan")
            v["speedup_gen"] = v["tok_s_gen"] / plain["tok_s_gen"] if plain.get("tok_s_gen") else float("nan")
            # the same prompts, repeats and (losslessly) replies: ratios of summed seconds
            if plain.get("t_prompt") and v["t_reply"]:
                v["prompt_ratio"] = v["t_prompt"] / plain["t_prompt"]
                v["reply_speedup"] = plain["t_reply"] / v["t_reply"]
    for gen in (False, True):
        for cat, spread in repeat_spread(data, gen=gen).items():
            for mode, values in spread.items():
                out[cat][mode].update(values)
    return dict(out)


def tok_s(rs: Sequence[dict[str, Any]], gen: bool = False) -> float:
    """Tokens per second of decode time (``gen``: of generation time, the drafter's prompt work too)."""
    t = sum(r["stats"]["t_decode_s"] + (r["stats"].get("t_draft_prompt_s", 0.0) if gen else 0.0) for r in rs)
    return sum(r["stats"]["n_generated"] for r in rs) / t if t else 0.0


def repeat_spread(data: dict[str, Any], gen: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
    """Per category (and "all") and mode: the best fixed setting of the run (pooled over repeats,
    ``best_fixed``), each mode's ratio to it (``vs_best``), and the range over repeats of the speedup
    over plain and of the ratio to that setting (each repeat pooled on its own); ``gen``: the same on
    generation time, each key with ``_gen`` after it (``best_fixed_gen``, ``vs_best_gen``, ...)."""
    x = "_gen" if gen else ""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in data["runs"]:
        for cat in (r["category"], "all"):
            groups[(cat, r["mode"], r.get("repeat", 0))].append(r)
    speeds: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for (cat, mode, rep), rs in groups.items():
        speeds[cat][mode][rep] = tok_s(rs, gen)
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for cat, modes in speeds.items():
        overall = {
            m: tok_s([r for (c, mm, _), rs in groups.items() if (c, mm) == (cat, m) for r in rs], gen)
            for m in modes
        }
        best = best_fixed(overall)
        for mode, per in modes.items():
            v: dict[str, Any] = {}
            plain = modes.get("plain", {})
            ups = [x / plain[rep] for rep, x in per.items() if plain.get(rep)]
            if ups:
                v[f"speedup{x}_range"] = [min(ups), max(ups)]
            if best is not None:
                v[f"best_fixed{x}"] = best[0]
                v[f"vs_best{x}"] = overall[mode] / best[1] if best[1] else float("nan")
                ref = modes[best[0]]
                ratios = [s / ref[rep] for rep, s in per.items() if ref.get(rep)]
                v[f"vs_best{x}_range"] = [min(ratios), max(ratios)]
            out[cat][mode] = v
    return out


def print_tables(summary: dict[str, dict[str, dict[str, float]]], modes: list[str]) -> None:
    cats = [*sorted(c for c in summary if c != "all"), "all"]
    print(
        f"\n{'category':<11}{'mode':<9}{'tok/s':>7}{'speedup':>9}{'accept':>8}{'acc/rnd':>8}"
        f"{'mean k':>7}{'py%':>6}{'same+tie':>10}"
    )
    for cat in cats:
        for m in modes:
            v = summary[cat].get(m)
            if not v:
                continue
            same = ""
            if v["compared"] and m != "plain":
                same = f"{int(v['lossless'])}+{int(v['ties'])}t/{int(v['compared'])}"
            print(
                f"{cat:<11}{m:<9}{v['tok_s']:>7.2f}{v['speedup']:>8.2f}x{v['acceptance']:>8.0%}"
                f"{v['mean_accepted']:>8.2f}{v['mean_k']:>7.2f}{v['python_share'] * 100:>6.1f}{same:>10}"
            )
        print()


def markdown_tables(summary: dict[str, dict[str, dict[str, float]]], modes: list[str]) -> str:
    """Two Markdown tables for README: speedup vs plain by category and mode, and the details."""
    cats = [*sorted(c for c in summary if c != "all"), "all"]
    head = "| category | plain tok/s | " + " | ".join(m for m in modes if m != "plain") + " |"
    lines = [head, "|" + "---|" * (len(modes) + 1)]
    for cat in cats:
        row = summary[cat]
        cells = [f"{row['plain']['tok_s']:.2f}" if "plain" in row else "-"]
        for m in modes:
            if m != "plain":
                cells.append(f"{row[m]['speedup']:.2f}x" if m in row else "-")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| mode (all prompts) | tok/s | speedup | acceptance | accepted/round | mean k | Python share "
        "| same as plain + ties / runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        v = summary["all"].get(m)
        if not v:
            continue
        same = (
            f"{int(v['lossless'])} + {int(v['ties'])} / {int(v['compared'])}"
            if v["compared"] and m != "plain"
            else "-"
        )
        lines.append(
            f"| {m} | {v['tok_s']:.2f} | {v['speedup']:.2f}x | {v['acceptance']:.0%} "
            f"| {v['mean_accepted']:.2f} | {v['mean_k']:.2f} | {v['python_share'] * 100:.1f}% | {same} |"
        )
    return "\n".join(lines)


def best_fixed_table(
    summary: dict[str, dict[str, dict[str, Any]]], mode: str = "auto", gen: bool = False
) -> str:
    """Markdown: per category, the run's best fixed setting and its speedup over plain, ``mode``'s
    speedup, and ``mode``'s ratio to the best fixed setting (ranges over repeats in brackets); on
    decode time, or (``gen``) on generation time."""
    x = "_gen" if gen else ""
    cats = [*sorted(c for c in summary if c != "all"), "all"]
    lines = [
        f"| category | best fixed setting | its speedup | {mode} speedup | {mode} / best fixed |",
        "|---|---|---|---|---|",
    ]

    def cell(v: dict[str, Any], key: str, spread: str) -> str:
        text = f"{v[key]:.2f}x"
        if spread in v and v[spread][0] != v[spread][1]:
            text += f" ({v[spread][0]:.2f}-{v[spread][1]:.2f})"
        return text

    for cat in cats:
        row = summary[cat]
        v = row.get(mode)
        if not v or f"best_fixed{x}" not in v:
            continue
        best = row[v[f"best_fixed{x}"]]
        speed, ratio = (
            cell(v, f"speedup{x}", f"speedup{x}_range"),
            cell(v, f"vs_best{x}", f"vs_best{x}_range"),
        )
        lines.append(
            f"| {cat} | {v[f'best_fixed{x}']} | {cell(best, f'speedup{x}', f'speedup{x}_range')} "
            f"| {speed} | {ratio} |"
        )
    return "\n".join(lines)


def whole_reply_table(summary: dict[str, dict[str, dict[str, Any]]], modes: list[str]) -> str:
    """Markdown: per category, each mode's time to process the prompt over plain decoding's, and its
    speedup over plain over the whole reply, prompt included (decode speed leaves the prompt out: a
    draft that evaluates the prompt too costs there)."""
    shown = [m for m in modes if m != "plain"]
    cats = [*sorted(c for c in summary if c != "all"), "all"]
    lines = [
        "| category | " + " | ".join(f"{m}: prompt time, whole reply" for m in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for cat in cats:
        row = summary[cat]
        cells = []
        for m in shown:
            v = row.get(m, {})
            ok = "prompt_ratio" in v
            cells.append(f"{v['prompt_ratio']:.2f}x, {v['reply_speedup']:.2f}x" if ok else "-")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
