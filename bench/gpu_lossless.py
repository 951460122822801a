"""Losslessness on the GPU: the tests' tiny real models (llama, qwen2, and the qwen35 hybrid, gemma3
sliding window, qwen3moe and mamba2 recurrent ones of :mod:`app.tiny_arch`) through the engine process
with every layer on the GPU; greedy speculative, lookup and auto output must equal plain output token
for token, or part from it at a numerical tie (the target's top-two logits closer than
``bench.summary.TIE_GAP``), counted. A difference at a wider gap is a failure.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.gpu_costs import NotOnGPU, gpu_bound_bytes
from bench.gpu_engine import check_engine_on_gpu, log_since

PROMPTS = (
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Hello world! How are you today? Hello world! How are",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def add(self):",
    "Speculative decoding lets a small draft model propose several tokens, and the large target",
    "Local language models run on your own computer, with no data sent to a server. Local language",
)
MODES = ("speculative", "lookup", "auto")
PAIRS = ("llama", "qwen2", "qwen35", "gemma3", "qwen3moe", "mamba2")


def write_pairs(folder: Path, names: tuple[str, ...] = PAIRS) -> dict[str, tuple[Path, Path]]:
    """The tiny target/draft pairs, as the tests write them."""
    from app.tiny_arch import write_tiny_arch_pair
    from app.tiny_gguf import write_tiny_pair

    out: dict[str, tuple[Path, Path]] = {}
    for name in names:
        where = Path(folder) / name
        out[name] = write_tiny_pair(where) if name == "llama" else write_tiny_arch_pair(where, name)  # type: ignore[arg-type]
    return out


def _tokens(client: Any, prompt: list[int], gs: Any) -> tuple[list[int], Any]:
    from app.engine.events import Finished

    fin = None
    for ev in client.generate(prompt=prompt, settings=gs):
        if isinstance(ev, Finished):
            fin = ev
    assert fin is not None
    return list(fin.tokens), fin.stats


def check_pair(
    client: Any,
    target: Path,
    draft: Path,
    *,
    max_tokens: int,
    n_maxes: tuple[int, ...],
    prompts: tuple[str, ...] = PROMPTS,
    allow_cpu: bool,
    threads: int | None = None,
) -> dict[str, Any]:
    """One pair: every prompt in every mode against plain decoding."""
    from app.engine import GenerationSettings, LoadSettings
    from bench.summary import TIE_GAP

    gpu = 0 if allow_cpu else -1
    _, offset = log_since(client.log_path, 0)
    client.load(
        LoadSettings(
            str(target), str(draft), n_ctx=1024, n_threads=threads, n_gpu_layers=gpu, n_gpu_layers_draft=gpu
        )
    )
    lines, _ = log_since(client.log_path, offset)
    size = gpu_bound_bytes(target) + gpu_bound_bytes(draft)
    offloaded = check_engine_on_gpu(lines, 2, allow_cpu=allow_cpu, file_bytes=size)
    counts = {"runs": 0, "equal": 0, "ties": 0, "failures": 0, "drafted": 0, "accepted": 0}
    failures: list[dict[str, Any]] = []
    for text in prompts:
        prompt = client.tokenize(text)
        plain, _ = _tokens(client, prompt, GenerationSettings(mode="plain", max_tokens=max_tokens))
        for mode in MODES:
            for n_max in n_maxes if mode != "auto" else (8,):
                gs = GenerationSettings(mode=mode, n_max=n_max, adaptive=False, max_tokens=max_tokens)
                got, stats = _tokens(client, prompt, gs)
                counts["runs"] += 1
                counts["drafted"] += stats.n_drafted
                counts["accepted"] += stats.n_accepted
                if got == plain:
                    counts["equal"] += 1
                    continue
                at = next((i for i, (a, b) in enumerate(zip(plain, got, strict=False)) if a != b), None)
                at = min(len(plain), len(got)) if at is None else at
                gap = client.top2_gap(prompt + plain[:at])
                if gap < TIE_GAP:
                    counts["ties"] += 1
                else:
                    counts["failures"] += 1
                    failures.append({"prompt": text, "mode": mode, "n_max": n_max, "at": at, "gap": gap})
    return {**counts, "offloaded": offloaded, "failed": failures}


def run_lossless(
    folder: Path,
    *,
    pairs: tuple[str, ...] = PAIRS,
    max_tokens: int = 48,
    n_maxes: tuple[int, ...] = (1, 4, 16),
    prompts: tuple[str, ...] = PROMPTS,
    allow_cpu: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """Every pair through one engine process; per pair the counts, and the totals."""
    from app.engine import EngineClient

    t0 = time.perf_counter()
    files = write_pairs(folder, pairs)
    out: dict[str, Any] = {"max_tokens": max_tokens, "n_maxes": list(n_maxes), "pairs": {}}
    with EngineClient() as client:
        for name, (target, draft) in files.items():
            try:
                out["pairs"][name] = check_pair(
                    client,
                    target,
                    draft,
                    max_tokens=max_tokens,
                    n_maxes=n_maxes,
                    prompts=prompts,
                    allow_cpu=allow_cpu,
                    threads=threads,
                )
            except NotOnGPU:
                raise
            except Exception as e:  # one architecture failing on a backend is a finding, not the end
                out["pairs"][name] = {"error": f"{type(e).__name__}: {e}"}
    keys = ("runs", "equal", "ties", "failures")
    out["total"] = {k: sum(p.get(k, 0) for p in out["pairs"].values()) for k in keys}
    out["errors"] = [n for n, p in out["pairs"].items() if "error" in p]
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out
