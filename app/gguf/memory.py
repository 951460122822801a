"""What a model needs in memory, from its GGUF header: weights, KV cache, recurrent state, compute buffers.

Shared by the engine's offload plan and models_registry's fit. All sizes in bytes::

    weights   = the GGUF file (every part of a split model)
    KV cache  = per attention layer: cells * n_kv_heads * (key_dim + value_dim) * 2 (f16), where a
                full layer holds n_ctx cells and a sliding-window layer min(n_ctx, window + 512) padded
                to 256 (llama.cpp's iSWA cache with swa_full off: its n_ubatch is 512)
    recurrent = per recurrent layer (n_embd_r + n_embd_s) * 4 (f32), times 1 + the snapshots the engine
                keeps (`RECURRENT_SNAPSHOTS` for the architectures in `app.gguf.arch.SNAPSHOTS`)

A draft model's context keeps no snapshots and a full-size sliding-window cache (``draft=True``): it
drafts one token at a time, which snapshots cannot undo, and any of its tokens must be removable.
    compute   = COMPUTE_BUFFER per model (llama.cpp's graph buffers at n_batch 512, logits included)

Which layers are recurrent, attention or sliding-window follows the pinned llama.cpp (`app.gguf.layers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from app.gguf.arch import SNAPSHOTS
from app.gguf.layers import N_UBATCH, SWA_PAD, layer_layout, swa_cells
from app.gguf.meta import GGUFMetadata, read_metadata_file
from app.gguf.split import first_part, model_bytes

__all__ = [
    "CHECKPOINT_SLOTS", "COMPUTE_BUFFER", "GPU_RESERVE", "KV_BYTES_PER_ELEMENT", "N_UBATCH",
    "RECURRENT_SNAPSHOTS", "RUNTIME_OVERHEAD", "STATE_BYTES_PER_ELEMENT", "SWA_PAD", "Footprint", "GiB",
    "MiB", "expert_weights",
    "file_footprint", "footprint", "kv_cache_bytes", "recurrent_bytes", "snapshots_for", "swa_cells",
]  # fmt: skip

MiB = 1024**2
GiB = 1024**3
KV_BYTES_PER_ELEMENT = 2  # llama.cpp's default f16 cache
STATE_BYTES_PER_ELEMENT = 4  # recurrent states are f32
COMPUTE_BUFFER = 384 * MiB
RUNTIME_OVERHEAD = 512 * MiB  # backend context, scratch buffers and the process, once per pair
GPU_RESERVE = 512 * MiB  # VRAM left to the display and the driver on a discrete GPU
RECURRENT_SNAPSHOTS = 16
"""Per-token recurrent-state snapshots the engine keeps per sequence (``n_rs_seq``) for the
architectures in `app.gguf.arch.SNAPSHOTS`: a rejected draft of up to this many tokens rolls back by
snapshot; a longer one by checkpoint and replay."""
CHECKPOINT_SLOTS = 2
"""Copies of a recurrent state the engine keeps in RAM (before a round's batch, at a prompt's end)."""


def kv_cache_bytes(
    n_layers: int,
    n_ctx: int,
    n_kv_heads: int,
    head_dim: int,
    *,
    value_dim: int | None = None,
    bytes_per_element: int = KV_BYTES_PER_ELEMENT,
    sliding_layers: int = 0,
    sliding_window: int = 0,
) -> int:
    """K and V cache bytes: ``n_layers * n_ctx * n_kv_heads * (head_dim + value_dim) * bytes``, where
    `sliding_layers` of the `n_layers` hold only `swa_cells` (when `sliding_window` is set)."""
    v = head_dim if value_dim is None else value_dim
    per_cell = n_kv_heads * (head_dim + v) * bytes_per_element
    windowed = min(sliding_layers, n_layers) if sliding_window > 0 else 0
    return per_cell * ((n_layers - windowed) * n_ctx + windowed * swa_cells(n_ctx, sliding_window))


def snapshots_for(architecture: str | None) -> int:
    """The recurrent-state snapshots the engine keeps for `architecture` (``n_rs_seq``)."""
    return RECURRENT_SNAPSHOTS if (architecture or "").lower() in SNAPSHOTS else 0


def recurrent_bytes(state: int, architecture: str | None, *, snapshots: int | None = None) -> int:
    """One sequence's recurrent state (`state` bytes) with its snapshots: ``state * (1 + snapshots)``."""
    n = snapshots_for(architecture) if snapshots is None else snapshots
    return state * (1 + n)


@dataclass(frozen=True)
class Footprint:
    """One model's memory at a context size (`recurrent`: its recurrent state with the snapshots)."""

    weights: int
    n_layer: int  # repeating layers; llama.cpp offloads these and the output layer
    kv: int
    recurrent: int = 0
    checkpoints: int = 0  # copies of the recurrent state the engine keeps in RAM for longer rollbacks

    @property
    def layers_total(self) -> int:
        return self.n_layer + 1

    @property
    def per_layer(self) -> int:
        """Weights, KV and state of one offloadable layer (embeddings spread evenly: an overestimate)."""
        return -(-(self.weights + self.kv + self.recurrent) // self.layers_total)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.checkpoints + COMPUTE_BUFFER


def footprint(
    meta: GGUFMetadata, weights: int, n_ctx: int, *, snapshots: int | None = None, draft: bool = False
) -> Footprint:
    """A model's footprint from its header and its size on disk (`snapshots`: the engine's ``n_rs_seq``,
    default `snapshots_for` the architecture, none for a `draft`)."""
    layout = layer_layout(meta)
    n = 0 if draft and snapshots is None else snapshots
    state = recurrent_bytes(layout.recurrent_state, layout.architecture, snapshots=n)
    kv = layout.kv_bytes(n_ctx, swa_full=draft)
    if not layout.recurrent_layers:
        return Footprint(weights, layout.n_layer, kv)
    return Footprint(weights, layout.n_layer, kv, state, CHECKPOINT_SLOTS * layout.recurrent_state)


def expert_weights(meta: GGUFMetadata) -> tuple[int, int] | None:
    """The routed experts' tensor bytes (``*_exps*``) and every other tensor's (shared experts, router and
    attention included), from the header's tensor infos; None without them or without experts."""
    routed = other = 0
    for t in meta.tensors or ():
        n = t.n_bytes
        if n is None:
            return None
        if "_exps" in t.name:
            routed += n
        else:
            other += n
    return (routed, other) if routed else None


def file_footprint(path: str | os.PathLike[str], n_ctx: int, *, draft: bool = False) -> Footprint:
    """The footprint of a model file on disk (a split model from its first part, every part counted);
    `draft`: as the engine holds a draft model (no snapshots, a full-size sliding-window cache)."""
    return footprint(read_metadata_file(first_part(path)), model_bytes(path), n_ctx, draft=draft)
