"""Recorded drafts replayed with another machine's cost table, without the models that wrote them.

``bench.replay`` needs the target and the draft at hand: it runs both over every recorded reply for
the target's confidence in each token and the draft's greedy predictions. A GPU machine of this
workplace has no network and cannot take a 1.1 GB model, so those passes are made once here and kept
with the replies (``prepare``); the GPU check then replays them with the cost table it measured. The
replies are Qwen2.5-Coder 1.5B's, drafted by its 0.5B; on a 7B target the text and the acceptance
would differ somewhat: the figure is what *these* drafts would give at a 7B's costs on that GPU::

    python -m bench.gpu_replay prepare bench/recorded/xeon-qwen-coder-1.5b-0.5b.json \\
        --target T.gguf --draft D.gguf --out bench/recorded/single-turn.replies.json.gz

A prepared file also keeps a cost table (``recorded``; by default the EPYC table of docs/benchmarks.md,
since one measured on a busy shared machine is noise), which a dry run of the GPU check replays with.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.replay import Reply, TableCosts

RECORDED = Path(__file__).with_name("recorded")
SETS = {
    "single-turn": RECORDED / "single-turn.replies.json.gz",
    "multi-turn": RECORDED / "multi-turn.replies.json.gz",
    # bench/prompts-held-out.jsonl: three prompts per category, never used to tune auto mode
    "held-out": RECORDED / "held-out.replies.json.gz",
}


def prepare(
    run: Path,
    target: str,
    draft: str,
    prompts: Path | None,
    out: Path,
    table: tuple[list[float], list[float], str] | None = None,
) -> dict[str, Any]:
    """The run's plain replies made ready (:func:`bench.replay_load.load_replies`), written to ``out``,
    with ``table`` (verify ratios, draft ratios, where they were measured) as the recorded cost table,
    or else the one measured now (on a busy machine, noise)."""
    from bench.replay_load import load_replies
    from bench.run import machine

    data = json.loads(run.read_text(encoding="utf-8"))
    settings = data["settings"]
    prompts = prompts or Path(__file__).with_name("prompts.jsonl")
    replies, ratios, draft_ratios = load_replies(data, target, prompts, draft)
    meta = {
        "source": run.name,
        "multi_turn": any("conversation" in r for r in data["runs"]),
        "prepared": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "target": Path(target).name,
        "draft": Path(draft).name,
        "max_tokens": int(settings.get("max_tokens", 96)),
        "recorded": (
            {"ratios": table[0], "draft_ratios": table[1], "measured": table[2]}
            if table
            else {
                "ratios": ratios,
                "draft_ratios": draft_ratios,
                "measured": "where the replies were prepared",
            }
        ),
        "stops": sorted(replies[0].stops) if replies else [],
    }
    rows = [
        {
            "id": r.id,
            "category": r.category,
            "prompt": r.prompt,
            "tokens": r.tokens,
            "confidence": [round(c, 4) for c in r.confidence],
            "draft": list(r.draft),
            "draft_confidence": [round(c, 4) for c in r.draft_confidence],
        }
        for r in replies
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        json.dump({**meta, "replies": rows}, fh, separators=(",", ":"))
    return meta


# The AMD EPYC 2-core VM's costs as the engine measured them at load (docs/benchmarks.md, 2026-11-23;
# Qwen2.5-Coder 1.5B + 0.5B Q4_K_M): the middle of each measured range, sizes between interpolated.
EPYC_TABLE = (
    [1.0, 1.73, 2.24, 2.915, 3.44, 3.965, 4.42, 4.875, 5.18, 5.49, 5.8, 6.105, 6.03, 5.955, 5.88, 5.805],
    [0.55, 1.125, 1.285, 1.38, 1.62, 1.86, 1.96, 2.06, 2.148, 2.235, 2.323, 2.41, 2.541, 2.673, 2.804, 2.935],
    "AMD EPYC 2-core VM, 2026-11-23 (docs/benchmarks.md)",
)


def load_prepared(path: Path, limit: int = 0) -> tuple[dict[str, Any], list[Reply]]:
    """A prepared file's facts and its replies (the first ``limit`` when given)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    stops = frozenset(data.pop("stops", []))
    rows = data.pop("replies")[: limit or None]
    replies = [
        Reply(
            r["id"],
            r["category"],
            r["prompt"],
            r["tokens"],
            r["confidence"],
            tuple(r["draft"]),
            tuple(r["draft_confidence"]),
            stops,
        )
        for r in rows
    ]
    return data, replies


def replay_set(
    meta: dict[str, Any],
    replies: list[Reply],
    ratios: list[float],
    draft_ratios: list[float] | None,
    *,
    orders: int = 1,
) -> dict[str, dict[str, float]]:
    """Modeled speedup over plain decoding per policy and category (and "all"), as ``bench.replay``
    prints it: auto mode with prompt lookup only and with the draft model, fixed drafting of 3 and 5,
    the all-knowing lookup bound, and for a multi-turn set auto mode with the drafting history, pass
    by pass."""
    from bench import replay as rp
    from bench.replay_report import Table, speedup

    costs = rp.TableCosts(ratios, draft_ratios)
    max_tokens = int(meta.get("max_tokens", 96))
    rows: Table = {"auto (lookup)": [], "auto": [], "spec3": [], "spec5": []}
    for order in rp.orders(replies, orders):
        rows["auto (lookup)"].append(rp.replay_auto(order, costs, max_tokens))
        if draft_ratios:
            rows["auto"].append(rp.replay_auto(order, costs, max_tokens, model=True))
            for k in (3, 5):
                rows[f"spec{k}"].append(rp.replay_fixed(order, costs, k, max_tokens)[0])
    if meta.get("multi_turn"):
        from bench.replay_history import replay_history

        passes = replay_history(replies, costs, max_tokens, model=bool(draft_ratios))
        for p, (result, _) in enumerate(passes, 1):
            rows[f"auto-history (pass {p})"] = [result]
    rows["lookup bound"] = [rp.replay_bound(replies, costs)]
    cats = sorted({r.category for r in replies})
    return {
        name: {c: round(speedup(rs, cats if c == "all" else [c]), 4) for c in [*cats, "all"]}
        for name, rs in rows.items()
        if rs
    }


def table_text(result: dict[str, dict[str, float]]) -> str:
    """Markdown: categories as rows, policies as columns."""
    names = list(result)
    cats = list(next(iter(result.values()))) if result else []
    lines = ["| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in cats:
        lines.append(f"| {c} | " + " | ".join(f"{result[n][c]:.3f}x" for n in names) + " |")
    return "\n".join(lines)


def check_table(ratios: list[float], draft_ratios: list[float] | None) -> None:
    TableCosts(ratios, draft_ratios)  # raises on a table that does not start at 1.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_replay", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="make a recorded run's replies ready to replay without models")
    prep.add_argument("run", type=Path, help="a tandem bench or bench.multiturn JSON with plain replies")
    prep.add_argument("--target", required=True)
    prep.add_argument("--draft", required=True)
    prep.add_argument("--prompts", type=Path, help="the prompts JSONL (single-turn runs)")
    prep.add_argument("--out", type=Path, required=True)
    prep.add_argument(
        "--measured-table",
        action="store_true",
        help="keep the cost table measured now as the recorded one (default: the EPYC table of the docs)",
    )
    args = p.parse_args(argv)
    table = None if args.measured_table else EPYC_TABLE
    meta = prepare(args.run, args.target, args.draft, args.prompts, args.out, table)
    print(f"{args.out}: {args.out.stat().st_size / 1024:.0f} KiB; recorded table {meta['recorded']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
