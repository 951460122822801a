"""The shapes of :mod:`app.tiny_arch`'s models: the tiny defaults per architecture, the noise of a tiny
pair's draft, and real models' shapes (for benchmarks with random weights)."""

from __future__ import annotations

from typing import Any

# fmt: off
_COMMON = {"n_vocab": 0, "n_ctx_train": 4096, "tied": False}  # n_vocab 0: the tokenizer's 509 tokens
DEFAULT_SHAPES: dict[str, dict[str, Any]] = {
    # 3 Gated DeltaNet layers then 1 full-attention layer, like the real 3:1 pattern. 2 key heads for
    # 4 value heads (Qwen3.5-9B has 16:32), so llama.cpp's repeat of the k heads is exercised.
    "qwen35": dict(
        _COMMON, n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
        rope_sections=(2, 1, 1, 0), rope_freq_base=1e7, full_attention_interval=4, ssm_d_conv=4,
        ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=4, rms_eps=1e-6,
    ),
    # layers 0 and 2 see the last 16 tokens only, layers 1 and 3 everything
    "gemma3": dict(
        _COMMON, n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, sliding_window=16,
        sliding_window_pattern=2, rope_freq_base=1e6, rope_freq_base_swa=1e4, rms_eps=1e-6,
    ),
    # Step-3.5's layer, dense (its MoE left out): sliding-window and global attention alternating
    "step35": dict(
        _COMMON, n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, sliding_window=16,
        rope_freq_base=1e4, rms_eps=1e-5,
    ),
    # a dense attention model (Qwen3: per-head Q/K norms), for benchmarks to set beside the others
    "qwen3": dict(
        _COMMON, n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, rope_freq_base=1e6,
        rms_eps=1e-6,
    ),
    # Qwen2.5: no Q/K norms, biases on Q, K and V; llama.cpp takes the head size as n_embd / n_head
    "qwen2": dict(
        _COMMON, n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, rope_freq_base=1e6,
        rms_eps=1e-6,
    ),
    "qwen3moe": dict(
        _COMMON, n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, n_expert=8,
        n_expert_used=2, n_ff_exp=32, rope_freq_base=1e6, rms_eps=1e-6,
    ),
    # 8 heads of 16 channels (d_inner 128), one group of B/C of 16 states
    "mamba2": dict(
        _COMMON, n_embd=64, n_layer=2, ssm_d_inner=128, ssm_d_state=16, ssm_dt_rank=8, ssm_n_group=1,
        ssm_d_conv=4, rms_eps=1e-5,
    ),
}
"""The tiny shapes: F32 files of 0.5-1 MB (120-230 thousand parameters) that generate a token in well
under a millisecond on one CPU core."""

QWEN35_2B_SHAPE: dict[str, Any] = dict(
    DEFAULT_SHAPES["qwen35"], n_vocab=248320, n_ctx_train=262144, tied=True, n_embd=2048, n_layer=24,
    n_ff=6144, n_head=8, n_head_kv=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
    ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16,
)
"""Qwen/Qwen3.5-2B's text model (``text_config`` of its config.json, revision 15852e8c): hidden 2048,
24 layers (18 Gated DeltaNet + 6 full attention, interval 4), intermediate 6144, 8 query heads / 2 KV heads
of 256 (partial rotary 0.25: 64 rotated dims, mrope sections [11, 11, 10]), 16 key / 16 value linear heads
of 128, conv kernel 4, vocabulary 248320, tied embeddings, no MTP block. 1,881,825,088 parameters, the
count llama.cpp reports for the real GGUF. The padded vocabulary keeps the tokenizer's 509 tokens first."""

DENSE_2B_SHAPE: dict[str, Any] = dict(
    DEFAULT_SHAPES["qwen3"], n_vocab=248320, n_ctx_train=262144, tied=True, n_embd=2048, n_layer=26,
    n_ff=6144, n_head=16, n_head_kv=8, head_dim=128,
)
"""A dense attention model (``qwen3``: Qwen3-1.7B's layer, 26 of them) with Qwen3.5-2B's vocabulary and
width: about the same size as :data:`QWEN35_2B_SHAPE`, every layer attention."""

QWEN35_0_8B_SHAPE: dict[str, Any] = dict(QWEN35_2B_SHAPE, n_embd=1024, n_ff=3584)
"""Qwen/Qwen3.5-0.8B's text model (hidden 1024, intermediate 3584, otherwise as the 2B): a draft shape."""
# fmt: on

DEFAULT_NOISE: dict[str, float] = {
    "qwen35": 0.04, "gemma3": 0.065, "qwen3moe": 0.075, "mamba2": 0.07, "qwen2": 0.055,
}  # fmt: skip
"""Relative noise of :func:`write_tiny_arch_pair`'s draft per architecture, tuned so that its greedy token
equals the target's on 60-65% of the target's greedy positions (measured with llama.cpp 0.3.36 over 5
prompts and 40 generated tokens each, F32)."""
