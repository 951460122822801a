"""The GPU check's synthetic models: a target shaped like Qwen2.5-7B-Instruct and a draft shaped like
Qwen2.5-0.5B-Instruct, one vocabulary, Q4_K_M-like random blocks (:mod:`app.tiny_arch`'s ``qwen2``
writer with ``quant="Q4_K_M"``): seconds to write, no weights to carry. Random weights cost what real
ones cost on a GPU (the kernels do not look at the values); only the text they write is meaningless.

``tiny`` shapes keep the same layout (k-quant rows of 256 for the target, 896-like rows that fall back
to Q5_0/Q8_0 for the draft) at a few MB, for tests and dry runs on a laptop; ``small`` ones are the
benchmark pair's (a 1.5B target), for a CPU.

A *walk* pair (:func:`write_walk_models`) has the same shapes and costs, but its text is chosen: the
target writes a fixed walk through the vocabulary and each draft is right about its next token at a
chosen rate, so auto mode can be held to every fixed setting live at a known acceptance.
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

QWEN25_1_5B_SHAPE: dict[str, Any] = dict(
    QWEN25_7B_SHAPE, tied=True, n_embd=1536, n_layer=28, n_ff=8960, n_head=12, n_head_kv=2, head_dim=128,
)
"""Qwen/Qwen2.5-1.5B-Instruct (the benchmark pair's target: hidden 1536, 28 layers, intermediate 8960, 12
query heads and 2 KV heads of 128, tied embeddings), with the 7B's vocabulary: ``small`` shapes, for a CPU."""

TINY_TARGET_SHAPE: dict[str, Any] = dict(
    QWEN25_7B_SHAPE, n_vocab=4096, n_embd=256, n_layer=4, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
)
TINY_DRAFT_SHAPE: dict[str, Any] = dict(
    QWEN25_0_5B_SHAPE, n_vocab=4096, n_embd=128, n_layer=2, n_ff=256, n_head=2, n_head_kv=1, head_dim=64,
)
# fmt: on

SHAPES = {
    "real": (QWEN25_7B_SHAPE, QWEN25_0_5B_SHAPE),
    "small": (QWEN25_1_5B_SHAPE, QWEN25_0_5B_SHAPE),
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


WALK_ACCEPTANCE = (0.5, 0.75, 0.9)
"""The draft's chance of being right per token in the acceptance step's pairs."""


def walk_next(n_vocab: int, seed: int = 11) -> Any:
    """The walk both models of a walk pair write: ``next[t]``, one cycle through every ordinary token
    of the tiny tokenizer (a control token leads into it, none is ever next), so a reply of a few
    hundred tokens never repeats and prompt lookup has nothing to copy."""
    import numpy as np
    from gguf import TokenType

    from app.tiny_gguf import build_tokenizer

    control = {i for i, t in enumerate(build_tokenizer("a").types) if t != TokenType.NORMAL}
    order = np.random.default_rng(seed).permutation([i for i in range(n_vocab) if i not in control])
    nxt = np.empty(n_vocab, dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    nxt[sorted(control)] = order[0]
    return nxt


def _walk_values(shape: dict[str, Any], nxt: Any, right: Any, seed: int) -> dict[str, Any]:
    """The tensors that make a model of ``shape`` write token ``nxt[t]`` after ``t`` (``right``: where it
    does; elsewhere the token after that): every layer's norms and biases zero, so no layer adds to the
    residual stream (the layers still cost what they cost), the embeddings random unit rows, and
    output row ``u`` the sum of the embedding rows of the tokens it should follow (the logit of the
    written token is sqrt(n_embd), every other about N(0, 1))."""
    import numpy as np

    v, e = shape["n_vocab"], shape["n_embd"]
    cache: dict[str, Any] = {}

    def embd() -> Any:
        if "e" not in cache:
            x = np.random.default_rng(seed).standard_normal((v, e), dtype=np.float32)
            cache["e"] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return cache["e"]

    def output() -> Any:
        follows = np.where(right, nxt, nxt[nxt])
        out = np.zeros((v, e), dtype=np.float32)
        np.add.at(out, follows, embd())
        cache.clear()
        return out

    hd = shape["head_dim"]
    sizes = {"attn_norm.weight": e, "ffn_norm.weight": e, "attn_q.bias": shape["n_head"] * hd,
             "attn_k.bias": shape["n_head_kv"] * hd, "attn_v.bias": shape["n_head_kv"] * hd}  # fmt: skip
    values = {f"blk.{i}.{n}": _zeros(size) for i in range(shape["n_layer"]) for n, size in sizes.items()}
    return values | {"token_embd.weight": embd, "output.weight": output}


def _zeros(n: int) -> Any:
    import numpy as np

    return lambda: np.zeros(n, dtype=np.float32)


def write_walk_models(
    folder: Path, shapes: str = "real", acceptance: tuple[float, ...] = WALK_ACCEPTANCE
) -> dict[str, Any]:
    """A target and drafts of the check's shapes whose draft is right at a chosen rate: the target
    writes a fixed walk through the vocabulary (:func:`walk_next`), and the draft for acceptance ``q``
    writes the same walk's next token after a share ``q`` of the tokens (drawn once per token) and the
    one after it elsewhere, so its drafts are accepted at about ``q`` per token. Both are untied (a
    draft's output matrix costs what a tied one does); embeddings and output are Q8_0, the rest
    Q4_K_M-like random blocks, at the cost of the random pair's shapes (an output of Q8_0 where a
    Q4_K_M file has Q6_K: about 3 % more bytes read per step for the 7B shape). Paths and seconds."""
    import numpy as np

    from app.tiny_arch import write_tiny_model

    if not acceptance or not all(0.0 < q <= 1.0 for q in acceptance):
        raise ValueError(f"each acceptance is a share of tokens in (0, 1], not {acceptance!r}")
    target_shape, draft_shape = SHAPES[shapes]
    nxt = walk_next(target_shape["n_vocab"])
    out: dict[str, Any] = {"shapes": shapes, "drafts": {}}
    for role, shape, q in (("target", target_shape, 1.0), *(("draft", draft_shape, q) for q in acceptance)):
        t0 = time.perf_counter()
        shape = dict(shape, tied=False)
        right = np.random.default_rng([13, int(q * 1000)]).random(shape["n_vocab"]) < q
        label = role if role == "target" else f"draft-{round(q * 100)}"
        path = write_tiny_model(
            Path(folder) / f"walk-qwen2.5-{label}-{shapes}.gguf",
            "qwen2",
            seed=7 if role == "target" else 5,
            quant="Q4_K_M",
            shape=shape,
            name=f"walk-qwen2.5-{label}",
            values=_walk_values(shape, nxt, right, seed=17 if role == "target" else 19),
        )
        seconds = round(time.perf_counter() - t0, 2)
        entry = {"path": str(path), "bytes": path.stat().st_size, "seconds": seconds}
        if role == "target":
            out["target"] = entry
        else:
            out["drafts"][str(q)] = entry | {"right": round(float(right.mean()), 4)}
    return out
