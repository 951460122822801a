"""Replay auto mode's prompt-lookup policy on recorded replies: free of noise, in about a minute.

A benchmark run on a shared 2-core machine moves by 5-20 % per category between runs, so a change to
auto mode's lookup policy worth 3 % cannot be seen in one. This replays the policy on the plain
replies a ``tandem bench`` run recorded, teacher-forced: each round the policy plans a draft for the
recorded text so far, the draft is checked against the recorded reply, and the round is charged the
verify cost of its batch from a fixed table (relative to one decode step). The target's confidence in
each token, which the policy reads, comes from one batched pass over each reply::

    python -m bench.replay bench/results/a.json

Prints the modeled speedup per category of auto mode's lookup policy and of an all-knowing one (the
lookup bound), and the cost table used: the run's own (``tandem bench`` records the verify costs its
engine measured), or ``--ratios``.
The draft model is not replayed (its drafts need its outputs; on this CPU auto mode drafts with it
in about 1 % of rounds). The replies are fixed, so a policy that would change the text (at a
numerical tie) is judged on plain decoding's text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP = 0.1  # seconds charged for one decode step (the policy reads seconds; only ratios matter)


class TableCosts:
    """A fixed cost model: batch b costs ``ratios[b - 1]`` steps (past the table, its last slope)."""

    def __init__(self, ratios: Sequence[float]):
        if not ratios or ratios[0] != 1.0:
            raise ValueError("the table starts with a batch of 1, which costs 1.0")
        self.ratios = list(ratios)

    def ratio(self, batch: int) -> float:
        r = self.ratios
        if batch <= len(r):
            return r[max(batch, 1) - 1]
        slope = (r[-1] - 1.0) / (len(r) - 1) if len(r) > 1 else 0.35
        return r[-1] + slope * (batch - len(r))

    def verify(self, batch: int) -> float:
        return STEP * self.ratio(batch)

    def draft_step(self) -> float | None:
        return None

    def observe_verify(self, batch: int, seconds: float) -> None:
        pass

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        pass


@dataclass(frozen=True)
class Reply:
    id: str
    category: str
    prompt: list[int]
    tokens: list[int]
    confidence: list[float]  # the target's top-token probability where it chose each token


def replay_auto(replies: Sequence[Reply], costs: TableCosts, max_tokens: int) -> dict[str, tuple[int, float]]:
    """category -> (tokens, cost in steps) of auto mode's lookup policy, replies in order (the policy
    learns across them, as in a benchmark run)."""
    from app.engine.auto import CONFIDENCE_WINDOW, AutoDrafter, Outcome
    from app.engine.drafters import EMPTY, LookupDrafter
    from app.engine.sampling import SamplingParams

    auto = AutoDrafter(None, LookupDrafter(), costs=costs)
    params = SamplingParams()
    out: dict[str, tuple[int, float]] = {}
    for r in replies:
        auto.begin(r.prompt)
        pos, cost = 0, 0.0
        while pos < len(r.tokens):
            room = max_tokens - pos - 1
            prop = auto.propose([*r.prompt, *r.tokens[:pos]], room, params, None) if room > 0 else EMPTY  # type: ignore[arg-type]
            a = accepted(prop.tokens, r.tokens, pos)
            batch = 1 + len(prop.tokens)
            seconds = costs.verify(batch)
            new = a + 1
            sure = tuple(r.confidence[max(pos, pos + new - CONFIDENCE_WINDOW) : pos + new])
            source = prop.source if prop.tokens else "none"
            auto.observe(prop, Outcome(source, len(prop.tokens), a, batch, seconds, seconds, sure))
            cost += seconds / STEP
            pos += new
        n, c = out.get(r.category, (0, 0.0))
        out[r.category] = (n + len(r.tokens), c + cost)
    return out


def replay_bound(replies: Sequence[Reply], costs: TableCosts) -> dict[str, tuple[int, float]]:
    """The same for the all-knowing lookup policy (``bench.run.lookup_bound``)."""
    from bench.run import lookup_bound

    out: dict[str, tuple[int, float]] = {}
    for r in replies:
        n, c = lookup_bound(r.prompt, r.tokens, costs.ratio)
        n0, c0 = out.get(r.category, (0, 0.0))
        out[r.category] = (n0 + n, c0 + c)
    return out


def accepted(draft: Sequence[int], reply: Sequence[int], pos: int) -> int:
    """How many draft tokens the target accepts at ``pos`` (it adds one of its own after them)."""
    a = 0
    while a < min(len(draft), len(reply) - pos - 1) and draft[a] == reply[pos + a]:
        a += 1
    return a


def load_replies(data: dict[str, Any], target: str, prompts: Path) -> tuple[list[Reply], list[float]]:
    """The run's plain replies with the target's confidences, and the target's verify cost ratios for
    batches of 1-16 as its warm-up measures them on this machine now."""
    from app.engine import sampling
    from app.engine.engine import Engine, LoadSettings
    from app.engine.llama import Context
    from bench.run import load_prompts

    text = {row["id"]: row["prompt"] for row in load_prompts(prompts)}
    replies = []
    with Engine(LoadSettings(target, None, n_ctx=512)) as engine:
        ratios = [round(engine.costs.ratio(b), 3) for b in range(1, 17)]
        for run in data["runs"]:
            if run["mode"] != "plain" or run["id"] not in text:
                continue
            ids = engine.chat_prompt([{"role": "user", "content": text[run["id"]]}])
            tokens = list(run["tokens"])
            n = len(ids) + len(tokens)
            ctx = Context(engine.target, n_ctx=n + 8, n_batch=n + 8)
            try:
                ctx.decode([*ids, *tokens], 0, logits="all")
                conf = [sampling.top_probability(ctx.logits(len(ids) - 1 + i)) for i in range(len(tokens))]
            finally:
                ctx.close()
            replies.append(Reply(run["id"], run["category"], ids, tokens, conf))
    return replies, ratios


def table(rows: dict[str, dict[str, tuple[int, float]]]) -> str:
    """Markdown: modeled speedup (tokens / cost in steps) per category for each policy."""
    names = list(rows)
    cats = sorted({c for r in rows.values() for c in r})
    lines = ["| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def speedup(r: dict[str, tuple[int, float]], cats: Sequence[str]) -> str:
        n = sum(r[c][0] for c in cats if c in r)
        cost = sum(r[c][1] for c in cats if c in r)
        return f"{n / cost:.3f}x" if cost else "-"

    for c in [*cats, "all"]:
        pick: Callable[[dict[str, tuple[int, float]]], str] = (
            (lambda r: speedup(r, cats)) if c == "all" else (lambda r, c=c: speedup(r, [c]))
        )
        lines.append(f"| {c} | " + " | ".join(pick(rows[name]) for name in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    p.add_argument("results", type=Path, help="a JSON file written by tandem bench (with a plain mode)")
    p.add_argument("--target", help="the target GGUF (default: the run's)")
    p.add_argument("--prompts", type=Path, help="the prompts JSONL (default: the run's)")
    p.add_argument(
        "--ratios",
        help="verify cost of batches 1, 2, 3, ... in decode steps, comma-separated "
        "(default: the run's, if it recorded them; else measured by loading the target now)",
    )
    args = p.parse_args(argv)
    try:
        data = json.loads(args.results.read_text(encoding="utf-8"))
        settings = data["settings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read benchmark results {args.results}: {e}") from None
    target = args.target or settings["target"]
    prompts = args.prompts or Path(settings["prompts"])
    replies, measured = load_replies(data, target, prompts)
    if not replies:
        raise SystemExit(f"{args.results} has no plain replies to replay")
    recorded = settings.get("verify_ratios")  # what the run's engine had measured when it ended
    ratios = [float(x) for x in args.ratios.split(",")] if args.ratios else recorded or measured
    costs = TableCosts(ratios)
    rows = {
        "auto (lookup)": replay_auto(replies, costs, int(settings.get("max_tokens", 96))),
        "lookup bound": replay_bound(replies, costs),
    }
    print(
        f"Replay of {len(replies)} plain replies from {args.results.name}; modeled speedup against plain.\n"
    )
    print(table(rows))
    print(f"\nverify costs (steps, batches 1-{len(ratios)}): --ratios {','.join(f'{r:g}' for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
