"""What undoing a draft costs on a hybrid model: verify batches with per-token recurrent snapshots in
place, beside the same model without them and a plain-attention model of the same shape.

Writes, in seconds, a synthetic Qwen3.5-2B (``app.tiny_arch.QWEN35_2B_SHAPE``: 18 Gated DeltaNet + 6
attention layers, random Q4_0 weights) and a dense attention model of about its size
(``DENSE_2B_SHAPE``: 26 Qwen3 layers of the same width and vocabulary), then times
on this machine, at ``--context`` tokens of context, interleaved and repeated:

- a verify batch of b tokens (logits for every row, as verification asks) relative to one decode step,
  for the hybrid model with the engine's snapshots (``n_rs_seq`` = 16: what auto mode's cost table
  measures), without snapshots, and for the attention model;
- undoing the whole draft after it (the pending token stays, as in the engine): by snapshots
  (b - 1 <= 16), else by the checkpoint the engine saves before such a batch (its save is part of the
  batch's time, as in the engine);
- saving and restoring a checkpoint, and the state's size.

Random weights say nothing of acceptance, only of costs. ``python -m bench.rollback_costs``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from app.engine.llama import Context, Model
from app.engine.sequence import PROMPT
from app.engine.speculative import TargetCache
from app.gguf.memory import RECURRENT_SNAPSHOTS
from app.tiny_arch import DENSE_2B_SHAPE, QWEN35_2B_SHAPE, count_params, write_tiny_model

BATCHES = (1, 2, 4, 8, 12, 16, 17, 24, 32, 64)


# the hybrid's shape and the dense model's beside it; tiny: the tests' shapes, to check the benchmark
SHAPES = {"2b": (QWEN35_2B_SHAPE, DENSE_2B_SHAPE), "tiny": ({}, {})}


def _configs(directory: Path, quant: str, shape: str) -> dict[str, tuple[Path, int]]:
    """The models to compare: name -> (file, snapshots)."""
    hybrid = directory / f"qwen35-{shape}-{quant.lower()}.gguf"
    attention = directory / f"dense-{shape}-{quant.lower()}.gguf"
    hybrid_shape, dense_shape = SHAPES[shape]
    t0 = time.perf_counter()
    if not hybrid.exists():
        write_tiny_model(hybrid, "qwen35", shape=hybrid_shape, quant=quant, name="synthetic-qwen3.5")
    if not attention.exists():
        write_tiny_model(attention, "qwen3", shape=dense_shape, quant=quant, name="synthetic-dense")
    print(f"models written in {time.perf_counter() - t0:.1f} s")
    return {
        "hybrid, 16 snapshots": (hybrid, RECURRENT_SNAPSHOTS),
        "hybrid, checkpoints only": (hybrid, 0),
        "attention": (attention, 0),
    }


def measure(
    directory: Path,
    *,
    quant: str,
    context: int,
    repeats: int,
    threads: int,
    shape: str = "2b",
    batches: tuple[int, ...] = BATCHES,
) -> dict:
    configs = _configs(directory, quant, shape)
    models: dict[Path, Model] = {}
    seqs: dict[str, TargetCache] = {}
    rng = np.random.default_rng(0)
    text = [int(t) for t in rng.integers(0, 509, size=context + max(BATCHES) + 1)]  # the real tokens
    for name, (path, snapshots) in configs.items():
        model = models.setdefault(path, Model(path))
        ctx = Context(model, n_ctx=context + 2 * max(BATCHES), n_threads=threads, n_rs_seq=snapshots)
        seq = TargetCache(ctx)
        seq.extend(text[:context], logits="none")
        seq.checkpoint(PROMPT)  # where each measurement goes back to, as at the end of a prompt
        seqs[name] = seq
    if 1 not in batches:
        batches = (1, *batches)  # the decode step every ratio is taken against
    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in seqs}
    undo: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in seqs}
    for r in range(repeats + 1):  # the first pass warms the buffers and is not kept
        for b in batches:
            for name, seq in seqs.items():
                t0 = time.perf_counter()
                seq.verify_batch(text[context], text[context + 1 : context + b])
                t1 = time.perf_counter()
                seq.rollback(context + 1)  # the whole draft rejected (the pending token stays)
                t2 = time.perf_counter()
                seq.rollback(context)  # back to the prompt's end for the next measurement
                if r:
                    times[name][b].append(t1 - t0)
                    undo[name][b].append(t2 - t1)
    state = {}
    for name, seq in seqs.items():
        if seq.memory.rollback.value == "trim":
            continue
        saves, loads = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            size = seq.ctx.save_state(0)
            t1 = time.perf_counter()
            seq.ctx.load_state(0)
            saves.append(t1 - t0)
            loads.append(time.perf_counter() - t1)
        state[name] = {"bytes": size, "save_ms": 1e3 * statistics.median(saves),
                       "restore_ms": 1e3 * statistics.median(loads)}  # fmt: skip
    out = {
        "shape": shape,
        "params": {
            "hybrid": count_params("qwen35", SHAPES[shape][0]),
            "attention": count_params("qwen3", SHAPES[shape][1]),
        },
        "quant": quant,
        "context": context,
        "threads": threads,
        "repeats": repeats,
        "batches": list(batches),
        "step_ms": {n: 1e3 * statistics.median(t[1]) for n, t in times.items()},
        "ratio": {},
        "undo_ms": {},
        "checkpoint": state,
    }
    for name, t in times.items():
        step = statistics.median(t[1])
        out["ratio"][name] = {
            b: [statistics.median(v) / step, min(v) / step, max(v) / step] for b, v in t.items()
        }
        out["undo_ms"][name] = {b: 1e3 * statistics.median(v) for b, v in undo[name].items()}
    for seq in seqs.values():
        seq.ctx.close()
    for model in models.values():
        model.close()
    return out


def table(res: dict) -> str:
    names = list(res["ratio"])
    lines = [
        "| batch | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for b in map(int, res["ratio"][names[0]]):
        cells = []
        for n in names:
            med, lo, hi = res["ratio"][n][b]
            cells.append(f"{med:.2f} ({lo:.2f}-{hi:.2f}); undo {res['undo_ms'][n][b]:.1f} ms")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    steps = ", ".join(f"{n} {v:.1f} ms" for n, v in res["step_ms"].items())
    lines.append(f"\ndecode step: {steps}")
    for n, s in res["checkpoint"].items():
        lines.append(
            f"checkpoint ({n}): {s['bytes'] / 2**20:.1f} MiB, save {s['save_ms']:.1f} ms, "
            f"restore {s['restore_ms']:.1f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rollback_costs", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dir", type=Path, default=None, help="where to write the models (default: a temp folder)"
    )
    p.add_argument("--quant", choices=("Q4_0", "Q8_0"), default="Q4_0")
    p.add_argument("--shape", choices=tuple(SHAPES), default="2b", help="2b (default) or the tests' tiny one")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes (comma-separated)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-rollback-") as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        res = measure(folder, quant=args.quant, context=args.context, repeats=args.repeats,
                      threads=args.threads, shape=args.shape,
                      batches=tuple(int(b) for b in args.batches.split(",")))  # fmt: skip
    print(f"synthetic Qwen3.5 ({res['params']['hybrid']:,} parameters) against dense attention "
          f"({res['params']['attention']:,}), {res['quant']}, {res['context']} tokens of context, "
          f"{res['threads']} threads; verify batch / decode step, median (min-max) of "
          f"{res['repeats']}")  # fmt: skip
    print(table(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
