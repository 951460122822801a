"""What a model needs in memory, from its GGUF header: weights, KV cache and compute buffers.

Shared by the engine's offload plan and models_registry's fit. All sizes in bytes::

    weights  = the GGUF file (every part of a split model)
    KV cache = n_layers * n_ctx * n_kv_heads * (key_dim + value_dim) * 2 (f16)
    compute  = COMPUTE_BUFFER per model (llama.cpp's graph buffers at n_batch 512, logits included)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from app.gguf.meta import GGUFMetadata, read_metadata_file
from app.gguf.split import first_part, model_bytes

MiB = 1024**2
GiB = 1024**3
KV_BYTES_PER_ELEMENT = 2  # llama.cpp's default f16 cache
COMPUTE_BUFFER = 384 * MiB
RUNTIME_OVERHEAD = 512 * MiB  # backend context, scratch buffers and the process, once per pair
GPU_RESERVE = 512 * MiB  # VRAM left to the display and the driver on a discrete GPU
RECURRENT_SNAPSHOTS = 16
"""Per-token recurrent-state snapshots the engine keeps per sequence (``n_rs_seq``) for the
architectures in `app.gguf.arch.SNAPSHOTS`: a rejected draft of up to this many tokens rolls back by
snapshot; a longer one by checkpoint and replay."""


def kv_cache_bytes(
    n_layers: int,
    n_ctx: int,
    n_kv_heads: int,
    head_dim: int,
    *,
    value_dim: int | None = None,
    bytes_per_element: int = KV_BYTES_PER_ELEMENT,
) -> int:
    """K and V cache bytes: ``n_layers * n_ctx * n_kv_heads * (head_dim + value_dim) * bytes``."""
    v = head_dim if value_dim is None else value_dim
    return n_layers * n_ctx * n_kv_heads * (head_dim + v) * bytes_per_element


@dataclass(frozen=True)
class Footprint:
    """One model's memory at a context size."""

    weights: int
    n_layer: int  # repeating layers; llama.cpp offloads these and the output layer
    kv: int

    @property
    def layers_total(self) -> int:
        return self.n_layer + 1

    @property
    def per_layer(self) -> int:
        """Weights and KV of one offloadable layer (embeddings spread evenly: a slight overestimate)."""
        return -(-(self.weights + self.kv) // self.layers_total)

    @property
    def total(self) -> int:
        return self.weights + self.kv + COMPUTE_BUFFER


def footprint(meta: GGUFMetadata, weights: int, n_ctx: int) -> Footprint:
    """A model's footprint from its header and its size on disk."""
    n_layer = meta.block_count or 1
    heads = meta.head_count_kv or 1
    kv = kv_cache_bytes(n_layer, n_ctx, heads, meta.key_length or 128, value_dim=meta.value_length)
    return Footprint(weights, n_layer, kv)


def file_footprint(path: str | os.PathLike[str], n_ctx: int) -> Footprint:
    """The footprint of a model file on disk (a split model from its first part, every part counted)."""
    return footprint(read_metadata_file(first_part(path)), model_bytes(path), n_ctx)
