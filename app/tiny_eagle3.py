"""A tiny EAGLE-3 head for :mod:`app.tiny_gguf`'s tiny llama target, loaded by the real llama.cpp.

Names, keys and shapes follow the pinned llama.cpp (``src/models/eagle3.cpp``, ``src/llama-arch.cpp``):
``fc`` fuses the inputs of three target layers (``eagle3.target_layers``; the target's layer count
stands for its output) into the head's width; one decoder block whose attention reads the token's
embedding and the fused row side by side (``attn_norm``, ``attn_norm_2``: Q/K/V of twice the width);
``output_norm`` and, where given, its own ``output``. Without ``token_embd`` (and here without
``output``) the head takes its target's, through the target's context (``ctx_other``).

The weights are random: the head's drafts are almost never what the target writes, which exercises
rejections, rollbacks and catch-ups (acceptance needs a trained head). The target's layer count as a
layer id reads the target's output hidden state, which llama.cpp fills only for architectures that
set it (the MTP ones): a head for the llama target reads layers below its count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from app.tiny_gguf import add_tokenizer, build_tokenizer


def write_tiny_eagle3(
    path: str | Path,
    *,
    target_width: int = 64,
    target_layers: tuple[int, ...] = (0, 1, 1),
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 160,
    seed: int = 0,
    tokenizer: Literal["a", "b"] = "a",
    name: str = "tiny-eagle3",
) -> Path:
    """Write an EAGLE-3 head for a target of width ``target_width`` reading ``target_layers`` (the
    default fits :func:`app.tiny_gguf.write_tiny_llama`'s 2-layer target: the inputs of its layers 0
    and 1, the second twice). ``n_embd`` must be the target's width: the head embeds tokens with the
    target's table."""
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    rng = np.random.default_rng(seed)
    e, tw, hd = n_embd, target_width, n_embd // n_head
    k = len(target_layers)

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:  # numpy shape: ggml's reversed
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(gain / np.sqrt(cols))

    fc = 0.02 * mat(e, k * tw)
    fc[:, (k - 1) * tw : (k - 1) * tw + min(e, tw)] += np.eye(e, min(e, tw), dtype=np.float32)
    ones = np.ones(e, dtype=np.float32)
    weights = {
        "fc.weight": fc,
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones.copy(),
        "blk.0.attn_norm_2.weight": ones.copy(),
        "blk.0.attn_q.weight": mat(n_head * hd, 2 * e, 2.0),
        "blk.0.attn_k.weight": mat(n_head_kv * hd, 2 * e, 2.0),
        "blk.0.attn_v.weight": mat(n_head_kv * hd, 2 * e),
        "blk.0.attn_output.weight": mat(e, n_head * hd, 0.05),
        "blk.0.ffn_norm.weight": ones.copy(),
        "blk.0.ffn_gate.weight": mat(n_ff, e),
        "blk.0.ffn_up.weight": mat(n_ff, e),
        "blk.0.ffn_down.weight": mat(e, n_ff, 0.05),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(tokenizer)
    writer = GGUFWriter(path, "eagle3")
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_vocab_size(tok.n_vocab)
    writer.add_context_length(4096)
    writer.add_embedding_length(e)
    writer.add_block_count(1)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(10000.0)
    writer.add_array("eagle3.target_layers", [int(x) for x in target_layers])
    writer.add_uint32("eagle3.target_hidden_size", tw)
    add_tokenizer(writer, tok)
    for key, w in weights.items():
        writer.add_tensor(key, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
