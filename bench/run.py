"""``tandem bench``: every generation mode on a JSONL prompt set, interleaved per prompt.

The pair is loaded once. For each prompt all modes run back to back, in an order that changes from
prompt to prompt (a Williams design: every mode runs in every place and right after every other mode
equally often), so drift on a noisy machine and whatever one mode leaves behind for the next hit every
mode alike; each run starts from an empty KV cache so prompt processing and time to first token
are comparable. Greedy outputs are compared with plain decoding's
(speculative decoding must not change them). With ``--temperature`` the replies are sampled, as
the local API samples a request that names only a temperature (llama.cpp's server's defaults for the
rest), each prompt with one seed for all its modes in a repeat: the modes draw from the same law,
not the same text, so only their speed is compared. Prints a table per category and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.engine.auto import LOOKUP_MAX
from bench.modes import FIXED, MODES, collect, parse_modes, reply_record, warm_up
from bench.summary import best_fixed_table, markdown_tables, print_tables, summarize, whole_reply_table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = Path(__file__).with_name("prompts.jsonl")


# plain, the fixed draft lengths of bench.modes.SPEC_N, lookup and auto: auto held to the best of the rest
DEFAULT_MODES = "plain,spec,lookup,auto"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target GGUF")
    p.add_argument("--draft", help="draft GGUF (speculative and auto modes)")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL: id, category, prompt")
    p.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help=f"comma-separated, from: {', '.join(MODES)}; spec: spec1-4,6,8 (default {DEFAULT_MODES})",
    )
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument(
        "--temperature",
        type=temperature,
        default=0.0,
        help="sample at this temperature (top-k 40, top-p 0.95, min-p 0.05, as the local API does; "
        "one seed per prompt and repeat, shared by its modes); 0, the default: greedy",
    )
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--gpu-layers", default="auto", metavar="auto|all|cpu|N", help="as tandem generate's")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--categories", default="", help="only these categories (comma-separated)")
    p.add_argument(
        "--shift",
        type=int,
        default=0,
        help="start the prompts this many rows further into the balanced orders of the modes: give each "
        "run of a series its own (0, 1, 2, ...) so that a prompt runs its modes in another order each time",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the prompt set this many times, each prompt in another order of the modes each time; "
        "per category the speedups' range over repeats is reported",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/<time>.json)")
    p.add_argument(
        "--no-rss", action="store_true", help="skip the peak-RSS measurement (two extra processes)"
    )
    p.add_argument(
        "--llama-cpp",
        type=Path,
        default=None,
        metavar="BIN_DIR",
        help="also run llama.cpp's llama-speculative-simple from BIN_DIR at n_max 3 and 5 on the same "
        "prompts (interleaved with the other modes), for comparison",
    )


def load_prompts(path: Path, limit: int = 0, categories: str = "") -> list[dict[str, str]]:
    if not path.exists():
        raise SystemExit(f"prompt file not found: {path}")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    wanted = {c for c in categories.split(",") if c}
    rows = [r for r in rows if not wanted or r["category"] in wanted]
    return rows[:limit] if limit else rows


def machine() -> dict[str, Any]:
    import psutil

    from app.engine.llama import backend_name, system_info

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "backend": backend_name(),
        "llama_cpp_system_info": system_info(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from app.engine.engine import Engine, LoadSettings
    from app.engine.settings import parse_gpu_layers

    modes = parse_modes(args.modes, [m for m in MODES if not MODES[m].history])
    if any(m.mode == "speculative" for m in modes) and not args.draft:
        raise SystemExit("speculative modes need --draft (or choose --modes plain,lookup,auto)")
    prompts = load_prompts(args.prompts, args.limit, args.categories)
    load = LoadSettings(
        target=args.target,
        draft=args.draft,
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_gpu_layers=parse_gpu_layers(args.gpu_layers),
    )
    t0 = time.perf_counter()
    engine = Engine(load)
    t_load = time.perf_counter() - t0
    results: list[dict[str, Any]] = []
    try:
        if prompts:
            warm_up(engine, engine.chat_prompt([{"role": "user", "content": prompts[0]["prompt"]}]), modes)
        work = [(rep, row) for rep in range(args.repeats) for row in prompts]
        for i, (rep, row) in enumerate(work):
            ids = engine.chat_prompt([{"role": "user", "content": row["prompt"]}])
            # each prompt on the next row, and one row further in each repeat: with as many prompts as
            # rows (or a multiple), the prompt's index alone would give it the same order every repeat
            place_row = i % len(prompts) + rep + args.shift
            order = balanced_order([*modes, *(LCPP_MODES if args.llama_cpp else [])], place_row)
            plain_tokens = None
            runs = {}
            for m in order:
                if isinstance(m, str):  # llama.cpp's own speculative example on the same prompt text
                    text = engine.template.render([{"role": "user", "content": row["prompt"]}])
                    runs[m] = run_llama_cpp(args.llama_cpp, args, text, LCPP_MODES[m])
                    continue
                engine.reset()
                gs = m.settings(args.max_tokens, **sampling(args.temperature, seed=i))
                runs[m.name] = reply_record(*collect(engine.generate(ids, gs)))
                runs[m.name].pop("text")
                if m.name == "plain":
                    plain_tokens = runs["plain"]["tokens"]
                    runs["plain"]["lookup_bound"] = lookup_bound(ids, plain_tokens, engine.costs.ratio)
            for name, r in runs.items():
                comparable = plain_tokens is not None and name not in LCPP_MODES and not args.temperature
                r["same_as_plain"] = r["tokens"] == plain_tokens if comparable else None
                if comparable and not r["same_as_plain"]:
                    r["first_difference"] = next(
                        (
                            j
                            for j, (a, b) in enumerate(zip(plain_tokens, r["tokens"], strict=False))
                            if a != b
                        ),
                        min(len(plain_tokens), len(r["tokens"])),
                    )
                    j = r["first_difference"]
                    r["top2_gap_at_difference"] = engine.top2_gap(ids + plain_tokens[:j])
                place = next(j for j, m in enumerate(order) if getattr(m, "name", m) == name)
                results.append(
                    {
                        "id": row["id"],
                        "category": row["category"],
                        "mode": name,
                        "position": place,
                        "repeat": rep,
                        **r,
                    }
                )
            line = "  ".join(f"{n}={r['stats']['decode_tokens_per_second']:.1f}" for n, r in runs.items())
            print(
                f"[{i + 1}/{len(work)}] {row['id']} {row['category']}: {line} tok/s (load {load_average()})",
                file=sys.stderr,
                flush=True,
            )
            if args.out is not None:  # what was measured so far, should the run stop
                write_json(args.out, {**results_of(args, modes, t_load, results, None), "complete": False})
        verify_ratios = recorded_ratios(engine.costs)  # what auto mode had measured by the end
    finally:
        engine.close()
    return results_of(args, modes, t_load, results, verify_ratios)


def temperature(text: str) -> float:
    """``--temperature``: a finite number at least 0 (checked before any model loads)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, not {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"at least 0, not {text}")
    return value


def sampling(temperature: float, seed: int) -> dict[str, Any]:
    """The generation settings' sampling for a reply: none (greedy) at temperature 0, else the local
    API's at ``temperature`` with ``seed``."""
    if not temperature:
        return {}
    from app.engine.sampling import SamplingParams

    return {"sampling": SamplingParams(temperature=temperature, seed=seed, **sampled())}


def sampled() -> dict[str, Any]:
    """What the local API samples with beside a request's temperature (its defaults)."""
    from app.server.served import Defaults

    d = Defaults()
    return {"top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def results_of(
    args: argparse.Namespace,
    modes: list[Any],
    t_load: float,
    results: list[dict[str, Any]],
    verify_ratios: list[float] | None,
) -> dict[str, Any]:
    """The run's JSON: the machine, the settings and every reply."""
    return {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "settings": {
            "target": args.target,
            "draft": args.draft,
            "max_tokens": args.max_tokens,
            "ctx": args.ctx,
            "threads": args.threads or os.cpu_count(),
            "modes": [m.name for m in modes] + (list(LCPP_MODES) if args.llama_cpp else []),
            "temperature": args.temperature,
            **({"sampling": sampled()} if args.temperature else {}),
            "prompts": str(args.prompts),
            "load_seconds": round(t_load, 2),
            "shift": args.shift,
            "repeats": args.repeats,
            "load_average_after": load_average(),
            "verify_ratios": verify_ratios,  # batches of 1 to LOOKUP_MAX + 1, in steps (for bench.replay)
        },
        "runs": results,
    }


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them ("-" where there are none)."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "-"


def recorded_ratios(costs: Any) -> list[float] | None:
    """The verify costs of batches of 1 to auto mode's longest copy, in decode steps, as a cost model
    estimates them (for ``bench.replay``); None for one without ratios."""
    ratio = getattr(costs, "ratio", None)
    return [round(ratio(b), 3) for b in range(1, LOOKUP_MAX + 2)] if ratio else None


def lookup_bound(
    prompt: list[int], reply: list[int], ratio: Callable[[int], float], n_max: int | None = None
) -> tuple[int, float]:
    """What an all-knowing prompt-lookup policy could reach on this reply with this machine's costs.

    At every round the lookup drafter's continuation is drafted exactly as far as the target will
    accept it (if that pays: a batch of a+1 costs less than a+1 steps), else nothing. Returns the
    reply's tokens after the first (which comes with the prompt's batch) and the cost of the rounds
    that add them in decode steps (``ratio(b)``: a batch of b relative to one step), so tokens / cost
    is the best speedup any policy choosing only the draft length could get.
    """
    from app.engine.auto import LOOKUP_MAX
    from app.engine.drafting import LookupDrafter
    from bench.replay import FIRST, counted

    n_max = n_max or LOOKUP_MAX  # as long as auto mode's lookup drafts
    lookup = LookupDrafter()
    lookup.begin(prompt)
    pos, cost = FIRST, 0.0  # the first token comes with the prompt's batch
    while pos < len(reply):
        cont = lookup.propose([*prompt, *reply[:pos]], n_max, None, None).tokens  # type: ignore[arg-type]
        a = 0
        while a < min(len(cont), len(reply) - pos - 1) and cont[a] == reply[pos + a]:
            a += 1
        k = a if a and ratio(a + 1) < a + 1 else 0
        cost += ratio(k + 1)
        pos += k + 1
    return counted(reply), cost


def balanced_order(items: list[Any], row: int) -> list[Any]:
    """Row ``row`` (cyclically) of a Williams design for ``items``: over its rows (``n`` for an even
    number of items, ``2n`` for an odd one) every item runs in every place, and right after every
    other item, equally often. A plain rotation would always put the same mode after the same other
    mode, so any carry-over (caches, the draft's state, heat) would land on one mode."""
    n = len(items)
    if n < 2:
        return list(items)
    first = [0]
    for j in range(1, n):  # 0, 1, n-1, 2, n-2, ...
        first.append((j + 1) // 2 if j % 2 else n - j // 2)
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row_[::-1] for row_ in rows]
    return [items[x] for x in rows[row % len(rows)]]


LCPP_MODES = {"lcpp-spec3": 3, "lcpp-spec5": 5}
_FLOAT = r"([0-9.]+)"


def run_llama_cpp(bin_dir: Path, args: argparse.Namespace, prompt_text: str, n_max: int) -> dict[str, Any]:
    """One run of llama.cpp's own ``llama-speculative-simple`` (greedy, same threads and context)."""
    import re

    exe = bin_dir / "llama-speculative-simple"
    cmd = [
        str(exe), "-m", args.target, "-md", args.draft, "--spec-type", "draft-simple",
        "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "-n", str(args.max_tokens),
        "--temp", "0", "-c", str(args.ctx), "-t", str(args.threads or os.cpu_count()), "-p", prompt_text,
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    out = res.stdout + res.stderr
    dec = re.search(rf"decoded\s+(\d+) tokens in\s+{_FLOAT} seconds, speed:\s+{_FLOAT} t/s", out)
    drafted = re.search(r"n_drafted = (\d+)", out)
    accepted = re.search(r"n_accept\s+= (\d+)", out)
    if res.returncode != 0 or not dec:
        raise RuntimeError(f"llama-speculative-simple failed ({res.returncode}): {out[-500:]}")
    n, t = int(dec.group(1)), float(dec.group(2))
    nd, na = int(drafted.group(1)) if drafted else 0, int(accepted.group(1)) if accepted else 0
    return {
        "stats": {
            "n_generated": n, "t_decode_s": t, "decode_tokens_per_second": n / t if t else 0.0,
            "n_drafted": nd, "n_accepted": na, "rounds_drafted": 0, "t_llama_s": t,
        },
        "tokens": [], "finish": "", "mean_k": float(n_max), "drafters": {"llama.cpp": 1},
    }  # fmt: skip


def main(args: argparse.Namespace) -> int:
    args.out = args.out or REPO / "bench" / "results" / time.strftime("bench-%Y%m%d-%H%M%S.json")
    data = run(args)
    data["summary"] = summarize(data)
    modes = data["settings"]["modes"]
    print_tables(data["summary"], modes)
    print(markdown_tables(data["summary"], modes))
    for mode in ("auto", "adaptive"):
        if mode in modes and any(m in modes for m in FIXED):
            print(f"\n{mode} against the best fixed setting of the run, per category, on decode time:\n")
            print(best_fixed_table(data["summary"], mode))
            print(
                "\nand on generation time (decode, and the drafter's own work on the prompt: a draft"
                " model evaluating it up front):\n"
            )
            print(best_fixed_table(data["summary"], mode, gen=True))
    if "plain" in modes and len(modes) > 1:
        print("\nprompt processing over plain decoding's, and the whole reply's speedup, prompt included:\n")
        print(whole_reply_table(data["summary"], modes))
    if not args.no_rss:
        from bench.rss import peak_rss

        data["peak_rss_mb"] = peak_rss(args)
        print("peak RSS (MB):", json.dumps({k: round(v) for k, v in data["peak_rss_mb"].items()}))
    m = data["machine"]
    print(f"machine: {m['cpu']}, {m['cores_logical']} threads, {m['ram_gib']} GiB, backend {m['backend']}")
    write_json(args.out, {**data, "complete": True})
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="tandem bench", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
