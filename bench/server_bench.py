"""The API's cost: streaming through ``tandem serve`` against the engine client in process, one run.

The same prompts go both ways, interleaved (for each prompt and repeat the order alternates: client
first, then server first), greedy, in one mode. Each reply is timed as its caller sees it: time to
first token (from sending the request to the first text) and decode speed (the reply's tokens over
the time from the first text to the end: the same measure on both sides). The server runs as its own
process (``tandem serve``, its own engine) on 127.0.0.1 and is read with the official ``openai``
client, as an editor would; the in-process side is an :class:`~app.engine.EngineClient`. Prints
the median ratio of speeds with its spread, and the median difference in time to first token::

    python -m bench.server_bench --target T.gguf --draft D.gguf [--mode auto] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.run import DEFAULT_PROMPTS, load_prompts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def via_client(client: Any, prompt: str, settings: Any) -> tuple[float, float, int]:
    """(time to first text, decode tokens/s from it, tokens) through the engine client."""
    from app.engine import Finished, Step

    t0 = time.perf_counter()
    first = end = 0.0
    n = 0
    for ev in client.generate(messages=[{"role": "user", "content": prompt}], settings=settings):
        if isinstance(ev, Step) and ev.text and not first:
            first = time.perf_counter()
        elif isinstance(ev, Finished):
            end = time.perf_counter()
            n = ev.stats.n_generated
    return first - t0, n / (end - first) if end > first else 0.0, n


def via_server(api: Any, prompt: str, max_tokens: int, model: str) -> tuple[float, float, int]:
    """The same through the API, streamed (the token count from the usage at the end)."""
    t0 = time.perf_counter()
    first = 0.0
    usage = 0
    stream = api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    return first - t0, usage / (end - first) if end > first else 0.0, usage


def main(argv: list[str] | None = None) -> int:
    import openai

    from app.engine import EngineClient, GenerationSettings, LoadSettings

    p = argparse.ArgumentParser(prog="python -m bench.server_bench", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument("--mode", default="auto")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    args = p.parse_args(argv)

    prompts = load_prompts(args.prompts, args.limit)
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "app",
        "serve",
        "--model",
        args.target,
        "--mode",
        args.mode,
        "--port",
        str(port),
        "--no-history",  # as the client it is set against
    ]
    cmd += ["--ctx", str(args.ctx)] + (["--draft", args.draft] if args.draft else [])
    cmd += ["--threads", str(args.threads)] if args.threads else []
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    model = Path(args.target).stem
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
    load = LoadSettings(target=args.target, draft=args.draft, n_ctx=args.ctx, n_threads=args.threads)
    settings = GenerationSettings(mode=args.mode, max_tokens=args.max_tokens)
    rows: list[dict[str, Any]] = []
    try:
        with EngineClient() as client:
            client.load(load)
            deadline = time.monotonic() + 300
            while True:  # the server answers 503 until its models are loaded
                try:
                    via_server(api, "hi", 2, model)
                    break
                except (openai.APIConnectionError, openai.InternalServerError):
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("tandem serve did not come up") from None
                    time.sleep(0.5)
            via_client(client, "hi", GenerationSettings(mode=args.mode, max_tokens=2))
            for rep in range(args.repeats):
                for i, row in enumerate(prompts):
                    order = ("client", "server") if (i + rep) % 2 == 0 else ("server", "client")
                    got: dict[str, tuple[float, float, int]] = {}
                    for way in order:
                        if way == "client":
                            got[way] = via_client(client, row["prompt"], settings)
                        else:
                            got[way] = via_server(api, row["prompt"], args.max_tokens, model)
                    rows.append({"id": row["id"], "repeat": rep, **{k: list(v) for k, v in got.items()}})
                    c, s = got["client"], got["server"]
                    print(
                        f"[{len(rows)}/{args.repeats * len(prompts)}] {row['id']}: client {c[1]:.1f} tok/s "
                        f"ttft {c[0] * 1000:.0f} ms | server {s[1]:.1f} tok/s ttft {s[0] * 1000:.0f} ms",
                        file=sys.stderr,
                    )
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    ratios = [r["server"][1] / r["client"][1] for r in rows if r["client"][1] > 0 and r["server"][1] > 0]
    ttft = [(r["server"][0] - r["client"][0]) * 1000 for r in rows]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), 0, max(ratios)]
    tq = statistics.quantiles(ttft, n=4) if len(ttft) >= 4 else [min(ttft), 0, max(ttft)]
    summary = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "mode": args.mode,
        "replies": len(rows),
        "speed_ratio_median": statistics.median(ratios),
        "speed_ratio_quartiles": [q[0], q[2]],
        "client_tok_s_median": statistics.median(r["client"][1] for r in rows),
        "server_tok_s_median": statistics.median(r["server"][1] for r in rows),
        "ttft_extra_ms_median": statistics.median(ttft),
        "ttft_extra_ms_quartiles": [tq[0], tq[2]],
    }
    print(
        f"\nserver / in-process decode speed: {summary['speed_ratio_median']:.3f}x "
        f"(quartiles {q[0]:.3f}-{q[2]:.3f}) over {len(ratios)} replies, mode {args.mode}\n"
        f"time to first token through the server: {summary['ttft_extra_ms_median']:+.1f} ms "
        f"(quartiles {tq[0]:+.1f} to {tq[2]:+.1f})\n"
        f"medians: in-process {summary['client_tok_s_median']:.1f} tok/s, "
        f"server {summary['server_tok_s_median']:.1f} tok/s"
    )
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
