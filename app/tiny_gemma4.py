"""A tiny Gemma 4 and its assistant draft, loaded by the real llama.cpp (for tests).

Names, keys and shapes follow the pinned llama.cpp (``src/models/gemma4.cpp``,
``src/models/gemma4-assistant.cpp``, ``src/llama-arch.cpp``). The target (``gemma4``) alternates
sliding-window and global attention layers (``attention.sliding_window_pattern``, an array), with per-head
Q/K norms, post-attention and post-FFN norms, a GELU FFN, tied embeddings scaled by ``sqrt(n_embd)`` and
``rope_freqs`` on its global layers; no per-layer embeddings, no shared-KV layers, no experts.

The assistant (``gemma4-assistant``) has no K/V projections: its layers attend over its target's KV cache
(its sliding layers over the target's last sliding layer's, its global layers over the target's last
layer's; llama.cpp shares them through ``ctx_other``). It embeds a token with the *target's* table (scaled
by the target's ``sqrt(width)``), concatenates the target's hidden state (``embedding_length_out`` wide),
projects to its own narrower width (``nextn.pre_projection``), runs its blocks and gives logits (its own
token table, tied) and the next hidden state (``nextn.post_projection``, back to the target's width). Its
head size and KV heads are the target's, as they read the target's cache.

The weights are random: the assistant's drafts are almost never what the target writes, which exercises
rejections and the drafter's bookkeeping (acceptance needs a trained assistant).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from app.tiny_gguf import CHATML_TEMPLATE, add_hparams, add_tokenizer, build_tokenizer

HEAD_DIM = 16
N_HEAD, N_HEAD_KV = 4, 2
TARGET_PATTERN = (1, 0, 1, 0)  # sliding, global, ...: the last layer global, the one before it sliding
ASSISTANT_PATTERN = (1, 0)


def _writer(path: Path, arch: str, name: str, kv: dict[str, object], n_vocab: int) -> GGUFWriter:
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_vocab_size(n_vocab)
    add_hparams(writer, arch, kv)
    return writer


def _finish(writer: GGUFWriter, weights: dict[str, np.ndarray]) -> None:
    for key, w in weights.items():
        writer.add_tensor(key, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _common_kv(n_embd: int, n_layer: int, n_ff: int, pattern: tuple[int, ...]) -> dict[str, object]:
    return {
        "context_length": 4096,
        "embedding_length": n_embd,
        "block_count": n_layer,
        "feed_forward_length": n_ff,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "attention.key_length_swa": HEAD_DIM,
        "attention.value_length_swa": HEAD_DIM,
        "attention.sliding_window": 16,
        "attention.sliding_window_pattern": [int(x) for x in pattern],
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 1e6,
        "rope.freq_base_swa": 1e4,
    }


class _Rng:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def mat(self, rows: int, cols: int, gain: float = 1.0) -> np.ndarray:  # numpy shape: ggml's reversed
        return self.rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(gain / np.sqrt(cols))

    def embd(self, rows: int, cols: int, std: float) -> np.ndarray:
        return self.rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)

    def norm(self, n: int, gain: float = 1.0) -> np.ndarray:
        return (gain * (1.0 + 0.1 * self.rng.standard_normal(n, dtype=np.float32))).astype(np.float32)


def _block(r: _Rng, p: str, e: int, n_ff: int, *, kv: bool, rg: float) -> dict[str, np.ndarray]:
    """One Gemma 4 block's tensors (with K/V projections and K norm where ``kv``)."""
    hd = HEAD_DIM
    w = {
        p + "attn_norm.weight": r.norm(e),
        p + "attn_q.weight": r.mat(N_HEAD * hd, e, 2.0),
        p + "attn_output.weight": r.mat(e, N_HEAD * hd),
        p + "attn_q_norm.weight": r.norm(hd),
        p + "post_attention_norm.weight": r.norm(e, rg),
        p + "ffn_norm.weight": r.norm(e),
        p + "ffn_gate.weight": r.mat(n_ff, e),
        p + "ffn_up.weight": r.mat(n_ff, e),
        p + "ffn_down.weight": r.mat(e, n_ff),
        p + "post_ffw_norm.weight": r.norm(e, rg),
    }
    if kv:
        w |= {
            p + "attn_k.weight": r.mat(N_HEAD_KV * hd, e, 2.0),
            p + "attn_v.weight": r.mat(N_HEAD_KV * hd, e),
            p + "attn_k_norm.weight": r.norm(hd),
        }
    return w


def write_tiny_gemma4(
    path: str | Path,
    *,
    n_embd: int = 64,
    n_layer: int = 4,
    n_ff: int = 128,
    shared_kv_layers: int = 0,
    seed: int = 0,
    name: str = "",
) -> Path:
    """Write a tiny Gemma 4 target: ``n_layer`` blocks alternating sliding-window (16 tokens) and global
    attention, the last one global; :mod:`app.tiny_gguf`'s tokenizer and ChatML template. The last
    ``shared_kv_layers`` blocks have no K/V of their own: they attend over the KV cache of the last
    block before them of their kind (as Gemma 4 E2B/E4B's do)."""
    pattern = tuple(TARGET_PATTERN[i % 2] for i in range(n_layer))
    if n_layer < 2 or pattern[-1] or not pattern[-2]:
        raise ValueError("a tiny Gemma 4 needs an even number of layers (>= 2): sliding, global, ...")
    if shared_kv_layers and (shared_kv_layers % 2 or n_layer - shared_kv_layers < 2):
        raise ValueError("shared_kv_layers: an even number that leaves at least 2 layers with their own KV")
    r, tok = _Rng(seed), build_tokenizer("a")
    rg = float(1.0 / np.sqrt(n_layer))
    kv = _common_kv(n_embd, n_layer, n_ff, pattern) | {"embedding_length_per_layer_input": 0}
    if shared_kv_layers:
        kv["attention.shared_kv_layers"] = shared_kv_layers
    weights = {
        "token_embd.weight": r.embd(tok.n_vocab, n_embd, 0.5 / np.sqrt(n_embd)),
        "output_norm.weight": r.norm(n_embd),
        "rope_freqs.weight": np.ones(HEAD_DIM // 2, dtype=np.float32),
    }
    for i in range(n_layer):
        weights |= _block(r, f"blk.{i}.", n_embd, n_ff, kv=i < n_layer - shared_kv_layers, rg=rg)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _writer(path, "gemma4", name or "tiny-gemma4", kv, tok.n_vocab)
    add_tokenizer(writer, tok)
    writer.add_chat_template(CHATML_TEMPLATE)
    _finish(writer, weights)
    return path


def write_tiny_gemma4_assistant(
    path: str | Path,
    *,
    target_width: int = 64,
    n_embd: int = 32,
    n_layer: int = 2,
    n_ff: int = 64,
    seed: int = 1,
    name: str = "tiny-gemma4-assistant",
) -> Path:
    """Write a Gemma 4 assistant for a :func:`write_tiny_gemma4` target of width ``target_width``:
    ``n_layer`` blocks (sliding, global, ...) of width ``n_embd`` (which llama.cpp wants different from
    ``target_width``)."""
    if n_embd == target_width:
        raise ValueError("llama.cpp wants the assistant's width to differ from its target's")
    pattern = tuple(ASSISTANT_PATTERN[i % 2] for i in range(n_layer))
    r, tok = _Rng(seed), build_tokenizer("a")
    e, tw = n_embd, target_width
    kv = _common_kv(e, n_layer, n_ff, pattern) | {"embedding_length_out": tw, "nextn_predict_layers": n_layer}
    pre = 0.02 * r.mat(e, 2 * tw)
    pre[:, : min(e, tw)] += np.eye(e, min(e, tw), dtype=np.float32)  # mostly the token's own embedding
    weights = {
        "token_embd.weight": r.embd(tok.n_vocab, e, 2.0 / np.sqrt(e)),
        "output_norm.weight": r.norm(e),
        "nextn.pre_projection.weight": pre,
        "nextn.post_projection.weight": r.mat(tw, e),
        "rope_freqs.weight": np.ones(HEAD_DIM // 2, dtype=np.float32),
    }
    for i in range(n_layer):
        p = f"blk.{i}."
        weights |= _block(r, p, e, n_ff, kv=False, rg=0.3)
        weights[p + "layer_output_scale.weight"] = np.ones(1, dtype=np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _writer(path, "gemma4-assistant", name, kv, tok.n_vocab)
    add_tokenizer(writer, tok)
    _finish(writer, weights)
    return path
