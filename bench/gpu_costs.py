"""The cost table auto mode plans with, measured on one backend: the target's decode step and verify
batches of 1 to 64 tokens, and the draft's batches in the target's decode steps, after 512 and 4096
tokens of context.

Run by :mod:`bench.gpu_check` in a child process per backend (each llama-cpp-python build on its own
``PYTHONPATH``), or alone::

    python -m bench.gpu_costs --target T.gguf --draft D.gguf --out costs.json

Each batch is evaluated as a verification evaluates it (logits of every row, read back: reading them
waits for the GPU), then removed from the cache. Sizes are timed in a shuffled order per repeat with a
decode step between every two, and each timing is taken relative to the median step of its repeat, so
a clock that drifts during the run moves numerator and denominator together. Reported per size: the
median ratio and its quartiles over the repeats, and the median milliseconds. Each repeat ends with
decode steps timed back to back (``run_step_ms``): a step between two batch sizes is not the step
plain decoding takes on CUDA, where the two evaluations after a change of shape run without their CUDA
graph (an H200: 5.17 ms between batches, 4.07 ms a token in plain decoding).

The models must be on the GPU: every layer offloaded by llama.cpp's own count in its log, and the
device's free memory down by most of the file's size; otherwise it stops with exit code 3 (unless
``--allow-cpu``: the CPU machinery test).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import re
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
BUFFER = re.compile(r"(\S+) model buffer size = +([\d.]+) MiB")
EXIT_NOT_ON_GPU = 3


class NotOnGPU(RuntimeError):
    """The models did not land on a GPU (a CPU build, no device, or a partial offload)."""


def gpu_devices() -> list[dict[str, Any]]:
    from app.engine.llama import devices

    return [
        {
            "name": d.name,
            "description": d.description,
            "kind": d.kind,
            "free": d.memory_free,
            "total": d.memory_total,
        }
        for d in devices()
    ]


def offload_lines(lines: list[str]) -> list[tuple[int, int]]:
    """``(offloaded, total)`` from each "offloaded N/M layers to GPU" line of llama.cpp's log."""
    return [(int(m.group(1)), int(m.group(2))) for line in lines for m in [OFFLOADED.search(line)] if m]


def gpu_buffer_bytes(lines: list[str]) -> int:
    """Bytes of model weights llama.cpp said it put in device buffers ("CUDA0", "Vulkan0"; not "CPU",
    "CPU_Mapped" or pinned host memory such as "CUDA_Host")."""
    return sum(
        int(float(m.group(2)) * 2**20)
        for line in lines
        for m in [BUFFER.search(line)]
        if m and not m.group(1).startswith("CPU") and not m.group(1).endswith("_Host")
    )


def gpu_bound_bytes(path: str | Path) -> int:
    """Bytes of a model's tensors that an offload of every layer puts on the GPU: all but the token
    embeddings, which llama.cpp keeps in host memory (a lookup, not a matrix product). The file's size
    is no measure for small models, whose vocabulary metadata can outweigh their tensors."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name != "token_embd.weight")


def check_on_gpu(name: str, lines: list[str], free_before: int, free_after: int, size: int) -> dict[str, Any]:
    """What llama.cpp said about the load of ``name`` and what the GPU's free memory did; raises
    :class:`NotOnGPU` unless every layer went to the GPU and most of the ``size`` bytes that belong
    there (:func:`gpu_bound_bytes`) with them (by llama.cpp's buffer sizes, and by the device's free
    memory where it reports one)."""
    found = offload_lines(lines)
    report = {
        "offloaded": found[-1] if found else None,
        "gpu_bytes": free_before - free_after,
        "gpu_buffers": gpu_buffer_bytes(lines),
        "file_bytes": size,
    }
    if not found:
        raise NotOnGPU(f"{name}: llama.cpp logged no 'offloaded N/M layers to GPU' line (a CPU-only build?)")
    done, total = found[-1]
    if done < total:
        raise NotOnGPU(f"{name}: only {done} of {total} layers offloaded to the GPU")
    if report["gpu_buffers"] < 0.8 * size:
        raise NotOnGPU(
            f"{name}: llama.cpp put {report['gpu_buffers'] / 2**20:.0f} MiB of a {size / 2**20:.0f} MiB "
            "model in GPU buffers"
        )
    if free_before and free_before - free_after < 0.8 * size:
        raise NotOnGPU(
            f"{name}: the GPU's free memory fell by {(free_before - free_after) / 2**20:.0f} MiB for a "
            f"{size / 2**20:.0f} MiB model: its weights are not on the GPU"
        )
    return report


@contextlib.contextmanager
def llama_log() -> Iterator[list[str]]:
    """The lines llama.cpp logs in this process meanwhile (its INFO lines too)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("tandem.llama")
    handler, level = Keep(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _gpu_free() -> int:
    return sum(d["free"] for d in gpu_devices() if d["kind"] in ("GPU", "IGPU"))


def load(path: str, *, allow_cpu: bool) -> tuple[Any, dict[str, Any]]:
    """A model with every layer on the GPU (checked), and the load's report."""
    from app.engine.llama import Model

    before = _gpu_free()
    t0 = time.perf_counter()
    with llama_log() as lines:
        model = Model(path, n_gpu_layers=-1)
    seconds = time.perf_counter() - t0
    try:
        report = check_on_gpu(Path(path).name, lines, before, _gpu_free(), gpu_bound_bytes(path))
    except NotOnGPU:
        if not allow_cpu:
            model.close()
            raise
        report = {"offloaded": None, "cpu": True}
    report["load_seconds"] = round(seconds, 2)
    return model, report


RUN_STEPS, RUN_TIMED = 5, 3  # decode steps timed back to back per repeat, and how many of the last are kept


def _timed(ctx: Any, tokens: list[int], pos: int) -> float:
    t0 = time.perf_counter()
    n = ctx.decode(tokens, pos, logits="all")
    ctx.logits(n - 1)  # waits for the device, as the loop's read of the logits does
    dt = time.perf_counter() - t0
    ctx.trim(pos)
    return dt


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def measure_context(
    target: Any,
    draft: Any,
    context: int,
    batches: list[int],
    reps: int,
    seed: int = 0,
    threads: int | None = None,
) -> dict[str, Any]:
    """Both models after ``context`` tokens: per batch size, the target's ratio to its decode step and
    the draft's in the target's steps (median and quartiles over ``reps``), and milliseconds."""
    from app.engine.llama import Context

    rng = random.Random(seed)
    vocab = min(target.n_vocab, draft.n_vocab)
    text = [rng.randrange(vocab) for _ in range(context + max(batches) + 1)]
    ctxs = {}
    try:
        for role, model in (("target", target), ("draft", draft)):
            ctxs[role] = Context(model, n_ctx=context + max(batches) + 16, n_batch=512, n_threads=threads)
            ctxs[role].decode(text[:context], 0, logits="none")
        for role in ctxs:  # first evaluations of each size allocate and compile: not timed
            for b in batches:
                _timed(ctxs[role], text[context : context + b], context)
        raw: dict[str, dict[int, list[float]]] = {r: {b: [] for b in batches} for r in ctxs}
        rel: dict[str, dict[int, list[float]]] = {r: {b: [] for b in batches} for r in ctxs}
        run_steps: list[float] = []
        for _ in range(reps):
            steps: list[float] = []
            got: dict[str, list[tuple[int, float]]] = {r: [] for r in ctxs}
            sizes = [(r, b) for r in ctxs for b in batches if not (r == "target" and b == 1)]
            rng.shuffle(sizes)
            steps.append(_timed(ctxs["target"], text[context : context + 1], context))
            for j, (role, b) in enumerate(sizes):
                got[role].append((b, _timed(ctxs[role], text[context : context + b], context)))
                if j % 2:
                    steps.append(_timed(ctxs["target"], text[context : context + 1], context))
            step = statistics.median(steps)
            got["target"] += [(1, s) for s in steps]
            # steps back to back, as plain decoding evaluates them: on CUDA the two after a change of
            # shape run without their graph (the second captures it), so the last RUN_TIMED are kept
            run = [_timed(ctxs["target"], text[context : context + 1], context) for _ in range(RUN_STEPS)]
            run_steps += run[-RUN_TIMED:]
            for role, timings in got.items():
                for b, dt in timings:
                    raw[role][b].append(dt)
                for b in batches:
                    mine = [dt for bb, dt in timings if bb == b]
                    if mine:
                        rel[role][b].append(statistics.median(mine) / step)
    finally:
        for ctx in ctxs.values():
            ctx.close()
    out: dict[str, Any] = {"context": context, "reps": reps}
    for role in ("target", "draft"):
        qs = [_quartiles(rel[role][b]) for b in batches]
        out[role] = {
            "batches": batches,
            "ratio": [round(q[1], 4) for q in qs],  # in the target's decode steps
            "q1": [round(q[0], 4) for q in qs],
            "q3": [round(q[2], 4) for q in qs],
            "ms": [round(1000 * statistics.median(raw[role][b]), 3) for b in batches],
        }
    out["target"]["step_ms"] = out["target"]["ms"][0]
    out["target"]["run_step_ms"] = round(1000 * statistics.median(run_steps), 3)
    return out


def measure(
    target_path: str,
    draft_path: str,
    *,
    contexts: tuple[int, ...] = (512, 4096),
    max_batch: int = 64,
    reps: int = 7,
    allow_cpu: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """The whole table on this process's llama.cpp build (see the module's docstring)."""
    from app.engine.llama import backend_name, init_backend, supports_gpu_offload, system_info

    init_backend()
    devices = gpu_devices()
    result: dict[str, Any] = {
        "backend": backend_name(),
        "gpu_offload": supports_gpu_offload(),
        "devices": devices,
        "system_info": system_info(),
    }
    if not allow_cpu and not any(d["kind"] in ("GPU", "IGPU") for d in devices):
        raise NotOnGPU(f"no GPU device in this llama.cpp build ({result['backend']}): {devices}")
    t0 = time.perf_counter()
    target, result["target_load"] = load(target_path, allow_cpu=allow_cpu)
    try:
        draft, result["draft_load"] = load(draft_path, allow_cpu=allow_cpu)
        try:
            batches = list(range(1, max_batch + 1))
            result["contexts"] = {
                str(c): measure_context(target, draft, c, batches, reps, threads=threads) for c in contexts
            }
        finally:
            draft.close()
    finally:
        target.close()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_costs", description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--contexts", default="512,4096", help="comma-separated (default 512,4096)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--allow-cpu", action="store_true", help="measure even where no GPU holds the models")
    p.add_argument("--out", type=Path, required=True, help="JSON written here")
    args = p.parse_args(argv)
    try:
        data = measure(
            args.target,
            args.draft,
            contexts=tuple(int(c) for c in args.contexts.split(",")),
            max_batch=args.max_batch,
            reps=args.reps,
            allow_cpu=args.allow_cpu,
        )
    except NotOnGPU as e:
        args.out.write_text(json.dumps({"error": f"not on the GPU: {e}"}), encoding="utf-8")
        print(f"NOT ON THE GPU: {e}", file=sys.stderr)
        return EXIT_NOT_ON_GPU
    args.out.write_text(json.dumps(data), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
