"""The GPU check: one command, for a machine with an NVIDIA GPU and no network, that writes one JSON file
and prints a summary. It takes the llama-cpp-python builds in its environment (and more with
``--backend``) and no weights::

    python -m bench.gpu_check --out gpu-check.json           # on the GPU machine
    python -m bench.gpu_check --dry-run                       # here: every step that needs no GPU

Steps, each written to the JSON as it ends (a run stopped half-way keeps what it measured):

1. ``models``: synthetic models of real shapes (:mod:`bench.gpu_models`): a target shaped like
   Qwen2.5-7B-Instruct and a draft like Qwen2.5-0.5B, one vocabulary, Q4_K_M-like random blocks.
2. ``costs``: per backend, in a child process on its own ``PYTHONPATH`` (:mod:`bench.gpu_costs`): the
   decode step and verify batches of 1-64 for target and draft after 512 and 4096 tokens, as ratios to
   a decode step, interleaved and repeated, with quartiles. Stops with exit code 3 if the models are
   not on the GPU.
3. ``engine``: the engine process (``EngineClient``, as the app) in plain and speculative mode with the
   target as its own draft (:mod:`bench.gpu_engine`): the loop's overhead per round beside the table.
4. ``explore``: plain and auto mode with the random draft (never right), each with and without
   rounds queued before they are planned (:func:`bench.gpu_engine.run_explore`).
5. ``acceptance``: auto mode against every fixed setting live, with drafts right at 50, 75 and 90 %
   per token (:func:`bench.gpu_models.write_walk_models`, :func:`bench.gpu_engine.run_acceptance`).
6. ``replay``: the recorded single-turn, multi-turn and held-out drafts
   (``bench/recorded/*.replies.json.gz``) replayed with the measured table (:mod:`bench.gpu_replay`):
   what they would give with a 7B target on this GPU, per mode, with the table after 512 and after
   4096 tokens.
7. ``lossless``: the tests' tiny real models on the GPU (:mod:`bench.gpu_lossless`).
8. ``backends``: step 2 for the other builds given with ``--backend`` (Vulkan), last: the first one's
   figures matter most, and a call that runs out of time keeps them.

``--dry-run`` runs steps 1 and 6, step 6 with ``--ratios`` (default ``recorded``: the table measured
where the replies were prepared; ``gpu``: the assumed laptop-GPU table of ``bench.replay --ratios
gpu``; a comma list; or an earlier check's JSON). ``--shapes tiny`` writes small models of the same
layout (tests). ``--allow-cpu`` runs every step on whatever llama.cpp has (tests of the check itself).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_summary import summary_lines

REPO = Path(__file__).resolve().parents[1]
STEPS = ("models", "costs", "engine", "explore", "acceptance", "replay", "lossless", "backends")
DRY_STEPS = ("models", "replay")
# an earlier check's table, replayed again here: the context its replies are nearest
SET_CONTEXT = {"single-turn": "512", "multi-turn": "4096", "held-out": "512"}
ASSUMED_DRAFT = [0.15] * 16  # --ratios gpu: a 0.5B draft's step against a 7B's, assumed (not measured)


def environment() -> dict[str, Any]:
    """What ran the check: host, Python, llama-cpp-python, the GPU as nvidia-smi names it."""
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    try:
        import llama_cpp

        env["llama_cpp_python"] = getattr(llama_cpp, "__version__", "?")
    except Exception as e:  # the check still writes its JSON: the error is the finding
        env["llama_cpp_python"] = f"not importable: {e}"
    try:
        query = "--query-gpu=name,driver_version,memory.total,compute_cap"
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        env["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        env["nvidia_smi"] = f"none: {e}"
    return env


def parse_backends(items: list[str]) -> list[tuple[str, str | None]]:
    """``NAME=SITE_DIR`` pairs; without any, this environment's build as ``default``."""
    out: list[tuple[str, str | None]] = []
    for item in items:
        name, sep, site = item.partition("=")
        if not sep or not name or not site:
            raise SystemExit(f"--backend takes NAME=DIR (a folder holding a llama_cpp package), not {item!r}")
        out.append((name, site))
    return out or [("default", None)]


def run_costs(
    name: str, site: str | None, models: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """:mod:`bench.gpu_costs` in a child process with ``site`` first on its path."""
    out = work / f"costs-{name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, str(REPO), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "bench.gpu_costs", "--target", models["target"]["path"]]
    cmd += ["--draft", models["draft"]["path"], "--contexts", args.contexts, "--reps", str(args.reps)]
    cmd += ["--max-batch", str(args.max_batch), "--out", str(out)]
    cmd += ["--allow-cpu"] if args.allow_cpu else []
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.step_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.step_timeout} s"}
    data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    if proc.returncode:
        data.setdefault("error", f"exit {proc.returncode}")
        data["stderr_tail"] = proc.stderr[-3000:]
    data["exit_code"] = proc.returncode
    return data


def given_table(
    text: str, sets_meta: dict[str, dict[str, Any]]
) -> dict[str, tuple[list[float], list[float] | None, str]]:
    """Per replay set, the verify and draft tables ``--ratios`` names, and their label."""
    from bench.replay_history import gpu_ratios

    out: dict[str, tuple[list[float], list[float] | None, str]] = {}
    for name, meta in sets_meta.items():
        if text == "recorded":
            rec = meta["recorded"]
            out[name] = (rec["ratios"], rec["draft_ratios"], f"recorded: {rec.get('measured', '?')}")
        elif text == "gpu":
            out[name] = (gpu_ratios(), ASSUMED_DRAFT, "gpu (assumed laptop GPU)")
        elif Path(text).is_file():
            data = json.loads(Path(text).read_text(encoding="utf-8"))
            ratios, draft, used = measured_table(data["costs"][data["primary"]], SET_CONTEXT[name])
            out[name] = (ratios, draft, f"measured after {used} tokens ({text})")
        else:
            try:
                ratios = [float(x) for x in text.split(",")]
            except ValueError:
                raise SystemExit(f"--ratios: recorded, gpu, a JSON file or numbers, not {text!r}") from None
            out[name] = (ratios, None, "given")
    return out


def measured_table(
    costs: dict[str, Any], context: str, *, plain_ms: float | None = None, in_run: bool = True
) -> tuple[list[float], list[float], str]:
    """A backend's measured verify table (batches 1-64, in steps) and the draft's, at ``context`` (or
    the longest measured), and which context that was.

    The batches are timed between decode steps, which on CUDA run without their graph; with
    ``in_run`` they are given in steps as plain decoding takes them: the step the table timed back to
    back (``run_step_ms``), or for a table without one ``plain_ms``, what a plain round took in the
    same check's engine step (where given). ``in_run=False``: in the steps timed between batches."""
    used = context if context in costs["contexts"] else max(costs["contexts"], key=int)
    c = costs["contexts"][used]
    step = c["target"].get("run_step_ms") or plain_ms
    scale = c["target"]["step_ms"] / step if in_run and step else 1.0
    target = [1.0, *(r * scale for r in c["target"]["ratio"][1:])]
    return target, [r * scale for r in c["draft"]["ratio"]], used


def run_replay(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """Each prepared set replayed with the given table (dry run), or with the primary backend's table
    at each context measured (single-turn prompts hold about 200 tokens, multi-turn ones 100-1,700:
    between the 512 and 4096 tables): ``"<set>"`` or ``"<set> @<context>"``."""
    from bench.gpu_replay import SETS, load_prepared, replay_set

    loaded = {name: load_prepared(path, args.replay_limit) for name, path in SETS.items() if path.exists()}
    jobs: list[tuple[str, str, tuple[list[float], list[float] | None, str]]] = []
    if args.dry_run or "costs" not in result or "primary" not in result:
        tables = given_table(args.ratios, {n: m for n, (m, _) in loaded.items()})
        jobs = [(n, n, tables[n]) for n in loaded]
    else:
        costs = result["costs"][result["primary"]]
        for n in loaded:
            for ctx in costs["contexts"]:
                ratios, draft, used = measured_table(costs, ctx)
                jobs.append(
                    (f"{n} @{ctx}", n, (ratios, draft, f"measured after {used} tokens ({result['primary']})"))
                )
    out: dict[str, Any] = {}
    for key, name, (ratios, draft_ratios, label) in jobs:
        meta, replies = loaded[name]
        t0 = time.perf_counter()
        try:
            rows = replay_set(meta, replies, ratios, draft_ratios, orders=args.orders)
        except (ValueError, ZeroDivisionError) as e:  # a table a noisy machine measured below 0 past its end
            out[key] = {"table": label, "error": f"{type(e).__name__}: {e}", "ratios": ratios}
            continue
        out[key] = {
            "table": label,
            "replies": len(replies),
            "source": meta.get("source"),
            "ratios": ratios,
            "draft_ratios": draft_ratios,
            "speedup": rows,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return out


def write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=Path("gpu-check.json"), help="the JSON (default gpu-check.json)"
    )
    p.add_argument("--dry-run", action="store_true", help="only the steps that need no GPU: models, replay")
    p.add_argument("--steps", default="", help=f"comma-separated, from {','.join(STEPS)} (default: all)")
    p.add_argument("--shapes", choices=("real", "small", "tiny"), default="real", help="synthetic shapes")
    p.add_argument("--workdir", type=Path, help="where models are written (default: a temporary folder)")
    p.add_argument("--backend", action="append", default=[], metavar="NAME=DIR",
                   help="also measure the build whose llama_cpp package is in DIR (repeatable); the first "
                   "is the primary, which the table for the replay comes from")  # fmt: skip
    p.add_argument("--ratios", default="recorded", help="dry run: the replay's table (recorded, gpu, ...)")
    p.add_argument("--contexts", default="512,4096")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=7, help="repeats of the cost table (default 7)")
    p.add_argument("--orders", type=int, default=1, help="replay orders (default 1)")
    p.add_argument("--replay-limit", type=int, default=0, help="replay only the first N replies of each set")
    p.add_argument("--engine-tokens", type=int, default=256)
    p.add_argument("--explore-repeats", type=int, default=3, help="interleaved runs of the explore step")
    p.add_argument(
        "--acceptance-repeats", type=int, default=3, help="interleaved runs of the acceptance step"
    )
    p.add_argument(
        "--acceptance-modes",
        default="",
        help="the acceptance step's modes (default: plain, spec1-4, 6, 8, lookup, auto)",
    )
    p.add_argument(
        "--acceptance-trace", action="store_true", help="the acceptance step records every round's decision"
    )
    p.add_argument("--lossless-pairs", default="", help="tiny pairs to check (default: all six)")
    p.add_argument("--step-timeout", type=float, default=300.0, help="seconds for a backend's cost table")
    p.add_argument("--allow-cpu", action="store_true", help="run the GPU steps without a GPU (tests)")
    p.add_argument(
        "--deadline", type=float, default=0.0, help="seconds: start no step after this long (0: no limit)"
    )
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s] or list(DRY_STEPS if args.dry_run else STEPS)
    if args.dry_run:
        steps = [s for s in steps if s in DRY_STEPS]
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}: choose from {', '.join(STEPS)}")
    backends = parse_backends(args.backend)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tandem-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "check": "tandem gpu check",
        "dry_run": args.dry_run,
        "argv": sys.argv[1:] if argv is None else argv,
        "environment": environment(),
        "steps": steps,
        "seconds": {},
    }
    status = 0

    def done(step: str, t0: float) -> None:
        result["seconds"][step] = round(time.perf_counter() - t0, 1)
        result["total_seconds"] = round(time.perf_counter() - t_start, 1)
        write(args.out, result)
        print(f"[{result['total_seconds']:7.1f} s] {step} done", flush=True)

    write(args.out, result)
    for step in steps:
        t0 = time.perf_counter()
        if args.deadline and t0 - t_start > args.deadline:
            result.setdefault("skipped", []).append(step)
            print(f"{step} skipped: past the deadline of {args.deadline:.0f} s", file=sys.stderr, flush=True)
            continue
        try:
            if step == "models":
                from bench.gpu_models import write_models

                result["models"] = write_models(work, args.shapes)
            elif step == "costs":
                name, site = backends[0]
                result["costs"] = {name: run_costs(name, site, result["models"], args, work)}
                result["primary"] = name
                if "contexts" not in result["costs"][backends[0][0]]:
                    print(f"NOT MEASURED: {result['costs'][backends[0][0]].get('error')}", file=sys.stderr)
                    status = 3
                    done(step, t0)
                    break
            elif step == "engine":
                from bench.gpu_engine import run_engine

                ctxs = result["costs"][result["primary"]]["contexts"] if "costs" in result else {}
                table = ctxs.get("512") or (ctxs[min(ctxs, key=int)] if ctxs else None)
                result["engine"] = run_engine(
                    result["models"]["target"]["path"],
                    table,
                    max_tokens=args.engine_tokens,
                    allow_cpu=args.allow_cpu,
                )
            elif step == "explore":
                from bench.gpu_engine import run_explore

                models = result["models"]
                result["explore"] = run_explore(
                    models["target"]["path"],
                    models["draft"]["path"],
                    max_tokens=args.engine_tokens,
                    repeats=args.explore_repeats,
                    allow_cpu=args.allow_cpu,
                )
            elif step == "acceptance":
                from bench.gpu_engine import ACCEPTANCE_MODES, run_acceptance
                from bench.gpu_models import write_walk_models

                result["walk_models"] = write_walk_models(work, args.shapes)
                write(args.out, result)

                def keep(partial: dict[str, Any]) -> None:
                    result["acceptance"] = partial
                    write(args.out, result)

                result["acceptance"] = run_acceptance(
                    result["walk_models"],
                    modes=args.acceptance_modes or ACCEPTANCE_MODES,
                    max_tokens=args.engine_tokens,
                    repeats=args.acceptance_repeats,
                    allow_cpu=args.allow_cpu,
                    on_pair=keep,
                    trace=args.acceptance_trace,
                )
            elif step == "replay":
                result["replay"] = run_replay(args, result)
            elif step == "lossless":
                from bench.gpu_lossless import PAIRS, run_lossless

                pairs = tuple(x for x in args.lossless_pairs.split(",") if x) or PAIRS
                result["lossless"] = run_lossless(work / "tiny", pairs=pairs, allow_cpu=args.allow_cpu)
                if result["lossless"]["total"]["failures"] or result["lossless"]["errors"]:
                    status = status or 1
            elif step == "backends":
                for name, site in backends[1:]:
                    result.setdefault("costs", {})[name] = run_costs(name, site, result["models"], args, work)
                    write(args.out, result)
        except Exception as e:  # a step that fails is recorded, and the others still run
            result.setdefault("errors", {})[step] = f"{type(e).__name__}: {e}"
            print(f"{step} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            from bench.gpu_costs import NotOnGPU

            status = 3 if isinstance(e, NotOnGPU) else status or 1
        done(step, t0)
    result["summary"] = summary_lines(result)
    write(args.out, result)
    print("\n".join(result["summary"]))
    print(f"\nresults: {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
