"""Where the models run: the offload plan for "auto" (as many layers on the GPU as fit), and the
retry with fewer target layers when a load runs out of GPU memory. Pure functions; the engine loads.

``n_gpu_layers`` in :class:`~app.engine.settings.LoadSettings`: ``None`` = auto, ``-1`` = all,
``0`` = CPU only, ``N`` = the last N layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from app.engine.errors import LlamaError
from app.engine.info import Device
from app.gguf.memory import COMPUTE_BUFFER, GPU_RESERVE, Footprint

AUTO = None
ALL = -1

T = TypeVar("T")


@dataclass(frozen=True)
class OffloadPlan:
    """GPU layers for each model (-1: all, 0: none) and what the plan had to go on."""

    target_layers: int
    draft_layers: int
    device: Device | None = None  # the GPU it plans for (None: CPU only)
    budget: int = 0  # bytes of GPU memory it planned with

    @property
    def on_gpu(self) -> bool:
        return self.target_layers != 0 or self.draft_layers != 0


def gpu_device(devices: Sequence[Device]) -> Device | None:
    """The GPU llama.cpp offloads to first (a discrete or integrated GPU), or None."""
    return next((d for d in devices if d.kind in ("GPU", "IGPU")), None)


def gpu_budget(device: Device) -> int:
    """Bytes the models may take on ``device``: what is free, less a reserve for the display and the
    driver (a Mac's Metal device reports its recommended working set: no reserve there)."""
    free = device.memory_free or device.memory_total
    reserve = 0 if device.kind == "IGPU" or device.name.startswith("MTL") else GPU_RESERVE
    return max(0, free - reserve)


def plan_offload(
    target: Footprint,
    draft: Footprint | None,
    device: Device | None,
    *,
    target_request: int | None = AUTO,
    draft_request: int | None = AUTO,
) -> OffloadPlan:
    """The layers to offload. An explicit request (``-1``, ``0``, ``N``) is kept; ``AUTO`` puts the
    draft on the GPU if it fits whole, then as many target layers as the rest of the budget holds
    (all of both where they fit). Without a GPU (or an offload-capable build) everything stays on the
    CPU."""
    if device is None:
        return OffloadPlan(
            0 if target_request is AUTO else target_request, 0 if draft_request is AUTO else draft_request
        )
    budget = left = gpu_budget(device)
    draft_layers = 0
    if draft is not None:
        if draft_request is AUTO:
            if draft.total <= left:
                draft_layers = ALL
                left -= draft.total
        else:
            draft_layers = draft_request
            left -= _on_gpu(draft, draft_request)
    if target_request is not AUTO:
        return OffloadPlan(target_request, draft_layers, device, budget)
    if target.total <= left:
        return OffloadPlan(ALL, draft_layers, device, budget)
    room = max(0, left - COMPUTE_BUFFER)
    layers = min(target.layers_total - 1, room // target.per_layer)
    return OffloadPlan(int(layers), draft_layers, device, budget)


def _on_gpu(model: Footprint, layers: int) -> int:
    """Bytes ``layers`` of ``model`` take on the GPU (-1: all of it)."""
    if layers == 0:
        return 0
    if layers < 0 or layers >= model.layers_total:
        return model.total
    return layers * model.per_layer + COMPUTE_BUFFER


def fewer_layers(layers: int, total: int) -> int:
    """The next, smaller layer count to try after a load ran out of GPU memory with ``layers``."""
    n = total if layers < 0 else min(layers, total)
    return n // 2 if n > 1 else 0


def load_with_fewer_layers(
    load: Callable[[int], T], layers: int, total: int, *, retry: bool
) -> tuple[T, int, tuple[int, ...]]:
    """``load(layers)``; when it fails and ``retry`` is set (an automatic plan), again with fewer GPU
    layers until it loads or nothing is left on the GPU. Returns the result, the layers it loaded
    with and the layer counts that failed."""
    failed: list[int] = []
    while True:
        try:
            return load(layers), layers, tuple(failed)
        except LlamaError:
            if not retry or layers == 0:
                raise
            failed.append(layers)
            layers = fewer_layers(layers, total)
