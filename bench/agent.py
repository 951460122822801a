"""An agent through ``tandem serve``: a scripted tool loop, plain and auto mode on the same conversations.

Each task (``bench.agent_project.TASKS``: rename a function, fix a bug, add a parameter) asks an agent
to edit a tiny Python package held in memory, with tools that list, read and write its files and run
its unit tests (in a subprocess, on a temporary copy). The model decides the calls (the first step must
read a file, and every step must call a tool: a 1.5B model otherwise writes without reading, or
writes a call as free text); the loop stops at ``finish``, a reply without calls, a reply cut short,
or ``--max-steps``. Every step re-sends the whole
conversation, as agents do, through the official ``openai`` client, greedy.

One ``tandem serve`` per mode runs as a subprocess on 127.0.0.1 (``plain`` with ``--no-history``;
``auto`` with the drafting history in a data folder of its own); each step's request goes to every
mode, the order alternating from step to step, and the conversation continues from plain decoding's
reply (greedy and lossless: every mode must write the same reply; a difference is reported). Steps are
told apart by what plain decoding wrote: ``rewrite`` (a ``write_file`` call whose content mostly repeats
the file as it was), ``call`` (other tool calls) and ``answer`` (no call). Then the servers are stopped
and started again on the same data folders, and the second pass runs the same tasks on the history
the first one left. Each repeat starts on new data folders::

    python -m bench.agent --target T.gguf --draft D.gguf [--modes plain,spec3,lookup,auto] [--repeats 2]

Prints, per pass and step kind, decode tokens/s per mode (from the server's ``timings``), the ratio to
plain (pooled, and per step: median, min-max), acceptance, and the steps' wall time; where the run had
fixed settings besides plain (``lookup``, ``spec<n>``: ``tandem serve --n-max n --no-adaptive``), each
auto mode's ratio to the best of them per pass and step kind; writes JSON (``--out``, default
``bench/results/agent-<time>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_project import SYSTEM, TASKS, Project, Task, step_kind, tool_schemas
from bench.modes import FIXED, SPEC_N, best_fixed

#: mode name -> (the server's --mode and its other drafting flags, whether it keeps a drafting history);
#: ``spec<n>``: the draft model at the fixed length n (the fixed settings, with ``plain`` and ``lookup``,
#: that auto mode is held to: see :data:`bench.modes.FIXED`)
MODES: dict[str, tuple[tuple[str, ...], bool]] = {
    "plain": (("plain",), False),
    "auto": (("auto",), True),
    "auto-nohistory": (("auto",), False),
    "lookup": (("lookup",), False),
    "speculative": (("speculative",), False),
    **{f"spec{n}": (("speculative", "--n-max", str(n), "--no-adaptive"), False) for n in range(1, 9)},
}
BASELINE = "plain"
READY_TIMEOUT = 600.0  # seconds for a server to load its models
STOP_TIMEOUT = 60.0  # seconds for a server to stop (its history saved)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(process: subprocess.Popen | None, port: int, log: Path, name: str, timeout: float) -> None:
    """Until the server on ``port`` answers ``/health`` with 200 (``tandem serve`` and llama.cpp's
    ``llama-server`` both answer 503 while they load); a clear stop if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        if process is None or process.poll() is not None:
            raise SystemExit(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:  # not listening yet, or 503 while it loads
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not load in {timeout:.0f} s")
        time.sleep(0.3)


@dataclass
class Server:
    """``tandem serve`` for one mode, as a subprocess on 127.0.0.1 with its own data folder."""

    mode: str
    data_dir: Path
    argv: list[str]  # the model arguments (--model, --draft, --ctx, --threads)
    log: Path
    process: subprocess.Popen | None = None
    port: int = 0
    api: Any = None

    def start(self) -> Server:
        drafting, history = MODES[self.mode]
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "app",
            "serve",
            *self.argv,
            "--mode",
            *drafting,
            "--port",
            str(self.port),
        ]
        cmd += [] if history else ["--no-history"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TANDEM_DATA_DIR": str(self.data_dir)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until ``/health`` says the engine is ready; then a short warm-up request."""
        import openai

        wait_healthy(self.process, self.port, self.log, f"tandem serve ({self.mode})", timeout)
        base = f"http://127.0.0.1:{self.port}/v1"
        self.api = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=1800)
        self.api.chat.completions.create(
            model="tandem", messages=[{"role": "user", "content": "Say OK."}], max_tokens=4, temperature=0
        )

    def stop(self) -> None:
        """SIGINT, as Ctrl-C: the engine stops and saves its history."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class Reply:
    """One mode's answer to one step's request."""

    content: str
    calls: list[tuple[str, str, str]]  # (id, name, arguments)
    finish: str
    tokens: int
    decode_s: float
    drafted: int
    accepted: int
    prompt_n: int  # prompt tokens evaluated (not reused from the cache)
    prompt_s: float
    wall_s: float  # the request as the agent waits for it
    # per source that drafted: its rounds, drafted and accepted tokens (the server's draft_sources)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    draft_prompt_s: float = 0.0  # the draft model's work on the prompt, where done up front

    @property
    def said(self) -> tuple[str, list[tuple[str, str]]]:
        """What the reply says (the text and the calls, without their random ids)."""
        return self.content, [(n, a) for _, n, a in self.calls]


def tool_choice(task: Task, step: int) -> Any:
    choice = task.forced[step] if step < len(task.forced) else task.then
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def ask(
    server: Server, messages: list[dict[str, Any]], tools: list[dict], choice: Any, max_tokens: int
) -> Reply:
    t0 = time.perf_counter()
    r = server.api.chat.completions.create(
        model="tandem",
        messages=messages,
        tools=tools,
        tool_choice=choice,
        temperature=0,
        max_tokens=max_tokens,
    )
    wall = time.perf_counter() - t0
    timings = (r.model_extra or {}).get("timings") or {}
    msg = r.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    return Reply(
        content=msg.content or "",
        calls=calls,
        finish=r.choices[0].finish_reason,
        tokens=r.usage.completion_tokens,
        decode_s=timings.get("predicted_ms", 0.0) / 1000,
        drafted=timings.get("draft_n", 0),
        accepted=timings.get("draft_n_accepted", 0),
        prompt_n=timings.get("prompt_n", 0),
        prompt_s=timings.get("prompt_ms", 0.0) / 1000,
        wall_s=wall,
        sources=timings.get("draft_sources") or {},
        draft_prompt_s=timings.get("draft_prompt_ms", 0.0) / 1000,
    )


@dataclass
class StepRecord:
    task: str
    step: int
    kind: str
    same: bool  # every mode wrote the baseline's reply
    calls: list[str]  # the baseline's tool names
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)


def run_task(
    task: Task, servers: dict[str, Server], *, max_steps: int, max_tokens: int, shift: int = 0
) -> list[StepRecord]:
    """One task's agent loop, every step's request sent to every mode (continuing from the baseline)."""
    project = Project()
    tools = tool_schemas(list(project.files))
    system = SYSTEM.format(files=", ".join(sorted(project.files)))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task.prompt},
    ]
    names = list(servers)
    records = []
    for step in range(max_steps):
        k = (step + shift) % len(names)
        got = {
            name: ask(servers[name], messages, tools, tool_choice(task, step), max_tokens)
            for name in names[k:] + names[:k]
        }
        base = got[BASELINE]
        kind = step_kind([(n, a) for _, n, a in base.calls], project.files)
        same = all(r.said == base.said for r in got.values())
        rec = StepRecord(task.id, step, kind, same, [n for _, n, _ in base.calls])
        rec.replies = {name: asdict(got[name]) for name in names}
        records.append(rec)
        tag = "" if same else "  DIFFERS: " + ", ".join(n for n, r in got.items() if r.said != base.said)
        speeds = "  ".join(f"{n} {r.tokens / r.decode_s if r.decode_s else 0:.1f}" for n, r in got.items())
        print(
            f"  {task.id} step {step}: {kind} {rec.calls or ''} {base.tokens} tokens | tok/s {speeds}{tag}",
            file=sys.stderr,
        )
        assistant: dict[str, Any] = {"role": "assistant", "content": base.content or None}
        if base.calls:
            assistant["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in base.calls
            ]
        messages.append(assistant)
        if not base.calls or base.finish == "length" or "finish" in rec.calls:
            break
        for call_id, name, arguments in base.calls:
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": project.call(name, arguments)}
            )
    return records


def history_files(data_dir: Path) -> dict[str, int]:
    folder = data_dir / "history"
    return {p.name: p.stat().st_size for p in sorted(folder.glob("*"))} if folder.is_dir() else {}


def run(args: argparse.Namespace, tasks: tuple[Task, ...] = TASKS) -> dict[str, Any]:
    """Every repeat: pass 1 on new data folders, the servers restarted, pass 2 on the same folders."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    modes = [x for m in modes for x in ([f"spec{n}" for n in SPEC_N] if m == "spec" else [m])]
    if BASELINE not in modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: {BASELINE} and any of {', '.join(MODES)}, or spec")
    modes = [BASELINE] + [m for m in modes if m != BASELINE]
    argv = ["--model", str(args.target), "--ctx", str(args.ctx)]
    argv += ["--draft", str(args.draft)] if args.draft else []
    argv += ["--threads", str(args.threads)] if args.threads else []
    passes = 1 if args.no_second_pass else 2
    partial: Path | None = getattr(args, "partial", None)
    steps: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tandem-agent-bench-") as tmp:
        root = Path(tmp)
        for rep in range(args.repeats):
            for pass_no in range(1, passes + 1):
                servers = {m: Server(m, root / f"repeat-{rep}" / m, argv, root / f"{m}.log") for m in modes}
                try:
                    # one at a time: each engine times its verify batches at load, and two loading
                    # at once on a small CPU slow each other tens of times, which those timings keep
                    for s in servers.values():
                        s.start().wait_ready()
                    print(f"repeat {rep + 1}, pass {pass_no}", file=sys.stderr)
                    for i, task in enumerate(tasks):
                        for rec in run_task(
                            task, servers, max_steps=args.max_steps, max_tokens=args.max_tokens, shift=rep + i
                        ):
                            steps.append({"repeat": rep, "pass": pass_no, **asdict(rec)})
                        if partial is not None:  # what is done so far, should the run be cut off
                            partial.write_text(
                                json.dumps({"modes": modes, "steps": steps, "history": history})
                            )
                finally:
                    for s in servers.values():
                        s.stop()
                for m in modes:
                    if MODES[m][1]:
                        history.append(
                            {
                                "repeat": rep,
                                "pass": pass_no,
                                "mode": m,
                                "files": history_files(servers[m].data_dir),
                            }
                        )
    from bench.run import load_average, machine

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "target": Path(args.target).name,
        "draft": Path(args.draft).name if args.draft else None,
        "modes": modes,
        "repeats": args.repeats,
        "passes": passes,
        "max_steps": args.max_steps,
        "max_tokens": args.max_tokens,
        "load_average_after": load_average(),
        "history": history,
    }
    return {"meta": meta, "steps": steps}


GROUPS = {"rewrite": ("rewrite",), "other": ("call", "answer"), "all": ("rewrite", "call", "answer")}


def _rate(replies: list[dict[str, Any]], gen: bool = False) -> float:
    """Tokens per second of decode time (``gen``: of generation time, the draft's prompt work too)."""
    t = sum(r["decode_s"] + (r.get("draft_prompt_s", 0.0) if gen else 0.0) for r in replies)
    return sum(r["tokens"] for r in replies) / t if t else 0.0


def _speed(r: dict[str, Any]) -> float:
    return r["tokens"] / r["decode_s"] if r["decode_s"] > 0 else 0.0


def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per pass and step group, per mode: steps, tokens, pooled decode tokens/s, the ratio to the baseline
    (pooled; per step median, min, max; per repeat), acceptance, wall seconds and their ratio."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    modes = data["meta"]["modes"]
    for pass_no in sorted({s["pass"] for s in data["steps"]}):
        for group, kinds in GROUPS.items():
            rows = [s for s in data["steps"] if s["pass"] == pass_no and s["kind"] in kinds]
            if not rows:
                continue
            base = [s["replies"][BASELINE] for s in rows]
            for m in modes:
                got = [s["replies"][m] for s in rows]
                per_step = [
                    _speed(r) / _speed(b) for r, b in zip(got, base, strict=True) if _speed(r) and _speed(b)
                ]
                reps = sorted({s["repeat"] for s in rows})
                per_rep = []
                for rep in reps:
                    sub = [s for s in rows if s["repeat"] == rep]
                    b = _rate([s["replies"][BASELINE] for s in sub])
                    per_rep.append(_rate([s["replies"][m] for s in sub]) / b if b else 0.0)
                drafted = sum(r["drafted"] for r in got)
                wall, base_wall = sum(r["wall_s"] for r in got), sum(r["wall_s"] for r in base)
                pooled_base = _rate(base)
                out.setdefault(f"pass {pass_no}", {}).setdefault(group, {})[m] = {
                    "steps": len(rows),
                    "tokens": sum(r["tokens"] for r in got),
                    "tok_s": round(_rate(got), 2),
                    "tok_s_gen": round(_rate(got, gen=True), 2),
                    "ratio": round(_rate(got) / pooled_base, 3) if pooled_base else 0.0,
                    "ratio_median": round(statistics.median(per_step), 3) if per_step else 0.0,
                    "ratio_min": round(min(per_step), 3) if per_step else 0.0,
                    "ratio_max": round(max(per_step), 3) if per_step else 0.0,
                    "ratio_repeats": [round(x, 3) for x in per_rep],
                    "acceptance": round(sum(r["accepted"] for r in got) / drafted, 3) if drafted else None,
                    "wall_s": round(wall, 1),
                    "wall_ratio": round(base_wall / wall, 3) if wall else 0.0,
                    "differs": sum(not s["same"] for s in rows),
                }
            per_mode = out[f"pass {pass_no}"][group]
            for x in ("", "_gen"):  # on decode time, and on generation time
                best = best_fixed({m: v[f"tok_s{x}"] for m, v in per_mode.items()})
                for m, v in per_mode.items():
                    if best is not None and best[1] and m.startswith("auto"):
                        v[f"best_fixed{x}"], v[f"vs_best{x}"] = best[0], round(v[f"tok_s{x}"] / best[1], 3)
    return out


def markdown(summary: dict[str, Any], modes: list[str]) -> str:
    """The summary as a Markdown table (one row per pass, step group and mode), then each auto mode's
    ratio to the best fixed setting of the run (:data:`bench.modes.FIXED`; on decode time, and on
    generation time: the draft's prompt work too) where the run had one besides plain decoding."""
    lines = [
        "| pass | steps | mode | tokens | decode tok/s | vs plain (pooled) | per step: median (min-max) "
        "| acceptance | wall s (speedup) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pass_name, groups in summary.items():
        for group, per_mode in groups.items():
            for m in modes:
                r = per_mode[m]
                acc = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
                lines.append(
                    f"| {pass_name} | {group} ({r['steps']}) | {m} | {r['tokens']} | {r['tok_s']:.1f} "
                    f"| {r['ratio']:.2f}x | {r['ratio_median']:.2f}x "
                    f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) "
                    f"| {acc} | {r['wall_s']:.0f} ({r['wall_ratio']:.2f}x) |"
                )
    against = [
        f"| {pass_name} | {group} | {m} | {per_mode[v['best_fixed']]['ratio']:.2f}x ({v['best_fixed']}) "
        f"| {v['ratio']:.2f}x | {v['vs_best']:.2f}x | {v['vs_best_gen']:.2f}x ({v['best_fixed_gen']}) |"
        for pass_name, groups in summary.items()
        for group, per_mode in groups.items()
        for m, v in per_mode.items()
        if "best_fixed" in v
    ]
    if against and any(m in FIXED and m != BASELINE for m in modes):
        lines += [
            "",
            "| pass | steps | mode | best fixed setting (vs plain) | mode vs plain | mode / best fixed "
            "| on generation time |",
            "|---|---|---|---|---|---|---|",
            *against,
        ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target GGUF")
    p.add_argument("--draft", help="draft GGUF")
    p.add_argument(
        "--modes",
        default="plain,auto",
        help=f"comma-separated, from: {', '.join(MODES)}; spec: spec{','.join(map(str, SPEC_N))} (fixed "
        "settings, with plain and lookup: auto is held to the best of them per step group). Every mode's "
        "server runs at once, each holding the pair in memory",
    )
    p.add_argument("--tasks", default="", help="only these task ids (comma-separated)")
    p.add_argument(
        "--repeats", type=int, default=2, help="the whole workload this many times (new data folders)"
    )
    p.add_argument("--max-steps", type=int, default=6, help="steps per task at most")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens per reply at most")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-second-pass", action="store_true", help="skip the pass after the restart")
    p.add_argument("--out", type=Path, default=None, help="results JSON")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.agent", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    wanted = {t for t in args.tasks.split(",") if t}
    tasks = tuple(t for t in TASKS if not wanted or t.id in wanted)
    if wanted - {t.id for t in TASKS}:
        raise SystemExit(f"--tasks: from {', '.join(t.id for t in TASKS)}")
    out = args.out or Path(__file__).with_name("results") / f"agent-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    args.partial = out.with_suffix(".partial.json")
    data = run(args, tasks)
    summary = summarize(data)
    data["summary"] = summary
    out.write_text(json.dumps(data, indent=1))
    args.partial.unlink(missing_ok=True)
    meta = data["meta"]
    print(
        f"\n{meta['machine']['cpu']}, {meta['machine']['cores_logical']} cores, {meta['date']}; "
        f"load after: {meta['load_average_after']}; {meta['target']} + {meta['draft']}"
    )
    print(markdown(summary, meta["modes"]))
    differs = sum(not s["same"] for s in data["steps"])
    print(f"\nsteps where a mode wrote another reply than {BASELINE}: {differs}; results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
