"""The engine end to end on the GPU, as the app runs it (:class:`EngineClient`: the engine process), with
the target as its own draft: every draft is the target's own greedy text, so every round that drafts
k tokens should accept all k (a rejection is a numerical tie between batched and one-token evaluation).

A round then costs what the cost table says it should (the draft catches up with 2 tokens, drafts k-1
more one at a time, and the target verifies k+1), plus what Tandem's loop adds: Python between the
evaluations, the draft's and target's logits read back (each read waits for the GPU), the IPC of each
``Step`` to the client. Measured per round as the time between the starts of consecutive rounds (the
``Step.began`` clock), beside the table's prediction; plain decoding likewise per token.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.gpu_costs import NotOnGPU, gpu_bound_bytes, gpu_buffer_bytes, offload_lines


def log_since(path: str | None, offset: int) -> tuple[list[str], int]:
    """The lines the engine process logged to its file from byte ``offset`` on, and the new offset."""
    if not path or not Path(path).exists():
        return [], offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    return data.decode("utf-8", errors="replace").splitlines(), offset + len(data)


def check_engine_on_gpu(
    lines: list[str], loads: int, *, allow_cpu: bool, file_bytes: int = 0
) -> list[tuple[int, int]]:
    """llama.cpp's "offloaded N/M layers" lines of ``loads`` model loads in the engine's log; raises
    :class:`NotOnGPU` unless there are that many, each offloaded every layer, and its GPU buffers hold
    most of the ``file_bytes`` of the models' tensors that belong there (:func:`gpu_bound_bytes`)."""
    found = offload_lines(lines)
    if allow_cpu:
        return found
    held = gpu_buffer_bytes(lines)
    if held < 0.8 * file_bytes:
        raise NotOnGPU(
            f"the engine put {held / 2**20:.0f} MiB of {file_bytes / 2**20:.0f} MiB of models on the GPU"
        )
    if len(found) < loads:
        raise NotOnGPU(
            f"the engine process logged {len(found)} GPU offloads for {loads} models (a CPU build?)"
        )
    partial = [f"{a}/{b}" for a, b in found if a < b]
    if partial:
        raise NotOnGPU(f"the engine process offloaded only {', '.join(partial)} layers to the GPU")
    return found


def _saved_state(folder: Path) -> dict[str, Any]:
    """What auto mode saved in ``folder`` when the engine closed (:class:`~app.engine.auto.AutoMemory`)."""
    for path in sorted(folder.glob("auto-*.json")):
        state = json.loads(path.read_text(encoding="utf-8")).get("state")
        if isinstance(state, dict):
            return state
    return {}


def auto_costs(folder: Path) -> dict[str, Any] | None:
    """The costs auto mode held when the engine closed (timed at load, then by every round), in decode
    steps per batch size, as it saves them for the next session (:class:`~app.engine.auto.AutoMemory`)."""
    costs = _saved_state(folder).get("costs")
    return costs if isinstance(costs, dict) else None


def auto_learned(folder: Path) -> dict[str, Any] | None:
    """What auto mode learned of its model rounds when the engine closed (their overrun, the probes'
    record and price), as it saves them for the next session."""
    model = (_saved_state(folder).get("auto") or {}).get("model")
    return model if isinstance(model, dict) else None


def predicted_round_ms(table: dict[str, Any], k: int) -> float | None:
    """A fully accepted round of k drafted tokens with the target as its own draft, from the table:
    the draft's catch-up batch of 2, k-1 draft steps, and the verify batch of k+1 (None: past it);
    k = 0: a plain round, a step as plain decoding takes it (timed in a run where the table has one)."""
    if k == 0:
        return table["target"].get("run_step_ms") or table["target"]["step_ms"]
    r = table["target"]["ratio"]
    return table["target"]["step_ms"] * (r[1] + (k - 1) + r[k]) if k < len(r) else None


def _run(client: Any, prompt: list[int], settings: Any) -> dict[str, Any]:
    from app.engine.events import Action, Finished, Step

    began: list[float] = []
    rounds: list[tuple[int, int, float, float]] = []  # drafted, accepted, t_round, t_llama
    fin = None
    t0 = time.perf_counter()
    for ev in client.generate(prompt=prompt, settings=settings):
        if isinstance(ev, Step) and ev.decision.action is not Action.PROMPT:  # rounds only
            began.append(ev.began)
            rounds.append((ev.n_drafted, ev.n_accepted, ev.t_round, ev.t_llama))
        elif isinstance(ev, Finished):
            fin = ev
    wall = time.perf_counter() - t0
    assert fin is not None
    periods = [b - a for a, b in itertools.pairwise(began)]  # the last round's tail is cut
    full = [i for i, (d, a, _, _) in enumerate(rounds[:-1]) if d and a == d]
    return {
        "tokens": list(fin.tokens),
        "n_generated": fin.stats.n_generated,
        "rounds": len(rounds),
        "n_drafted": fin.stats.n_drafted,
        "n_accepted": fin.stats.n_accepted,
        "decode_tokens_per_second": round(fin.stats.decode_tokens_per_second, 2),
        "python_share": round(fin.stats.python_share, 4),
        "wall_s": round(wall, 3),
        "period_ms": [round(1000 * p, 3) for p in periods],
        "full_rounds": full,  # rounds (by index) that drafted and accepted everything
        "t_round_ms": [round(1000 * r[2], 3) for r in rounds],
        "t_llama_ms": [round(1000 * r[3], 3) for r in rounds],
    }


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _load(target: str, draft: str, n_ctx: int, threads: int | None, allow_cpu: bool, memory: Path) -> Any:
    """The engine's load settings: both models on the GPU whole (on the CPU with ``allow_cpu``), what
    auto mode times kept in ``memory``."""
    from app.engine import LoadSettings

    gpu = 0 if allow_cpu else -1
    return LoadSettings(
        target, draft, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=gpu, n_gpu_layers_draft=gpu,
        history_dir=str(memory),
    )  # fmt: skip


def _load_pair(client: Any, settings: Any, prompt: list[int], allow_cpu: bool) -> None:
    """Load a target and draft (``settings``), check both went to the GPU whole, warm up with 16 plain
    tokens of ``prompt``."""
    from app.engine import GenerationSettings

    client.load(settings)
    lines, _ = log_since(client.log_path, 0)
    size = gpu_bound_bytes(settings.target) + gpu_bound_bytes(settings.draft)
    check_engine_on_gpu(lines, 2, allow_cpu=allow_cpu, file_bytes=size)
    for _ in client.generate(prompt=prompt, settings=GenerationSettings(mode="plain", max_tokens=16)):
        pass


def run_engine(
    target: str,
    table: dict[str, Any] | None,
    *,
    ks: tuple[int, ...] = (3, 7, 15),
    max_tokens: int = 256,
    repeats: int = 2,
    n_ctx: int = 4096,
    allow_cpu: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """Plain and speculative (``ks``) decoding of the target with itself as the draft, interleaved
    ``repeats`` times; per mode the median round period, and against ``table`` (a context's entry of
    :func:`bench.gpu_costs.measure`) what a round should cost and what the loop adds."""
    from app.engine import EngineClient, GenerationSettings

    memory = Path(tempfile.mkdtemp(prefix="tandem-gpu-engine-"))  # where the engine keeps what auto timed
    settings = _load(target, target, n_ctx, threads, allow_cpu, memory)
    rng = random.Random(1)
    prompt = [rng.randrange(3, 500) for _ in range(200)]  # the tokenizer's real tokens, any text will do
    modes: dict[str, Any] = {"plain": GenerationSettings(mode="plain", max_tokens=max_tokens)}
    for k in ks:
        modes[f"spec{k}"] = GenerationSettings(
            mode="speculative", n_max=k, n_min=k, adaptive=False, max_tokens=max_tokens
        )
    out: dict[str, Any] = {"n_ctx": n_ctx, "prompt_tokens": len(prompt), "max_tokens": max_tokens}
    with EngineClient() as client:
        t0 = time.perf_counter()
        client.load(settings)
        out["load_seconds"] = round(time.perf_counter() - t0, 2)
        lines, _ = log_since(client.log_path, 0)
        size = 2 * gpu_bound_bytes(target)
        out["offloaded"] = check_engine_on_gpu(lines, 2, allow_cpu=allow_cpu, file_bytes=size)
        info = client.loaded_info
        out["backend"] = info.backend if info else None
        for _ in client.generate(prompt=prompt, settings=GenerationSettings(mode="plain", max_tokens=16)):
            pass
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(repeats):
            for name, gs in modes.items():
                runs[name].append(_run(client, prompt, gs))
        plain_tokens = runs["plain"][0]["tokens"]
        parted: dict[str, list[dict[str, Any]]] = {}  # where a run left plain's text, and the target's
        for name, rs in runs.items():  # top-two logit gap there (a tie, or a real difference)
            for r in rs:
                if r["tokens"] != plain_tokens:
                    pairs = zip(plain_tokens, r["tokens"], strict=False)
                    at = next((i for i, (a, b) in enumerate(pairs) if a != b), len(r["tokens"]))
                    gap = client.top2_gap(prompt + plain_tokens[:at])
                    parted.setdefault(name, []).append({"at": at, "gap": round(gap, 4)})
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        k = 0 if name == "plain" else int(name[4:])
        periods = [p for r in rs for i, p in enumerate(r["period_ms"]) if k == 0 or i in r["full_rounds"]]
        llama = [t for r in rs for i, t in enumerate(r["t_llama_ms"][:-1]) if k == 0 or i in r["full_rounds"]]
        row: dict[str, Any] = {
            "tokens_per_second": [r["decode_tokens_per_second"] for r in rs],
            "acceptance": round(
                sum(r["n_accepted"] for r in rs) / max(1, sum(r["n_drafted"] for r in rs)), 4
            ),
            "same_as_plain": all(r["tokens"] == plain_tokens for r in rs),
            "parted": parted.get(name, []),
            "round_ms": _median(periods),
            "llama_ms": _median(llama),
            "rounds_measured": len(periods),
            "python_share": [r["python_share"] for r in rs],
        }
        want = None if table is None else predicted_round_ms(table, k)
        if want and periods:
            row["predicted_ms"] = round(want, 3)
            row["overhead_ms"] = round(statistics.median(periods) - want, 3)
            row["overhead_share"] = round(statistics.median(periods) / want - 1, 4)
        summary[name] = row
    out["modes"] = summary
    out["auto_costs"] = auto_costs(memory)
    shutil.rmtree(memory, ignore_errors=True)
    out["runs"] = {m: [{k: v for k, v in r.items() if k != "tokens"} for r in rs] for m, rs in runs.items()}
    return out


def run_explore(
    target: str,
    draft: str,
    *,
    max_tokens: int = 256,
    repeats: int = 3,
    n_ctx: int = 4096,
    allow_cpu: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """What auto mode's exploring costs at worst: plain and auto decoding interleaved ``repeats`` times
    with a draft model that is never right (the synthetic draft: random weights of its own), as the
    app loads the pair. Each mode also runs with every batch evaluated after its round is planned
    (``-serial``: no round queued before it is planned, :mod:`app.engine.overlap`). Per mode the
    tokens/s and the rounds queued; for auto, its rounds by what drafted them (a random target's text
    can repeat, and prompt lookup may then copy it)."""
    from app.engine import EngineClient, GenerationSettings
    from app.engine.events import Finished, Step

    memory = Path(tempfile.mkdtemp(prefix="tandem-gpu-explore-"))
    settings = _load(target, draft, n_ctx, threads, allow_cpu, memory)
    rng = random.Random(2)
    prompt = [rng.randrange(3, 500) for _ in range(200)]
    modes = {m: GenerationSettings(mode=m, max_tokens=max_tokens) for m in ("plain", "auto")}
    modes |= {f"{m}-serial": replace(modes[m], overlap=False) for m in ("plain", "auto")}
    queued: dict[str, list[tuple[int, int, int]]] = {m: [] for m in modes}
    out: dict[str, Any] = {"n_ctx": n_ctx, "max_tokens": max_tokens, "repeats": repeats}
    speeds: dict[str, list[float]] = {m: [] for m in modes}
    sources: dict[str, dict[str, int]] = {}
    same = True
    try:
        with EngineClient() as client:
            _load_pair(client, settings, prompt, allow_cpu)
            texts: dict[str, list[tuple[int, ...]]] = {m: [] for m in modes}
            for i in range(repeats):
                for name in modes if i % 2 == 0 else reversed(modes):
                    fin = None
                    for ev in client.generate(prompt=prompt, settings=modes[name]):
                        if isinstance(ev, Step) and name.startswith("auto"):
                            row = sources.setdefault(ev.drafter.value, {"rounds": 0, "accepted": 0})
                            row["rounds"] += 1
                            row["accepted"] += ev.n_accepted
                        elif isinstance(ev, Finished):
                            fin = ev
                    assert fin is not None
                    speeds[name].append(round(fin.stats.decode_tokens_per_second, 2))
                    queued[name].append((fin.stats.rounds, fin.stats.n_queued, fin.stats.n_wasted))
                    texts[name].append(tuple(fin.tokens))
            same = all(t == texts["plain"][0] for ts in texts.values() for t in ts)
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    out["tokens_per_second"] = speeds
    ratios = [a / p for a, p in zip(speeds["auto"], speeds["plain"], strict=True)]
    out["auto_over_plain"] = [round(r, 4) for r in ratios]
    out["auto_over_plain_median"] = round(statistics.median(ratios), 4)
    for serial in ("plain", "auto"):  # what queuing gives each mode, run by run
        pairs = zip(speeds[serial], speeds[f"{serial}-serial"], strict=True)
        out[f"{serial}_over_serial"] = [round(a / b, 4) for a, b in pairs]
    out["auto_serial_over_plain_serial"] = [
        round(a / p, 4) for a, p in zip(speeds["auto-serial"], speeds["plain-serial"], strict=True)
    ]
    out["rounds_queued_wasted"] = queued
    out["auto_rounds"] = sources
    out["same_as_plain"] = same
    return out


ACCEPTANCE_MODES = "plain,spec1,spec2,spec3,spec4,spec6,spec8,lookup,auto"


def run_acceptance(
    walk: dict[str, Any],
    *,
    modes: str = ACCEPTANCE_MODES,
    max_tokens: int = 256,
    repeats: int = 3,
    n_ctx: int = 4096,
    allow_cpu: bool = False,
    threads: int | None = None,
    on_pair: Callable[[dict[str, Any]], None] | None = None,
    trace: bool = False,
) -> dict[str, Any]:
    """Auto mode held to the best fixed setting live, at chosen acceptance: for each draft of a walk
    pair (:func:`bench.gpu_models.write_walk_models`, right at a known rate per token), the pair
    loaded as the app loads it and ``modes`` interleaved ``repeats`` times, each time in another
    order, in a fresh engine per pair (auto's first reply learns from nothing, the worst case). Per
    acceptance: each mode's tokens/s, the best fixed setting, auto's ratio to it and to plain per
    repeat, the acceptance speculative decoding measured, what auto drafted, the rounds queued and
    wasted (:mod:`app.engine.overlap`), and the costs auto mode held at the end. With ``trace``, every
    round of every reply too (:data:`TRACE_FIELDS`). ``on_pair`` is given the result so far after
    each pair (a caller stopped at a time limit keeps the pairs measured)."""
    from app.engine import EngineClient
    from app.engine.events import Action, Finished, Step
    from bench.modes import best_fixed, parse_modes

    chosen = parse_modes(modes)
    missing = {"plain", "auto"} - {m.name for m in chosen}
    if missing or not any(m.fixed and m.name != "plain" for m in chosen):
        raise ValueError(f"the acceptance step needs plain, auto and a fixed drafting setting, not {modes!r}")
    rng = random.Random(3)
    prompt = [rng.randrange(3, 500) for _ in range(200)]
    out: dict[str, Any] = {"max_tokens": max_tokens, "repeats": repeats, "modes": [m.name for m in chosen]}
    for q, draft in walk["drafts"].items():
        memory = Path(tempfile.mkdtemp(prefix="tandem-gpu-acceptance-"))
        speeds: dict[str, list[float]] = {m.name: [] for m in chosen}
        drafted: dict[str, list[tuple[int, int, int, int]]] = {m.name: [] for m in chosen}
        queued: dict[str, list[tuple[int, int]]] = {m.name: [] for m in chosen}
        traces: dict[str, list[list[list[Any]]]] = {m.name: [] for m in chosen}
        same = True
        try:
            with EngineClient() as client:
                settings = _load(walk["target"]["path"], draft["path"], n_ctx, threads, allow_cpu, memory)
                _load_pair(client, settings, prompt, allow_cpu)
                loaded = client.info().engine.auto_costs  # as timed at load (and by 16 plain tokens)
                reference = None
                for i in range(repeats):
                    for m in chosen[i % len(chosen) :] + chosen[: i % len(chosen)]:
                        fin = None
                        rounds = 0
                        rows: list[list[Any]] = []
                        for ev in client.generate(prompt=prompt, settings=m.settings(max_tokens)):
                            if isinstance(ev, Step):
                                rounds += bool(ev.n_drafted)
                                if trace and ev.decision.action is not Action.PROMPT:  # rounds only
                                    rows.append(_trace_row(ev))
                            elif isinstance(ev, Finished):
                                fin = ev
                        assert fin is not None
                        speeds[m.name].append(round(fin.stats.decode_tokens_per_second, 2))
                        st = fin.stats
                        drafted[m.name].append((rounds, st.rounds, st.n_drafted, st.n_accepted))
                        queued[m.name].append((st.n_queued, st.n_wasted))
                        if trace:
                            first = rows[0][-1] if rows else 0.0
                            for row in rows:  # began: milliseconds since the reply's first round
                                row[-1] = round(row[-1] - first, 3)
                            traces[m.name].append(rows)
                        reference = reference or fin.tokens
                        same = same and fin.tokens == reference
            costs, learned = auto_costs(memory), auto_learned(memory)
        finally:
            shutil.rmtree(memory, ignore_errors=True)
        out[q] = _acceptance_summary(speeds, drafted, best_fixed, same)
        out[q]["queued_wasted"] = queued  # per mode and repeat
        out[q]["loaded_costs"] = loaded
        out[q]["auto_costs"] = costs
        out[q]["auto_learned"] = learned
        if trace:
            out[q]["trace"] = traces
        if on_pair is not None:
            on_pair(out)
    return out


# a traced round: the decision, what was drafted and accepted, its times (microseconds), what auto
# expected of it and had measured, and when it began (milliseconds since the reply's first round)
TRACE_FIELDS = (
    "action", "k", "drafted", "accepted", "t_draft_us", "t_verify_us", "t_round_us", "t_llama_us",
    "expected_speedup", "measured_speedup", "acceptance", "began_ms",
)  # fmt: skip


def _trace_row(ev: Any) -> list[Any]:
    d = ev.decision
    return [
        d.action.name, ev.k, ev.n_drafted, ev.n_accepted,
        *(round(t * 1e6) for t in (ev.t_draft, ev.t_verify, ev.t_round, ev.t_llama)),
        *(None if x is None else round(x, 4) for x in (d.expected_speedup, d.measured_speedup, d.acceptance)),
        round(ev.began * 1e3, 3),
    ]  # fmt: skip


def _rate(rows: list[tuple[int, int, int, int]] | None) -> float | None:
    """Accepted over drafted tokens, over all repeats (spec1's: the draft's chance per token)."""
    drafted = sum(r[2] for r in rows or [])
    return round(sum(r[3] for r in rows or []) / drafted, 4) if drafted else None


def _acceptance_summary(
    speeds: dict[str, list[float]], drafted: dict[str, Any], best_fixed: Any, same: bool
) -> dict[str, Any]:
    """Per repeat: auto over plain and over the best fixed setting of that repeat; their medians."""
    repeats = len(speeds["plain"])
    over_plain, over_best, best_names = [], [], []
    for i in range(repeats):
        name, speed = best_fixed({m: s[i] for m, s in speeds.items()})
        best_names.append(name)
        over_best.append(round(speeds["auto"][i] / speed, 4))
        over_plain.append(round(speeds["auto"][i] / speeds["plain"][i], 4))
    medians = {m: statistics.median(s) for m, s in speeds.items()}
    best, best_speed = best_fixed(medians)
    return {
        "tokens_per_second": speeds,
        "best_fixed": best,
        "best_over_plain": round(best_speed / medians["plain"], 4),
        "auto_over_plain": over_plain,
        "auto_over_best": over_best,
        "auto_over_plain_median": round(statistics.median(over_plain), 4),
        "auto_over_best_median": round(statistics.median(over_best), 4),
        "best_each_repeat": best_names,
        "rounds_drafted": drafted,  # per mode and repeat: rounds that drafted, rounds, drafted, accepted
        "spec1_acceptance": _rate(drafted.get("spec1")),
        "same_as_plain": same,
    }
