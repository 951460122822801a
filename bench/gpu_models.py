"""The GPU check's synthetic models: a target shaped like Qwen2.5-7B-Instruct and a draft shaped like
Qwen2.5-0.5B-Instruct, one vocabulary, Q4_K_M-like random blocks (:mod:`app.tiny_arch`'s ``qwen2``
writer with ``quant="Q4_K_M"``): seconds to write, no weights to carry. Random weights cost what real
ones cost on a GPU (the kernels do not look at the values); only the text they write is meaningless.

``tiny`` shapes keep the same layout (k-quant rows of 256 for the target, 896-like rows that fall back
to Q5_0/Q8_0 for the draft) at a few MB, for tests and dry runs on a laptop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# fmt: off
QWEN25_7B_SHAPE: dict[str, Any] = dict(
    n_vocab=152064, n_ctx_train=32768, tied=False, n_embd=3584, n_layer=28, n_ff=18944, n_head=28,
    n_head_kv=4, head_dim=128, rope_freq_base=1e6, rms_eps=1e-6,
)
"""Qwen/Qwen2.5-7B-Instruct (config.json): hidden 3584, 28 layers, intermediate 18944, 28 query heads and
4 KV heads of 128, vocabulary 152064, untied output. 7.62 billion parameters."""

QWEN25_0_5B_SHAPE: dict[str, Any] = dict(
    QWEN25_7B_SHAPE, tied=True, n_embd=896, n_layer=24, n_ff=4864, n_head=14, n_head_kv=2, head_dim=64,
)
"""Qwen/Qwen2.5-0.5B-Instruct: hidden 896, 24 layers, intermediate 4864, 14 query heads and 2 KV heads
of 64, tied embeddings; the real file's vocabulary is 151936, the target's 152064 here (one vocabulary,
as the brief asks: llama.cpp accepts a difference of up to 128 tokens anyway). Rows of 896 are not whole
k-quant blocks: most of its matrices are Q5_0 and its embeddings Q8_0, as in the real Q4_K_M file."""

TINY_TARGET_SHAPE: dict[str, Any] = dict(
    QWEN25_7B_SHAPE, n_vocab=4096, n_embd=256, n_layer=4, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
)
TINY_DRAFT_SHAPE: dict[str, Any] = dict(
    QWEN25_0_5B_SHAPE, n_vocab=4096, n_embd=128, n_layer=2, n_ff=256, n_head=2, n_head_kv=1, head_dim=64,
)
# fmt: on

SHAPES = {
    "real": (QWEN25_7B_SHAPE, QWEN25_0_5B_SHAPE),
    "tiny": (TINY_TARGET_SHAPE, TINY_DRAFT_SHAPE),
}


def write_models(folder: Path, shapes: str = "real") -> dict[str, Any]:
    """Write the target and the draft into ``folder``; their paths, sizes, parameters and the seconds
    each took."""
    from app.tiny_arch import count_params, write_tiny_model

    target_shape, draft_shape = SHAPES[shapes]
    out: dict[str, Any] = {"shapes": shapes}
    for role, shape, seed in (("target", target_shape, 7), ("draft", draft_shape, 5)):
        t0 = time.perf_counter()
        path = write_tiny_model(
            Path(folder) / f"synthetic-qwen2.5-{role}-{shapes}-q4_k_m.gguf",
            "qwen2",
            seed=seed,
            quant="Q4_K_M",
            shape=shape,
            name=f"synthetic-qwen2.5-{role}",
        )
        out[role] = {
            "path": str(path),
            "bytes": path.stat().st_size,
            "params": count_params("qwen2", shape),
            "seconds": round(time.perf_counter() - t0, 2),
            "n_layer": shape["n_layer"],
            "n_embd": shape["n_embd"],
        }
    return out
