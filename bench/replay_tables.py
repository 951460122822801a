"""Auto mode held to the best fixed setting on every recorded cost table, without models.

The recorded replies (``bench/recorded/*.replies.json.gz``: the target's confidences and the draft's
greedy predictions are in them; ``held-out`` are the replies to ``bench/prompts-held-out.jsonl``,
three prompts per category that auto mode is never tuned on) are replayed with each cost table: the
AMD EPYC's, this Intel Xeon's (``bench/recorded/xeon-costs.json``, ``xeon-costs-2026-11-27.json``
measured later, when a draft model round cost about 3 decode steps, and ``xeon-costs-2026-11-28.json``,
when its batches cost more still), a laptop GPU's (synthesized, not
measured: a verify batch costs about one decode step up to 16 tokens,
``bench.replay_history.gpu_ratios``; a 0.5B draft's step 0.15 of a 7B target's,
``bench.gpu_check.ASSUMED_DRAFT``) and each backend's table in a recorded GPU check
(``bench/recorded/gpu-check-*.json``, after 512 tokens: ``h100-cuda``, ``h100-vulkan``,
``h200-cuda``; given in plain decoding's steps, which on CUDA cost less than the steps the table
timed between batches: see ``bench.gpu_check.measured_table``). For each table and category it
prints the best fixed setting (plain, speculative at draft lengths 1-8, lookup), auto mode's speedup
over plain, and auto's ratio to that setting, and checks the issue's bar: auto within ``--within`` of
the best fixed setting and never below plain::

    python -m bench.replay_tables --orders 3

Auto mode starts each order with nothing learned (a fresh engine, no saved priors): the worst case.
With ``--remember`` it starts each order from the memory file a session over another set left
(:data:`EARLIER`: the held-out replies before the single-turn ones and the other way round, the
single-turn ones before the multi-turn conversations), as a user's second session on a machine does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.replay import TableCosts, orders, replay_auto, replay_settings, session_memory
from bench.replay_report import Result, speedup

RECORDED = Path(__file__).with_name("recorded")
XEON_COSTS = RECORDED / "xeon-costs.json"
# the same VM measured again later, when its verify batches and the draft's catch-ups cost more: a
# draft model round about 3 decode steps, at break-even on prose (where decisions are closest)
XEON_LATER = RECORDED / "xeon-costs-2026-11-27.json"
# and again a day later, when its batches cost more still (a batch of 4 at 1.80 steps, of 3 at 2.05):
# the draft model at or below break-even except where it is always right
XEON_11_28 = RECORDED / "xeon-costs-2026-11-28.json"
# with --remember: the set whose session left the memory file each set's replay starts from (never
# the set itself: a user's earlier session was spent on other prompts)
EARLIER = {"single-turn": "held-out", "held-out": "single-turn", "multi-turn": "single-turn"}


def tables() -> dict[str, tuple[list[float], list[float], str]]:
    """Name -> (verify ratios, draft ratios, where they come from)."""
    from bench.gpu_check import ASSUMED_DRAFT, measured_table
    from bench.gpu_replay import EPYC_TABLE
    from bench.replay_history import gpu_ratios

    out = {"epyc": (list(EPYC_TABLE[0]), list(EPYC_TABLE[1]), EPYC_TABLE[2])}
    if XEON_COSTS.exists():
        xeon = json.loads(XEON_COSTS.read_text(encoding="utf-8"))
        out["xeon"] = (xeon["ratios"], xeon["draft_ratios"], xeon["measured"])
    if XEON_LATER.exists():
        later = json.loads(XEON_LATER.read_text(encoding="utf-8"))
        out["xeon-later"] = (later["ratios"], later["draft_ratios"], later["measured"])
    if XEON_11_28.exists():
        day = json.loads(XEON_11_28.read_text(encoding="utf-8"))
        out["xeon-11-28"] = (day["ratios"], day["draft_ratios"], day["measured"])
    out["gpu"] = (gpu_ratios(), list(ASSUMED_DRAFT), "a laptop GPU, synthesized (not measured)")
    for path in sorted(RECORDED.glob("gpu-check-*.json")):  # measured by bench.gpu_check on a lent GPU
        check = json.loads(path.read_text(encoding="utf-8"))
        gpu = path.stem.removeprefix("gpu-check-").rsplit("-", 3)[0]
        engine = check.get("engine") or {}
        for backend, costs in check.get("costs", {}).items():
            if "contexts" in costs:
                # a table without a step timed in a run: plain rounds as the check's engine step took them
                same = str(engine.get("backend", "")).lower() == backend
                plain = (engine.get("modes") or {}).get("plain", {}).get("round_ms") if same else None
                ratios, draft, used = measured_table(costs, "512", plain_ms=plain)
                env = check["environment"]
                where = f"{env.get('nvidia_smi', gpu)}, {backend}, {env['date']}"
                out[f"{gpu}-{backend}"] = (ratios, draft, f"measured after {used} tokens: {where}")
    return out


def check(
    replies: Sequence[Any],
    costs: TableCosts,
    max_tokens: int,
    n_orders: int,
    remembered: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per category (and "all"): every fixed setting's speedup, the best one, auto's speedup (from
    nothing learned, or from the ``remembered`` memory of an earlier session)."""
    fixed = replay_settings(replies, costs, max_tokens)
    auto: list[Result] = [
        replay_auto(o, costs, max_tokens, model=True, remembered=remembered)
        for o in orders(replies, n_orders)
    ]
    cats = sorted({r.category for r in replies})
    out: dict[str, dict[str, Any]] = {}
    for c in [*cats, "all"]:
        pick = cats if c == "all" else [c]
        speeds = {name: speedup([res], pick) for name, res in fixed.items()}
        best = max(speeds, key=lambda n: speeds[n])
        a = speedup(auto, pick)
        worst = min(speedup([r], pick) for r in auto)
        out[c] = {"fixed": speeds, "best": best, "auto": a, "auto_worst": worst}
    return out


def exploring_cost(replies: Sequence[Any], costs: TableCosts, max_tokens: int) -> dict[str, float]:
    """What exploring the draft model costs at worst: auto mode with a draft that is never right (each
    of its tokens is rejected) against auto mode without a draft model, per category (and "all"), as
    the share of decode time lost; 0 where the costs keep the draft out of play."""
    from dataclasses import replace

    hopeless = [replace(r, draft=(-1,) * len(r.tokens)) for r in replies]
    with_draft = replay_auto(hopeless, costs, max_tokens, model=True)
    without = replay_auto(hopeless, costs, max_tokens)
    cats = sorted({r.category for r in replies})
    out = {}
    for c in [*cats, "all"]:
        pick = cats if c == "all" else [c]
        out[c] = 1.0 - speedup([with_draft], pick) / speedup([without], pick)
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.gpu_replay import SETS, load_prepared

    p = argparse.ArgumentParser(prog="python -m bench.replay_tables", description=__doc__)
    p.add_argument("--orders", type=int, default=3, help="auto mode replayed in this many orders")
    p.add_argument("--within", type=float, default=0.05, help="auto's allowed shortfall to the best fixed")
    p.add_argument(
        "--tables",
        default="",
        help="only these tables (comma-separated:"
        " epyc, xeon, xeon-later, xeon-11-28, gpu, h100-cuda, h100-vulkan, h200-cuda)",
    )
    p.add_argument("--sets", default="", help="only these recorded sets (single-turn, multi-turn, held-out)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument(
        "--remember",
        action="store_true",
        help="start auto mode from the memory a session over another set left (see EARLIER)",
    )
    args = p.parse_args(argv)
    wanted_tables = {t for t in args.tables.split(",") if t}
    wanted_sets = {s for s in args.sets.split(",") if s}
    failures = 0
    figures: dict[str, Any] = {}
    for set_name, path in SETS.items():
        if wanted_sets and set_name not in wanted_sets:
            continue
        meta, replies = load_prepared(path)
        earlier = load_prepared(SETS[EARLIER[set_name]]) if args.remember else None
        for name, (ratios, draft, where) in tables().items():
            if wanted_tables and name not in wanted_tables:
                continue
            costs = TableCosts(ratios, draft)
            remembered = None
            if earlier is not None:
                remembered = session_memory(earlier[1], costs, int(earlier[0]["max_tokens"]))
            rows = check(replies, costs, int(meta["max_tokens"]), args.orders, remembered)
            figures[f"{set_name}/{name}"] = rows
            after = f", after a session over the {EARLIER[set_name]} replies" if args.remember else ""
            print(f"\n{set_name} replies ({len(replies)}){after}, {name} costs ({where}):\n")
            print("| category | best fixed | its speedup | auto | auto / best fixed | worst order | bar |")
            print("|---|---|---|---|---|---|---|")
            for c, v in rows.items():
                best = v["fixed"][v["best"]]
                ok = v["auto"] >= (1 - args.within) * best and v["auto_worst"] >= 1.0 - 1e-9
                failures += not ok
                print(
                    f"| {c} | {v['best']} | {best:.3f}x | {v['auto']:.3f}x | {v['auto'] / best:.3f} "
                    f"| {v['auto_worst']:.3f}x | {'ok' if ok else 'MISSED'} |"
                )
            cost = exploring_cost(replies, TableCosts(ratios, draft), int(meta["max_tokens"]))
            figures[f"{set_name}/{name}"]["exploring_cost"] = cost
            worst = max(cost, key=lambda c: cost[c])
            print(
                f"\nexploring a draft that is never right costs {cost['all']:.1%} of decode time over all "
                f"(at worst {cost[worst]:.1%}, {worst})"
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")
    print(f"\n{failures} categories miss the bar" if failures else "\nevery category meets the bar")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
