"""Which layers of a model keep what, from its GGUF header, as the pinned llama.cpp decides.

- Recurrent layers (``is_recr``): every layer of a recurrent architecture; Falcon-H1's layers are both
  recurrent and attention; Qwen3-Next / Qwen3.5 / MiniMax-01 take ``<arch>.attention.recurrent_layers``
  or else every layer but each ``full_attention_interval``-th (default 4, MiniMax 8); Nemotron-H a layer
  with neither KV heads nor a feed-forward; the other hybrids a layer with no KV heads
  (``head_count_kv`` as a per-layer array, 0 for recurrent).
- Sliding-window layers (``is_swa``): ``<arch>.attention.sliding_window_pattern`` as a per-layer array,
  or a period n (from the header or the architecture's default) where every n-th layer is global
  (the last of each period, or the first for the "dense first" ones: Gemma 3 every 6th, gpt-oss every
  2nd); LFM2's attention layers all slide when it has a window.
- A recurrent layer's state per sequence, in f32 elements, is ``n_embd_r + n_embd_s``
  (``src/llama-hparams.cpp``): RWKV ``token_shift_count * n_embd + n_embd * wkv.head_size``; LFM2's
  short convolution ``n_embd * (l_cache - 1)``; Kimi's KDA ``3 * (d_conv - 1) * n_head * head_dim +
  head_dim^2 * n_head``; MiniMax's linear attention ``head_dim^2 * n_head``; Mamba-style SSMs
  ``(d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner``.

Multi-token-prediction layers (``nextn_predict_layers``) are left out: the main context has no cache
for them. Imports nothing of Tandem but the GGUF reader and `app.gguf.arch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.gguf.arch import HYBRID, RECURRENT
from app.gguf.meta import GGUFMetadata

__all__ = ["N_UBATCH", "SWA_PAD", "LayerLayout", "layer_layout", "swa_cells"]

N_UBATCH = 512  # llama.cpp's default micro-batch, which a sliding-window cache holds beyond its window
SWA_PAD = 256  # a sliding-window cache's cells are padded to this

#: the sliding-window architectures: (period, dense first, default window; 0 = only the header's)
SWA_PATTERNS: dict[str, tuple[int, bool, int]] = {
    "afmoe": (4, False, 0),
    "cohere2": (4, False, 0),
    "cohere2moe": (4, True, 0),
    "exaone-moe": (4, False, 128),
    "exaone4": (4, False, 4096),  # the 32B (64 layers) only
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, 0),
    "gemma3n": (5, False, 0),
    "gpt-oss": (2, False, 0),
    "laguna": (4, True, 0),
    "llama4": (4, False, 8192),  # chunked attention; a header window of 0 turns it off
    "mellum": (4, False, 0),
    "olmo2": (4, False, 0),
    "plamo3": (8, False, 0),
    "smallthinker": (4, True, 0),
}
#: sliding-window architectures whose header lists the sliding layers (no period)
SWA_ARRAYS = frozenset({"dots3note", "gemma4", "granite_swa", "mimo2", "step35"})
#: hybrids whose recurrent layers follow ``full_attention_interval`` (and its default)
INTERVALS = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": 4, "minimax-01": 8}


def swa_cells(n_ctx: int, window: int, *, n_ubatch: int = N_UBATCH) -> int:
    """Cells of a sliding-window layer's cache: ``pad(min(n_ctx, window + n_ubatch), 256)``."""
    n = min(n_ctx, window + n_ubatch)
    return -(-n // SWA_PAD) * SWA_PAD


@dataclass(frozen=True)
class LayerLayout:
    """A model's layers as its memory sees them; KV sizes in elements per cell (K and V)."""

    architecture: str
    n_layer: int  # every block of the header (what llama.cpp offloads)
    kv_layers: int  # layers with a KV cache
    sliding_layers: int  # of those, the ones that see only the window
    recurrent_layers: int
    full_kv: int  # K + V elements per cell over the full-attention layers
    swa_kv: int  # over the sliding-window layers
    sliding_window: int
    recurrent_state: int  # bytes of one sequence's state over every recurrent layer (f32)

    def kv_bytes(self, n_ctx: int, bytes_per_element: int = 2, *, swa_full: bool = False) -> int:
        """The KV cache at `n_ctx` (f16); `swa_full`: sliding-window layers hold every cell too."""
        swa = (n_ctx if swa_full else swa_cells(n_ctx, self.sliding_window)) if self.swa_kv else 0
        return (self.full_kv * n_ctx + self.swa_kv * swa) * bytes_per_element


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value) if value is not None and not isinstance(value, str) else default
    except (TypeError, ValueError):
        return default


def _per_layer(value: Any, n: int, default: Sequence[int]) -> list[int]:
    """A header value that may be one number for every layer or an array with one per layer."""
    if value is None or isinstance(value, str):
        return list(default)
    if hasattr(value, "__len__"):
        out = [_int(v) for v in list(value)[:n]]
        return out + [0] * (n - len(out))
    return [_int(value)] * n


def _recurrent(meta: GGUFMetadata, arch: str, n: int, kv_heads: list[int], n_ff: list[int]) -> list[bool]:
    key = f"{arch}.attention.recurrent_layers"
    if arch in RECURRENT or arch == "falcon-h1":
        return [True] * n
    if arch in INTERVALS:
        if meta.get(key) is not None:
            return [bool(v) for v in _per_layer(meta.get(key), n, [0] * n)]
        every = _int(meta.get(f"{arch}.full_attention_interval"), INTERVALS[arch]) or INTERVALS[arch]
        return [(i + 1) % every != 0 for i in range(n)]
    if arch in ("nemotron_h", "nemotron_h_moe"):
        return [kv_heads[i] == 0 and n_ff[i] == 0 for i in range(n)]
    if arch in HYBRID:
        return [kv_heads[i] == 0 for i in range(n)]
    return [False] * n


def _sliding(meta: GGUFMetadata, arch: str, n: int, recurrent: list[bool]) -> tuple[list[bool], int]:
    """Which layers slide, and the window (0: none)."""
    header = meta.get(f"{arch}.attention.sliding_window")
    window = _int(header)
    none = [False] * n, 0
    if arch in ("lfm2", "lfm2moe"):
        return ([not r for r in recurrent], window) if window > 0 else none
    if arch not in SWA_PATTERNS and arch not in SWA_ARRAYS:
        return none
    period, dense_first, default = SWA_PATTERNS.get(arch, (0, False, 0))
    if (arch == "exaone4" and n != 64) or (arch == "llama4" and header is not None and window == 0):
        return none
    if arch == "llama4":
        window = default
    elif arch == "smallthinker" and window > 0:
        window = 4096
    elif header is None:
        window = default
    if window <= 0:
        return none
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is not None and hasattr(pattern, "__len__") and not isinstance(pattern, str):
        return [bool(v) for v in _per_layer(pattern, n, [0] * n)], window
    if arch in SWA_ARRAYS:
        return none  # llama.cpp needs the array; without it, count every layer as global
    period = _int(pattern, period)
    if dense_first:
        return [period == 0 or i % period != 0 for i in range(n)], window
    return [period == 0 or i % period < period - 1 for i in range(n)], window


def _state_elements(meta: GGUFMetadata, arch: str, n_head: int) -> int:
    """``n_embd_r() + n_embd_s()`` of one recurrent layer."""

    def key(suffix: str) -> int:
        return _int(meta.get(f"{arch}.{suffix}"))

    n_embd = key("embedding_length")
    wkv, l_cache, kda = key("wkv.head_size"), key("shortconv.l_cache"), key("kda.head_dim")
    d_conv, d_inner, d_state, groups = (key(f"ssm.{k}") for k in ("conv_kernel", "inner_size", "state_size",
                                                                  "group_count"))  # fmt: skip
    if wkv:
        return (_int(meta.get(f"{arch}.token_shift_count"), 2) * n_embd) + n_embd * wkv
    if l_cache:
        r = n_embd * (l_cache - 1)
    elif kda:
        r = 3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * kda
    else:
        r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * groups * d_state)
    if kda:
        s = kda * kda * n_head
    elif arch == "minimax-01":
        head = key("attention.key_length") or (n_embd // n_head if n_head else 0)
        s = head * head * n_head
    else:
        s = d_state * d_inner
    return r + s


def layer_layout(meta: GGUFMetadata) -> LayerLayout:
    """The layers of a GGUF header: which keep a KV cache (full or windowed), which a recurrent state."""
    arch = (meta.architecture or "").lower()
    blocks = meta.block_count or 1
    n = max(1, blocks - _int(meta.get(f"{arch}.nextn_predict_layers")))
    heads = _per_layer(meta.get(f"{arch}.attention.head_count"), n, [0] * n)
    kv_heads = _per_layer(meta.get(f"{arch}.attention.head_count_kv"), n, heads)
    if not any(kv_heads) and arch not in RECURRENT and not any(heads):
        kv_heads = [meta.head_count_kv or 1] * n  # a header without head counts: one KV head a layer
    n_ff = _per_layer(meta.get(f"{arch}.feed_forward_length"), n, [0] * n)
    recurrent = _recurrent(meta, arch, n, kv_heads, n_ff)
    sliding, window = _sliding(meta, arch, n, recurrent)
    k, v = meta.key_length or 128, meta.value_length or meta.key_length or 128
    k_swa = _int(meta.get(f"{arch}.attention.key_length_swa"), k)
    v_swa = _int(meta.get(f"{arch}.attention.value_length_swa"), v)
    attention = [
        kv_heads[i] > 0 and (not recurrent[i] or arch == "falcon-h1")
        and not (arch.startswith("nemotron_h") and n_ff[i] > 0)
        for i in range(n)
    ]  # fmt: skip
    full_kv = sum(kv_heads[i] * (k + v) for i in range(n) if attention[i] and not sliding[i])
    swa_kv = sum(kv_heads[i] * (k_swa + v_swa) for i in range(n) if attention[i] and sliding[i])
    n_recurrent = sum(recurrent)
    state = _state_elements(meta, arch, heads[0] if heads else 0) if n_recurrent else 0
    return LayerLayout(
        architecture=arch, n_layer=blocks, kv_layers=sum(attention),
        sliding_layers=sum(1 for i in range(n) if attention[i] and sliding[i]),
        recurrent_layers=n_recurrent, full_kv=full_kv, swa_kv=swa_kv, sliding_window=window if swa_kv else 0,
        recurrent_state=state * n_recurrent * 4,
    )  # fmt: skip
