"""The GPU check's acceptance step replayed here, with that GPU's costs and what switching adds.

The acceptance step (``bench.gpu_engine.run_acceptance``) holds auto mode to the fixed settings live,
on a walk pair (``bench.gpu_models.write_walk_models``) whose draft is right about the next token a
chosen share of the time. Its replies are known here without the models: the target writes the walk
(:func:`bench.gpu_models.walk_next`) on from the prompt's last token, and the draft for share ``q``
is right where that pair's draw says. So auto mode's policy can be replayed on the same replies, in
the same order (one engine per pair, its repeats one after another), and set beside what was
measured live, with spec1 as the check on the charges::

    python -m bench.replay_walk bench/recorded/gpu-acceptance-2026-11-27.json

A plain round is the unit (plain decoding queues every token). Each round is charged the batches
that GPU's check timed alone (``gpu-check-*.json``: the target's and the draft's), and what the
traced H200 runs of 2026-11-27 show a live GPU adds when a reply switches between plain and drafted
rounds (:class:`LiveCosts`):

- a round that drafts after a queued plain round waits for the step it queued and discards it
  (``WASTED``, one step), and took ``COLD`` steps more than its batches alone (another batch size's
  kernels and graphs; ``COLD_BATCH`` of it in the target's batch, which auto mode times);
- a plain round after a drafted one is not queued, and took ``RESTART`` steps more on average (0 or
  about 1: the graphs for a single token rebuilt);
- each of auto mode's plain rounds costs ``OVERHEAD`` more than plain decoding's where it reads the
  target's confidence (the rows are read before the next step is queued: 2-3 % on the H200), and
  ``UNREAD`` more where it does not (its planning, hidden behind the queued step: 0.4 %).

Auto mode starts from the costs the engine held after loading the pair where the record has them
(``loaded_costs``), else from the check's table as the load's warm-up would time it, and learns from
what it is charged. The replay shows how far these charges are to be trusted on a GPU, and what a
change to auto mode would do there before a GPU is at hand to measure it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.replay import STEP, ReplayDraft, Reply, TableCosts, _replay, replay_fixed
from bench.replay_report import speedup

RECORDED = Path(__file__).with_name("recorded")
WASTED = 1.0  # steps: the queued step a drafting round discards
# steps: what a model round after plain rounds took beyond its batches timed alone (mean), and the part
# of it in the target's batch (auto mode learned a batch of 2 at 1.45-1.62 steps live, 1.11 alone)
COLD = 1.1
COLD_BATCH = 0.45
RESTART = 0.6  # steps: what a plain round after a drafted one took beyond a queued one (mean)
# auto mode's plain rounds against plain decoding's, reading the target's confidence (H200, 2026-11-27)
# and not (in process, 2026-11-28: 0.996x of plain, five interleaved repeats)
OVERHEAD = 0.03
UNREAD = 0.004


class LiveCosts(TableCosts):
    """A GPU's batches timed alone, and what switching between plain and drafted rounds adds live
    (see the module)."""

    def __init__(
        self,
        ratios: Sequence[float],
        draft: Sequence[float],
        *,
        overhead: float = OVERHEAD,
        wasted: float = WASTED,
        cold: float = COLD,
        restart: float = RESTART,
    ):
        super().__init__(ratios, draft)
        self.overhead, self.wasted, self.cold, self.restart = overhead, wasted, cold, restart
        self.reads: Callable[[], bool] = lambda: True  # whether auto mode reads the target's confidence

    def switch(self, drafted_last: bool | None, drafts: bool) -> tuple[float, float]:
        if drafts:
            if drafted_last is False:
                in_batch = min(COLD_BATCH, self.cold)
                return in_batch, self.wasted + self.cold - in_batch
            return 0.0, 0.0
        if drafted_last:
            return 0.0, self.restart
        return 0.0, self.overhead if self.reads() else UNREAD


def walk_reply(q: float, shapes: str = "real", max_tokens: int = 256) -> Reply:
    """The acceptance step's reply for the draft right a share ``q`` of the time."""
    import numpy as np

    from bench.gpu_models import SHAPES, walk_next

    n_vocab = SHAPES[shapes][0]["n_vocab"]
    nxt = walk_next(n_vocab)
    right = np.random.default_rng([13, int(q * 1000)]).random(n_vocab) < q
    rng = random.Random(3)
    prompt = [rng.randrange(3, 500) for _ in range(200)]
    tokens, t = [], prompt[-1]
    for _ in range(max_tokens):
        t = int(nxt[t])
        tokens.append(t)
    before = [prompt[-1], *tokens[:-1]]
    draft = tuple(int(nxt[b]) if right[b] else int(nxt[nxt[b]]) for b in before)
    return Reply(
        f"walk-{round(q * 100)}", "walk", prompt, tokens, [1.0] * max_tokens, draft, (1.0,) * max_tokens
    )


def loaded_costs(table: TableCosts, saved: dict[str, Any] | None = None) -> Any:
    """Auto mode's cost model as the engine seeds it at load (``app.engine.loading.warm_up``), then
    to learn from the rounds it is charged: ``saved``, the costs the acceptance step read from the
    engine after loading the pair (``loaded_costs``), or else each warm-up batch at ``table``'s cost
    (the GPU check times batches alone too), three times up to 9 tokens, and the draft's step twice."""
    from app.engine.auto.costs import MeasuredCosts
    from app.engine.loading import WARM_UP_BATCHES

    costs = MeasuredCosts()
    for _ in range(3):
        costs.observe_verify(1, table.verify(1))
    if saved:
        costs.restore(saved, weight=3)
        return costs
    for b in WARM_UP_BATCHES[1:]:
        for _ in range(3 if b <= 9 else 1):
            costs.observe_verify(b, table.verify(b))
    for _ in range(2):
        costs.observe_draft(1, STEP * table.draft_batch(1))
    return costs


def replay_pair(
    reply: Reply, costs: TableCosts, repeats: int, max_tokens: int, loaded: Any = None
) -> list[dict[str, Any]]:
    """Auto mode on ``reply`` ``repeats`` times with one engine, charged ``costs``: per repeat its
    speedup over plain and its rounds by decision. Auto mode starts from the ``loaded`` cost model
    (:func:`loaded_costs`; None: it knows ``costs`` from the start)."""
    from app.engine.auto import AutoDrafter
    from app.engine.drafting import LookupDrafter
    from app.engine.sampling import SamplingParams

    draft = ReplayDraft(costs)
    auto = AutoDrafter(draft, LookupDrafter(), costs=loaded or costs)
    if isinstance(costs, LiveCosts):
        costs.reads = lambda: auto.wants_target_confidence > 0
    params = SamplingParams()
    counts: Counter[str] = Counter()

    def begin(r: Reply) -> None:  # the draft's prompt not charged: the live step times decoding only
        draft.start(r)
        auto.begin(r.prompt)

    def propose(tokens: list[int], room: int) -> Any:
        prop = auto.propose(tokens, room, params, None)
        if prop.tokens and prop.decision is not None:
            counts[prop.decision.action.name.lower()] += 1
        return prop

    out = []
    for _ in range(repeats):
        counts.clear()
        result, _ = _replay([reply], costs, max_tokens, begin, propose, auto.observe)
        out.append({"auto": round(speedup([result], ["walk"]), 4), "rounds": dict(counts)})
    state = getattr(auto.costs, "state", None)
    if state is not None:  # what it learned, to set beside what the live engine saved
        out[-1]["costs"] = state()
    return out


def check_table(record: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The target's and the draft's batches timed alone by the GPU check of the same GPU."""
    from bench.gpu_check import measured_table

    smi = record["environment"].get("nvidia_smi", "")
    for path in sorted(RECORDED.glob("gpu-check-*.json")):
        gpu = path.stem.removeprefix("gpu-check-").rsplit("-", 3)[0]
        if gpu.lower() in smi.lower():
            check = json.loads(path.read_text(encoding="utf-8"))
            # in the steps timed between batches: the switching charges were fitted on these
            ratios, draft, _ = measured_table(check["costs"]["cuda"], "512", in_run=False)
            return ratios, draft
    raise ValueError(f"no recorded GPU check for {smi!r}")


def replay_record(record: dict[str, Any], **live: float) -> dict[str, dict[str, Any]]:
    """Each pair of a recorded acceptance step: live and replayed, spec1 and auto over plain."""
    acc = record["acceptance"]
    alone = check_table(record)
    out: dict[str, dict[str, Any]] = {}
    for q, pair in acc.items():
        if not isinstance(pair, dict) or "tokens_per_second" not in pair:
            continue
        costs = LiveCosts(*alone, **live)
        loaded = loaded_costs(TableCosts(*alone), pair.get("loaded_costs"))
        reply = walk_reply(float(q), max_tokens=acc["max_tokens"])
        tps = pair["tokens_per_second"]
        plain = sorted(tps["plain"])[len(tps["plain"]) // 2]
        spec1 = replay_fixed([reply], costs, 1, acc["max_tokens"])[0]
        out[q] = {
            "live": {
                "spec1": [round(x / plain, 3) for x in tps.get("spec1", [])],
                "costs": pair.get("auto_costs"),
                "auto": pair["auto_over_plain"],
                "auto_drafted": [r[0] for r in pair["rounds_drafted"]["auto"]],
            },
            "replayed": {
                "spec1": round(speedup([spec1], ["walk"]), 3),
                "auto": replay_pair(reply, costs, acc["repeats"], acc["max_tokens"], loaded),
            },
        }
    return out


def report(name: str, result: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"## {name}",
        "",
        "| draft right | spec1 live | replayed | auto live | replayed | rounds drafted live"
        " | replayed (probes) | batch of 2, draft step at the end: live | replayed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q, r in result.items():
        live, rep = r["live"], r["replayed"]
        auto = ", ".join(f"{x:.3f}" for x in live["auto"])
        again = ", ".join(f"{x['auto']:.3f}" for x in rep["auto"])
        drafted = ", ".join(str(x) for x in live["auto_drafted"])
        rounds = ", ".join(
            f"{sum(x['rounds'].values())} ({x['rounds'].get('probe', 0)})" for x in rep["auto"]
        )
        spec1 = ", ".join(f"{x:.3f}" for x in live["spec1"])
        ends = [_ends(live["costs"]), _ends(rep["auto"][-1].get("costs"))]
        lines.append(
            f"| {float(q):.0%} | {spec1} | {rep['spec1']:.3f} | {auto} | {again} | {drafted} | {rounds}"
            f" | {ends[0]} | {ends[1]} |"
        )
    return "\n".join(lines)


def _ends(costs: dict[str, Any] | None) -> str:
    if not costs:
        return "-"
    two, draft = costs.get("ratios", {}).get("2"), costs.get("draft")
    return f"{two or 0:.2f}, {draft or 0:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay_walk", description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path, nargs="?", default=RECORDED / "gpu-acceptance-2026-11-27.json")
    ap.add_argument("--run", action="append", help="which run of the record (default: every traced one)")
    ap.add_argument("--overhead", type=float, default=OVERHEAD)
    ap.add_argument("--restart", type=float, default=RESTART)
    ap.add_argument("--wasted", type=float, default=WASTED)
    ap.add_argument("--cold", type=float, default=COLD)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    data = json.loads(args.record.read_text(encoding="utf-8"))
    runs = data if "acceptance" not in data else {args.record.stem: data}
    out = {}
    for name, record in runs.items():
        if (args.run and name not in args.run) or not (record.get("acceptance") or {}):
            continue
        out[name] = replay_record(
            record, overhead=args.overhead, restart=args.restart, wasted=args.wasted, cold=args.cold
        )
        print(report(name, out[name]) + "\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
