"""What ``tandem models fit`` prints: the machine, every catalog pair's fit and expected speed, and the
recommendation, as text lines or as JSON-ready data."""

from __future__ import annotations

from typing import Any

from .fit import Choice, Gpu, Machine, why
from .units import format_bytes

__all__ = ["machine_data", "params_text", "report_data", "report_lines", "speed_text"]

GB = 1e9


def machine_data(machine: Machine) -> dict[str, Any]:
    """The machine as JSON-ready data (bandwidths in bytes/s)."""
    return {
        "total_ram": machine.total_ram,
        "available_ram": machine.available_ram,
        "physical_cores": machine.physical_cores,
        "cpu": machine.cpu,
        "cpu_bandwidth": machine.ram_bandwidth,
        "bandwidth_measured": machine.bandwidth_source != "assumed",
        "bandwidth_source": machine.bandwidth_source,
        "gpus_from": machine.gpu_source,
        "gpus": [_gpu_data(g, machine.ram_bandwidth) for g in machine.gpus],
    }


def _gpu_data(g: Gpu, cpu_bandwidth: float) -> dict[str, Any]:
    return {
        "name": g.name, "kind": g.kind, "total": g.total, "free": g.free, "unified": g.unified,
        "bandwidth": g.peak_bandwidth(cpu_bandwidth), "bandwidth_from_table": g.bandwidth is None,
    }  # fmt: skip


def report_data(
    machine: Machine, choices: list[Choice], best: Choice | None, *, n_ctx: int, min_speed: float
) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    pairs = []
    for c in choices:
        f, s = c.fit, c.speed
        pairs.append({
            "id": c.pair.id, "target": c.pair.target, "draft": c.pair.draft, "target_params": c.params,
            "target_active_params": c.active_params or c.params, "target_moe": c.moe,
            "verdict": f.verdict, "summary": f.summary, "comfortable": f.comfortable,
            "need_bytes": f.need.total, "target_gpu_layers": f.gpu_layers,
            "plain_tokens_per_second": round(s.plain, 2),
            "plain_measured": s.plain_source == "measured",
            "speculative_tokens_per_second": round(s.speculative, 2),
            "speculative_measured": s.speculative_source == "measured",
            "draft_length": s.draft_length, "acceptance": s.acceptance,
            "expected_tokens_per_second": round(s.best, 2),
            "recommended": best is not None and c.pair.id == best.pair.id,
        })  # fmt: skip
    recommended = None
    if best is not None:
        recommended = {
            "pair": best.pair.id, "expected_tokens_per_second": round(best.speed.best, 2),
            "measured": best.speed.source == "measured", "why": why(best, min_speed),
        }  # fmt: skip
    return {
        "machine": machine_data(machine), "context": n_ctx, "min_speed": min_speed,
        "recommended": recommended, "pairs": pairs,
    }  # fmt: skip


def params_text(n: int) -> str:
    """``3.3B``, ``600M``."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def speed_text(tps: float, source: str) -> str:
    """``~12.3`` (estimated) or ``12.3`` (measured) tokens/s."""
    return ("" if source == "measured" else "~") + f"{tps:.1f}"


def report_lines(
    machine: Machine, choices: list[Choice], best: Choice | None, *, n_ctx: int, min_speed: float
) -> list[str]:
    """The report as text lines."""
    gpus = ", ".join(
        f"{g.name} ({format_bytes(g.total)}{' unified' if g.unified else ''}, "
        f"{g.peak_bandwidth(machine.ram_bandwidth) / GB:.0f} GB/s)"
        for g in machine.gpus
    )
    where = {"engine": " (the engine's devices)", "guessed": " (guessed: the engine did not answer)"}
    bw = machine.ram_bandwidth / GB
    sources = {"measured": "measured now", "cached": "measured before"}
    bw_from = sources.get(machine.bandwidth_source, "assumed")
    ram, available = format_bytes(machine.total_ram), format_bytes(machine.available_ram)
    cpu = f" ({machine.cpu})" if machine.cpu else ""
    gpu_from = where.get(machine.gpu_source, "")
    lines = [
        f"machine: {ram} RAM ({available} available), {machine.physical_cores} cores{cpu}, "
        f"memory bandwidth {bw:.1f} GB/s ({bw_from}), GPU: {gpus or 'none'}{gpu_from}",
        f"context: {n_ctx} tokens; usable from {min_speed:g} tokens/s",
        "",
        f"  {'pair':<26} {'needs':>9}  {'tokens/s: plain':>15} {'with draft':>10}  fit",
    ]
    for c in choices:
        f, s = c.fit, c.speed
        mark = "*" if best is not None and c.pair.id == best.pair.id else " "
        comfy = "" if f.comfortable or f.verdict == "none" else " (tight)"
        plain = speed_text(s.plain, s.plain_source)
        spec = speed_text(s.speculative, s.speculative_source)
        lines.append(f"{mark} {c.pair.id:<26} {format_bytes(f.need.total):>9}  {plain:>15} {spec:>10}  "
                     f"{f.summary}{comfy}")  # fmt: skip
        if c.moe:
            active, total = params_text(c.active_params), params_text(c.params)
            lines.append(f"    {c.pair.target}: mixture of experts, {active} of {total} parameters "
                         "active per token (estimated by those)")  # fmt: skip
    lines += ["", "~ estimated from the memory bandwidth; figures without ~ were measured (tandem generate)"]
    if best is None:
        lines.append("no catalog pair fits this machine at this context size")
    else:
        lines.append(f"recommended: {best.pair.id} -- {best.fit.summary}, about {best.speed.best:.0f} "
                     f"tokens/s ({why(best, min_speed)})")  # fmt: skip
    return lines
