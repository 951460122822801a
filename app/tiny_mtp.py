"""Multi-token-prediction (MTP, "NextN") blocks for :mod:`app.tiny_arch`'s tiny models.

A model with MTP blocks stores them after its trunk: ``block_count`` counts both, and
``<arch>.nextn_predict_layers`` says how many of the last blocks are MTP heads (llama.cpp runs the trunk
with ``n_layer - nextn`` blocks and the heads in a context of type ``LLAMA_CONTEXT_TYPE_MTP``). Names and
shapes follow the pinned llama.cpp (``src/llama-arch.cpp`` ``LLM_TENSOR_NEXTN_*``, and each
architecture's ``load_block_mtp`` in ``src/models/<arch>.cpp``).

``step35`` (Step-3.5, its MoE left out): ``n`` heads, each a Step-3.5 block (Q/K norms, global
attention) plus the same ``nextn`` tensors; llama.cpp chains them, head ``i`` drafting token ``i``.

``qwen35`` (Qwen3.5/3.6): one head, a full-attention Qwen3.5 block (gated Q, per-head Q/K norms) plus
``nextn.eh_proj`` (the token's embedding and the target's hidden state, concatenated, to the width),
``nextn.enorm``, ``nextn.hnorm`` and ``nextn.shared_head_norm``; the token embedding and the output
layer are the trunk's. llama.cpp's qwen35 MTP graph takes a single head.

The projection starts as the identity on the token's embedding (plus a little of the hidden state) and
the block's own branches are small, so the head predicts about what the trunk would after that token:
random weights that agree with their target now and then, as a trained head does more often.
"""

from __future__ import annotations

from typing import Any

from app.tiny_arch import _T, _attention, _ffn

MTP_ARCHS: tuple[str, ...] = ("qwen35", "step35")
TRUNK_OUT = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")
TRUNK_GAIN = 0.3
"""The trunk's projections back into the residual stream are scaled by this in a model with MTP blocks."""


def add_mtp_blocks(arch: str, s: dict[str, Any], n: int, kv: dict[str, Any], tensors: list[_T]) -> None:
    """Append ``n`` MTP blocks to the plan ``kv``/``tensors`` of ``arch`` at shape ``s`` (in place)."""
    if arch not in MTP_ARCHS:
        raise ValueError(f"no MTP blocks for {arch!r}: expected one of {', '.join(MTP_ARCHS)}")
    if arch == "qwen35" and n != 1:
        raise ValueError("qwen35: llama.cpp's MTP graph takes a single MTP block")
    e, trunk = s["n_embd"], s["n_layer"]
    for j, t in enumerate(tensors):  # a trunk that looks back less, so a head can guess it more often
        if t.name.endswith(TRUNK_OUT):
            tensors[j] = t._replace(gain=t.gain * TRUNK_GAIN)
    kv["block_count"] = trunk + n
    kv["nextn_predict_layers"] = n
    if arch == "step35":  # the heads attend globally
        kv["attention.sliding_window_pattern"] = [*kv["attention.sliding_window_pattern"], *([0] * n)]
    for i in range(trunk, trunk + n):
        p = f"blk.{i}."
        if arch == "qwen35":
            block = [_T(p + "post_attention_norm.weight", (e,), "norm"), *_attention(p, s, q_mult=2, rg=0.1)]
        else:
            block = [*_attention(p, s, rg=0.1), _T(p + "ffn_norm.weight", (e,), "norm")]
        tensors += [
            _T(p + "attn_norm.weight", (e,), "norm"),
            *block,
            *_ffn(p, e, s["n_ff"], rg=0.1),
            _T(p + "nextn.eh_proj.weight", (2 * e, e), "eh"),
            _T(p + "nextn.enorm.weight", (e,), "norm"),
            _T(p + "nextn.hnorm.weight", (e,), "norm"),
            _T(p + "nextn.shared_head_norm.weight", (e,), "norm"),
        ]
