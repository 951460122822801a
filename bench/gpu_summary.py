"""The GPU check's printed summary, from its JSON (:mod:`bench.gpu_check`)."""

from __future__ import annotations

import statistics
from typing import Any

SHOWN_BATCHES = (2, 4, 8, 16, 32, 64)


def _cost_lines(name: str, costs: dict[str, Any]) -> list[str]:
    if "contexts" not in costs:
        return [f"costs [{name}]: NOT MEASURED: {costs.get('error')}"]
    gpus = [d["description"] or d["name"] for d in costs.get("devices", []) if d["kind"] in ("GPU", "IGPU")]
    tl, dl = costs.get("target_load", {}), costs.get("draft_load", {})
    lines = [
        f"costs [{name}]: backend {costs.get('backend')} on {', '.join(gpus) or 'no GPU'}; "
        f"target {tl.get('offloaded')} layers offloaded "
        f"({tl.get('gpu_bytes', 0) / 2**20:.0f} MiB on the GPU), "
        f"draft {dl.get('offloaded')}; {costs.get('seconds')} s"
    ]
    for ctx, c in costs["contexts"].items():
        t, d = c["target"], c["draft"]
        b = t["batches"]
        cells = [
            f"{n}: {t['ratio'][b.index(n)]:.2f} [{t['q1'][b.index(n)]:.2f}-{t['q3'][b.index(n)]:.2f}]"
            for n in SHOWN_BATCHES
            if n in b
        ]
        run = f" ({t['run_step_ms']:.2f} ms in a run of steps)" if t.get("run_step_ms") else ""
        lines.append(
            f"  after {ctx} tokens: target step {t['step_ms']:.2f} ms{run}; verify (steps) "
            + ", ".join(cells)
        )
        cells = [f"{n}: {d['ratio'][b.index(n)]:.3f}" for n in (1, *SHOWN_BATCHES) if n in b]
        lines.append(f"    draft step {d['ms'][0]:.2f} ms; draft batches (target steps) " + ", ".join(cells))
    return lines


def _engine_lines(e: dict[str, Any]) -> list[str]:
    lines = [f"engine (target as its own draft, {e['max_tokens']} tokens, backend {e.get('backend')}):"]
    for mode, m in e["modes"].items():
        extra = ""
        if "predicted_ms" in m:
            extra = (
                f", table predicts {m['predicted_ms']:.2f} ms: the loop adds {m['overhead_ms']:+.2f} ms "
                f"({100 * m['overhead_share']:+.1f} %)"
            )
        what = "per token" if mode == "plain" else "per fully accepted round"
        lines.append(
            f"  {mode}: {', '.join(f'{x:.1f}' for x in m['tokens_per_second'])} tok/s; {m['round_ms']} ms "
            f"{what}{extra}; acceptance {m['acceptance']:.3f}; same as plain: {m['same_as_plain']}"
            + "".join(f"; parted at {p['at']} (top-two gap {p['gap']:.3f})" for p in m.get("parted", []))
        )
    ac = e.get("auto_costs")
    if ac and ac.get("ratios"):
        sizes = ", ".join(f"{b}: {r:.2f}" for b, r in ac["ratios"].items())
        lines.append(f"  auto mode's costs when the engine closed (decode steps per batch): {sizes}")
    return lines


def _replay_lines(replay: dict[str, Any]) -> list[str]:
    lines = []
    for name, r in replay.items():
        if "error" in r:
            lines.append(f"replay [{name}, table: {r['table']}]: FAILED: {r['error']}")
            continue
        lines.append(
            f"replay [{name}, {r['replies']} replies, table: {r['table']}]: speedup over plain, all:"
        )
        lines.append("  " + "; ".join(f"{mode} {row['all']:.3f}x" for mode, row in r["speedup"].items()))
    return lines


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What a reader wants first: where it ran, the table, the loop, losslessness, the replay."""
    env = result.get("environment", {})
    lines = [
        f"Tandem GPU check, {env.get('date')}{' (dry run)' if result.get('dry_run') else ''}: "
        f"GPU {env.get('nvidia_smi')}; llama-cpp-python {env.get('llama_cpp_python')}; "
        f"{result.get('total_seconds')} s"
    ]
    m = result.get("models")
    if m:
        lines.append(
            f"models ({m['shapes']} shapes): target {m['target']['bytes'] / 2**30:.2f} GiB "
            f"in {m['target']['seconds']} s, draft {m['draft']['bytes'] / 2**30:.2f} GiB "
            f"in {m['draft']['seconds']} s"
        )
    for name, costs in (result.get("costs") or {}).items():
        lines += _cost_lines(name, costs)
    if "engine" in result:
        lines += _engine_lines(result["engine"])
    if "explore" in result:
        x = result["explore"]
        tps = {m: ", ".join(f"{v:.1f}" for v in vs) for m, vs in x["tokens_per_second"].items()}
        by = x["auto_rounds"].items()
        rounds = ", ".join(f"{n} {r['rounds']} ({r['accepted']} accepted)" for n, r in by)
        lines.append(
            f"explore (auto with a draft that is never right, {x['max_tokens']} tokens): plain {tps['plain']}"
            f" tok/s, auto {tps['auto']}; auto / plain {x['auto_over_plain_median']:.3f} (median); auto's"
            f" rounds: {rounds}; same as plain: {x['same_as_plain']}"
        )
        if "plain_over_serial" in x:
            med = statistics.median
            lines.append(
                f"explore, queued rounds: plain {med(x['plain_over_serial']):.3f}x and auto"
                f" {med(x['auto_over_serial']):.3f}x of the same mode serial (medians); serial, auto / plain"
                f" {med(x['auto_serial_over_plain_serial']):.3f}; rounds, queued, wasted per run:"
                f" {x['rounds_queued_wasted']}"
            )
    if "acceptance" in result:
        lines += _acceptance_lines(result["acceptance"])
    if "replay" in result:
        lines += _replay_lines(result["replay"])
    if "lossless" in result:
        lo = result["lossless"]
        t = lo["total"]
        lines.append(
            f"lossless: {t['runs']} runs, {t['equal']} equal to plain, {t['ties']} part at a numerical tie, "
            f"{t['failures']} failures; errors: {', '.join(lo['errors']) or 'none'}"
        )
        for name, pair in lo["pairs"].items():
            if "error" in pair:
                lines.append(f"  {name}: ERROR {pair['error']}")
            else:
                lines.append(
                    f"  {name}: {pair['equal']}/{pair['runs']} equal, {pair['ties']} ties, "
                    f"{pair['failures']} failures, offloaded {pair['offloaded']}"
                )
    if result.get("skipped"):
        lines.append(f"skipped (past the deadline): {', '.join(result['skipped'])}")
    for step, err in (result.get("errors") or {}).items():
        lines.append(f"{step}: FAILED: {err}")
    return lines


def _acceptance_lines(a: dict[str, Any]) -> list[str]:
    """Per acceptance: the best fixed setting over plain, auto over plain and over the best (medians
    and ranges over the repeats), what speculative decoding accepted, whether every mode wrote
    plain's tokens, and per repeat the rounds auto drafted (probes among them) and the rounds it
    queued and wasted."""
    head = f"acceptance (auto against the fixed settings live, {a['max_tokens']} tokens,"
    head += f" {a['repeats']} repeats):"
    lines = [head]

    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"

    for q, x in a.items():
        if isinstance(x, dict):
            lines.append(
                f"  draft right {float(q):.0%} per token (spec1 accepted {x['spec1_acceptance']}): best fixed"
                f" {x['best_fixed']} {x['best_over_plain']:.3f}x plain; auto {spread(x['auto_over_plain'])}x"
                f" plain, {spread(x['auto_over_best'])} of the best; same as plain: {x['same_as_plain']}"
            )
            rounds = [f"{r[0]}/{r[1]}" for r in x["rounds_drafted"]["auto"]]
            line = f"    auto per repeat: rounds drafted {', '.join(rounds)}"
            if "queued_wasted" in x:
                line += f"; queued, wasted {', '.join(f'{q}/{w}' for q, w in x['queued_wasted']['auto'])}"
            probes = [sum(r[0] == "PROBE" for r in rows) for rows in (x.get("trace") or {}).get("auto", [])]
            if probes:
                line += f"; probes {', '.join(map(str, probes))}"
            learned = x.get("auto_learned") or {}
            if learned.get("probes"):
                paid, tried = learned["probes"]
                loss = learned.get("probe_loss")
                line += f"; probes that found drafting paying {paid:g} of {tried:g}"
                line += f", a probe's price {loss * 1e3:.1f} ms" if loss is not None else ""
            if learned.get("overrun") is not None:
                line += f", model rounds' overrun {learned['overrun']:.2f}"
            if learned.get("overrun_low") is not None:
                line += f" ({learned['overrun_low']:.2f} at least over the lowest costs)"
            lines.append(line)
    return lines
