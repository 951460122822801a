"""Lossless on a Vulkan device: every mode's greedy reply against plain decoding's, and the ties.

    GGML_VK_VISIBLE_DEVICES=0 python -m bench.vulkan_check --target T.gguf --draft D.gguf

1. Loads the pair with every layer on the GPU llama.cpp sees (``--gpu-layers all``; the draft follows),
   with ``GGML_VK_VISIBLE_DEVICES`` as given (``0`` by default: Mesa's lavapipe where it is the only
   device). The placement must name a Vulkan device. For each prompt (chat-templated, from
   ``bench/prompts.jsonl``) each mode's greedy reply is compared with plain decoding's on the same
   device; where two replies part, the target's top-two logit gap at that token (evaluated from
   scratch, as ``tandem generate --compare-plain`` does) must be under ``TIE_GAP`` (0.5): a numerical
   tie between a batch and single tokens, not a bug.
2. Loads the pair again in a fresh engine process without ``GGML_VK_VISIBLE_DEVICES`` and with auto
   offload: both models must stay on the CPU (llama.cpp skips a CPU-type Vulkan device, and auto offload
   never picks a software renderer), and the placement says why.

Prints a line per reply; ``--json FILE`` keeps every figure. Exit 1 on a difference that is not a tie or a
wrong placement. On lavapipe a 135M model decodes at about a token a second once Mesa's shader cache
(``MESA_SHADER_CACHE_DIR``, by default the tests' ``~/.cache/tandem/mesa-shader-cache``) is warm, so the
defaults are short: 3 prompts, 32 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TIE_GAP = 0.5  # the benchmarks' and --compare-plain's threshold
MODES = ("speculative", "auto", "lookup")


def _first_difference(a: list[int], b: list[int]) -> int | None:
    j = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if j is None and len(a) != len(b):
        j = min(len(a), len(b))
    return j


def _reply(client: Any, prompt: list[int], settings: Any) -> Any:
    from app.engine import Finished

    last = None
    for event in client.generate(prompt=prompt, settings=settings):
        last = event
    assert isinstance(last, Finished)
    return last


def check_on_device(args: argparse.Namespace, prompts: list[str]) -> tuple[dict[str, Any], list[str]]:
    from app.engine import EngineClient, GenerationSettings, LoadSettings

    problems: list[str] = []
    os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", args.device)
    out: dict[str, Any] = {"GGML_VK_VISIBLE_DEVICES": os.environ["GGML_VK_VISIBLE_DEVICES"], "replies": []}
    with EngineClient(start_timeout=600.0) as client:
        t0 = time.perf_counter()
        info = client.load(
            LoadSettings(
                target=args.target, draft=args.draft, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=-1
            )
        )
        out["load_s"] = round(time.perf_counter() - t0, 1)
        out["placement"] = info.placement()
        out["engine"] = info.to_dict()
        print(f"on the device: {info.placement()} (loaded in {out['load_s']} s)", flush=True)
        for model in (info.target, info.draft):
            if model is not None and (model.offload.backend != "Vulkan" or not model.offload.on_gpu):
                problems.append(
                    f"{Path(model.path).name} is not on a Vulkan device: {model.offload.describe()}"
                )
        if problems:
            return out, problems
        for i, text in enumerate(prompts, 1):
            prompt = client.tokenize(messages=[{"role": "user", "content": text}])
            t0 = time.perf_counter()
            plain = _reply(client, prompt, GenerationSettings(mode="plain", max_tokens=args.max_tokens))
            plain_s = time.perf_counter() - t0
            print(f"prompt {i}: plain {len(plain.tokens)} tokens in {plain_s:.1f} s", flush=True)
            for mode in MODES:
                t0 = time.perf_counter()
                fin = _reply(client, prompt, GenerationSettings(mode=mode, max_tokens=args.max_tokens))
                row: dict[str, Any] = {
                    "prompt": i,
                    "mode": mode,
                    "tokens": len(fin.tokens),
                    "seconds": round(time.perf_counter() - t0, 1),
                    "drafted": fin.stats.n_drafted,
                    "accepted": fin.stats.n_accepted,
                }
                j = _first_difference(list(plain.tokens), list(fin.tokens))
                if j is None:
                    row["identical"] = True
                    words = "the same tokens as plain"
                else:
                    gap = client.top2_gap([*prompt, *plain.tokens[:j]])
                    row.update(identical=False, first_difference=j, top2_gap=round(gap, 4), tie=gap < TIE_GAP)
                    words = f"parts from plain at token {j + 1}, top-two logit gap {gap:.3f}"
                    words += ": a numerical tie" if gap < TIE_GAP else ": NOT a tie"
                    if gap >= TIE_GAP:
                        problems.append(f"prompt {i} {mode}: {words}")
                print(
                    f"  {mode:>11}: {words} ({row['accepted']}/{row['drafted']} drafted accepted, "
                    f"{row['seconds']} s)",
                    flush=True,
                )
                out["replies"].append(row)
    return out, problems


def check_auto_without_the_variable(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from app.engine import EngineClient, LoadSettings

    saved = os.environ.pop("GGML_VK_VISIBLE_DEVICES", None)
    try:
        with EngineClient(start_timeout=600.0) as client:
            info = client.load(
                LoadSettings(target=args.target, draft=args.draft, n_ctx=args.ctx, n_threads=args.threads)
            )
    finally:
        if saved is not None:
            os.environ["GGML_VK_VISIBLE_DEVICES"] = saved
    print(f"auto, without GGML_VK_VISIBLE_DEVICES: {info.placement()}", flush=True)
    problems = []
    on_gpu = [m for m in (info.target, info.draft) if m is not None and m.offload.on_gpu]
    if on_gpu and any(m.offload.device_kind == "software" for m in on_gpu):
        problems.append(f"auto offload used a software renderer: {info.placement()}")
    elif not on_gpu and not info.placement().startswith("CPU only ("):
        problems.append(f"the placement does not say why the models are on the CPU: {info.placement()}")
    return {"placement": info.placement(), "on_gpu": bool(on_gpu)}, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vulkan_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--device", default="0", help="GGML_VK_VISIBLE_DEVICES when not set (default 0)")
    p.add_argument("--prompts", type=int, default=3, help="how many of bench/prompts.jsonl (default 3)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    # the tests' shader cache: lavapipe compiles each pipeline once, minutes for a new model
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem" / "mesa-shader-cache"
    os.environ.setdefault("MESA_SHADER_CACHE_DIR", str(cache))
    lines = (Path(__file__).with_name("prompts.jsonl")).read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.prompts]

    device, problems = check_on_device(args, prompts)
    auto, more = check_auto_without_the_variable(args)
    problems += more
    result = {"device": device, "auto": auto, "problems": problems}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    ties = sum(1 for r in device["replies"] if not r["identical"])
    print(f"{len(device['replies'])} replies compared, {ties} parted at a tie; problems: {len(problems)}")
    for line in problems:
        print(f"PROBLEM: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
