"""Peak memory of a benchmark's loads: a process that loads the target alone and generates plainly, and
one that loads the pair and generates speculatively, each measured in a child process of its own."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path


def peak_rss(args: argparse.Namespace) -> dict[str, float]:
    """Peak RSS (MB) of a process that loads the target alone and generates plainly, and of one
    that loads the pair and generates speculatively (n_max 5), on the first prompt."""
    from bench.run import REPO, load_prompts

    prompts = load_prompts(args.prompts, 1, args.categories)
    out = {}
    for name, draft, mode in (("plain", None, "plain"), ("speculative", args.draft, "speculative")):
        if mode == "speculative" and not args.draft:
            continue
        cmd = [
            sys.executable,
            "-m",
            "bench.rss",
            "--target",
            args.target,
            "--mode",
            mode,
            "--max-tokens",
            str(args.max_tokens),
            "--ctx",
            str(args.ctx),
            "--prompt",
            prompts[0]["prompt"],
        ]
        if draft:
            cmd += ["--draft", draft]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
        out[name] = float(res.stdout.strip().splitlines()[-1])
    if args.draft:
        out["draft_file_mb"] = os.path.getsize(args.draft) / 1e6
        out["budget_mb"] = out["plain"] + out["draft_file_mb"] + 300
    return out


def rss_child(argv: list[str]) -> None:
    from app.engine.engine import Engine, GenerationSettings, LoadSettings

    p = argparse.ArgumentParser()
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--mode")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--ctx", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--prompt")
    a = p.parse_args(argv)
    with Engine(LoadSettings(target=a.target, draft=a.draft, n_ctx=a.ctx, n_threads=a.threads)) as eng:
        ids = eng.chat_prompt([{"role": "user", "content": a.prompt}])
        eng.run(ids, GenerationSettings(mode=a.mode, max_tokens=a.max_tokens, n_max=5, adaptive=False))
    print(peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak resident set, MiB. On Linux from VmHWM: ``ru_maxrss`` also counts the
    memory of the parent this process was forked from (the kernel keeps it across exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


if __name__ == "__main__":
    rss_child(sys.argv[1:])
