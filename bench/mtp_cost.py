"""What one multi-token-prediction (MTP) draft step costs beside a target step, and the acceptance MTP
drafting then needs to pay.

Writes, in seconds, a synthetic Qwen3.5-2B with one MTP block (``app.tiny_arch.QWEN35_2B_SHAPE``,
``mtp=1``: the block shaped as its full-attention layers, as Qwen3.5/3.6's; random Q4_K_M weights), then
times on this machine, interleaved and repeated, at ``--context`` tokens of context:

- a target decode step (one token, its logits) and verify batches of b tokens (logits on every row);
- an MTP step: one token paired with a hidden state, its logits (a chained draft step), and the
  catch-up batch of b pairs that also gives a round's first draft token.

Then, for draft lengths k, the expected speed-up at a per-token acceptance a (each drafted token
accepted with probability a while the previous ones were): E[tokens] = (1 - a^(k+1)) / (1 - a) per
round, cost = verify(k+1) + catch-up + (k-1) MTP steps; and the lowest a at which some k beats plain
decoding, here (measured costs) and on a GPU (a verify batch of up to 16 about one decode step:
``bench.replay_history.gpu_ratios``; an MTP step at its share of the weights a step reads, as a
memory-bound decode step costs).

Random weights say nothing of acceptance (a trained head's is what decides): only costs are measured.
``python -m bench.mtp_cost`` (hold ``flock /tmp/tandem-bench.lock`` while timing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from app.engine.llama import Context, Model
from app.engine.llama_mtp import MtpContext, hidden_rows, output_hidden
from app.tiny_arch import QWEN35_2B_SHAPE, write_tiny_model
from bench.replay_history import gpu_ratios

BATCHES = (1, 2, 3, 4, 5, 9)


def _median(f, undo, n: int) -> float:
    """The median time of ``f()`` over ``n`` runs, ``undo()`` after each (not timed)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
        undo()
    return statistics.median(times)


def weight_shares(path: Path, n_trunk: int) -> tuple[int, int]:
    """Bytes a target decode step reads (the trunk and the output layer) and an MTP step reads (its
    block and the output layer: the token embeddings where they are tied)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    head = sizes.get("output.weight", sizes["token_embd.weight"])
    mtp = sum(v for k, v in sizes.items() if k.startswith(f"blk.{n_trunk}."))
    trunk = sum(v for k, v in sizes.items() if k.startswith("blk.") and not k.startswith(f"blk.{n_trunk}."))
    return trunk + head, mtp + head


def measure(path: Path, *, context: int, repeats: int, threads: int) -> dict:
    model = Model(path, load_mtp=True)
    ctx = Context(model, n_ctx=context + 64, n_batch=512, n_threads=threads)
    output_hidden(ctx)
    mtp = MtpContext(ctx, n_threads=threads)
    rng = np.random.default_rng(0)
    text = [int(t) for t in rng.integers(0, 509, size=context + 16)]
    ctx.decode(text[:context], 0, logits="none")
    ctx.save_state()  # the recurrent state after the context: each timed batch is undone to it
    h = hidden_rows(ctx, min(context, 512), model.n_embd_out)[-16:]
    mtp.decode(text[:context], 0, np.zeros((context, model.n_embd_out), np.float32), logits=False)
    target: dict[int, list[float]] = {b: [] for b in BATCHES}
    head: dict[int, list[float]] = {b: [] for b in BATCHES}
    for _ in range(repeats):  # interleaved: a busy moment slows every size alike
        for b in BATCHES:
            toks = text[context : context + b]

            def undo() -> None:
                ctx.load_state()
                ctx.remove(context)

            target[b].append(_median(lambda toks=toks: ctx.decode(toks, context, logits="all"), undo, 3))
            head[b].append(
                _median(
                    lambda toks=toks, b=b: mtp.decode(toks, context, h[:b]), lambda: mtp.remove(context), 3
                )
            )
    step = statistics.median(target[1])
    out = {
        "context": context,
        "threads": threads,
        "step_ms": round(step * 1e3, 2),
        "verify": {b: round(statistics.median(v) / step, 3) for b, v in target.items()},
        "mtp": {b: round(statistics.median(v) / step, 3) for b, v in head.items()},
    }
    read_step, read_mtp = weight_shares(path, model.n_layer)
    out["bytes_share"] = round(read_mtp / read_step, 3)
    mtp.close()
    ctx.close()
    model.close()
    return out


def speedup(a: float, k: int, verify: list[float], catch_up: float, step: float) -> float:
    """Expected tokens per decode step's time with drafts of ``k`` at acceptance ``a``."""
    tokens = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    return tokens / (verify[k + 1] + catch_up + (k - 1) * step)  # a batch of the pending token and k


def break_even(verify: list[float], catch_up: float, step: float, k_max: int = 8) -> tuple[float, int]:
    """The lowest acceptance at which some draft length beats plain decoding, and that length."""
    for a in np.arange(0.0, 1.0001, 0.01):
        best = max(range(1, k_max + 1), key=lambda k: speedup(a, k, verify, catch_up, step))
        if speedup(a, best, verify, catch_up, step) > 1.0:
            return round(float(a), 2), best
    return 1.0, 0


def report(m: dict) -> dict:
    """Break-even acceptance here and on a GPU, and the speed-up at a few acceptances."""
    verify = {int(b): float(x) for b, x in m["verify"].items()}  # (JSON keys are text)
    head = {int(b): float(x) for b, x in m["mtp"].items()}
    ks = sorted(verify)
    here_v = [0.0] + [float(np.interp(b, ks, [verify[k] for k in ks])) for b in range(1, 10)]
    catch = head[2]  # a round usually catches up the pending token and an accepted one
    step = head[1]
    gpu_v = [0.0, *gpu_ratios(9)]
    share = float(m["bytes_share"])
    out = {
        "here": dict(zip(("acceptance", "k"), break_even(here_v, catch, step), strict=True)),
        "gpu": dict(zip(("acceptance", "k"), break_even(gpu_v, share, share), strict=True)),
    }
    for a in (0.5, 0.6, 0.7, 0.8):
        out[f"speedup_at_{a}"] = {
            "here": round(max(speedup(a, k, here_v, catch, step) for k in range(1, 9)), 2),
            "gpu": round(max(speedup(a, k, gpu_v, share, share) for k in range(1, 9)), 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tandem-mtp-bench")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny shape (checks the benchmark runs)")
    args = p.parse_args(argv)
    name = "tiny-qwen35-mtp.gguf" if args.tiny else "qwen35-2b-mtp-q4_k_m.gguf"
    path = args.dir / name
    if not path.exists():
        if args.tiny:
            write_tiny_model(path, "qwen35", mtp=1)
        else:
            write_tiny_model(path, "qwen35", shape=QWEN35_2B_SHAPE, quant="Q4_K_M", mtp=1)
    m = measure(path, context=args.context, repeats=args.repeats, threads=args.threads)
    m["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({**m, **report(m)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
