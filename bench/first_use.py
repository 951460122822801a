"""Per batch size, a model's first evaluation against its later ones, in decode steps, in a context
made as the engine makes the target's (4,096 tokens): what a warm-up that times each size once, in a
fresh process, reads. ::

    python -m bench.first_use MODEL.gguf [--n-gpu-layers -1] [--out first-use.json]

Sizes are taken in the warm-up's order (increasing), each after a decode step; then ``--repeats``
more passes. Each timing is relative to the median step of the run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

SIZES = (2, 3, 4, 6, 8, 9, 12, 16, 32, 64)


def measure(path: str, *, n_gpu_layers: int = 0, repeats: int = 3, prefix: int = 100) -> dict[str, Any]:
    from app.engine.llama import Context, Model

    model = Model(path, n_gpu_layers=n_gpu_layers)
    ctx = Context(model, n_ctx=4096)
    rng = random.Random(0)
    text = [rng.randrange(model.n_vocab) for _ in range(prefix + max(SIZES))]
    ctx.decode(text[:prefix], 0, logits="none")

    def timed(batch: int) -> float:
        t0 = time.perf_counter()
        n = ctx.decode(text[prefix : prefix + batch], prefix, logits="all")
        ctx.logits(n - 1)  # waits for the device
        dt = time.perf_counter() - t0
        ctx.trim(prefix)
        return dt

    try:
        timed(1)
        timed(4)  # the warm-up's discarded pass
        steps: list[float] = []
        first: dict[int, float] = {}
        for b in SIZES:
            steps.append(timed(1))
            first[b] = timed(b)
        later: dict[int, list[float]] = {b: [] for b in SIZES}
        for _ in range(repeats):
            for b in SIZES:
                steps.append(timed(1))
                later[b].append(timed(b))
    finally:
        ctx.close()
    step = statistics.median(steps)
    return {
        "model": Path(path).name,
        "backend": model.offload.describe(),
        "step_ms": round(1000 * step, 3),
        "sizes": list(SIZES),
        "first": [round(first[b] / step, 3) for b in SIZES],
        "later": [round(statistics.median(later[b]) / step, 3) for b in SIZES],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    result = measure(args.model, n_gpu_layers=args.n_gpu_layers, repeats=args.repeats)
    print(f"{result['backend']}: step {result['step_ms']} ms")
    for b, f, later in zip(result["sizes"], result["first"], result["later"], strict=True):
        print(f"batch {b:3d}: first {f:6.2f}  later {later:6.2f} steps")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
