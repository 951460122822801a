"""Where the models run: which GPU auto offload uses (a real one: never a software renderer, a
discrete GPU before an integrated one), the offload plan for "auto" (the draft whole, then as many
target layers as fit), why the models stay on the CPU, and the retry with fewer target layers when a
load runs out of GPU memory. Pure functions; the engine loads.

``n_gpu_layers`` in :class:`~app.engine.settings.LoadSettings`: ``None`` = auto, ``-1`` = all,
``0`` = CPU only, ``N`` = the last N layers. An explicit count offloads to whatever GPU llama.cpp
sees, a software renderer included: ``GGML_VK_VISIBLE_DEVICES=0`` with ``--gpu-layers all`` runs on
Mesa's lavapipe (Vulkan on the CPU), which is how the tests reach a real Vulkan device without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from app.engine.errors import LlamaError
from app.engine.info import Device
from app.gguf.memory import COMPUTE_BUFFER, GPU_RESERVE, Footprint

AUTO = None
ALL = -1

# Vulkan (and other APIs) on the CPU: conformant devices, but slower than llama.cpp's own CPU backend.
# ggml lists them as GPUs (Vulkan skips a CPU-type device unless GGML_VK_VISIBLE_DEVICES names it);
# what tells them apart is the driver's device name.
SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "softpipe", "swiftshader", "microsoft basic render")
# tests and CI only: auto offload may plan for a software renderer (its real memory figures)
ALLOW_SOFTWARE_ENV = "TANDEM_ALLOW_SOFTWARE_GPU"
# backends that are not a GPU of this machine
_NOT_GPU_BACKENDS = frozenset({"CPU", "BLAS", "RPC", "AMX"})

T = TypeVar("T")


@dataclass(frozen=True)
class OffloadPlan:
    """GPU layers for each model (-1: all, 0: none) and what the plan had to go on."""

    target_layers: int
    draft_layers: int
    device: Device | None = None  # the GPU it plans for (None: CPU only)
    budget: int = 0  # bytes of GPU memory it planned with
    reason: str = ""  # why a model stays on the CPU (no GPU, a software renderer, too little memory)
    # the GPUs llama.cpp may use (None: its own choice; (): none, not even for a large batch's matrix
    # products, which llama.cpp otherwise sends to a GPU whatever the layers: a skipped software renderer)
    gpus: tuple[str, ...] | None = None

    @property
    def on_gpu(self) -> bool:
        return self.target_layers != 0 or self.draft_layers != 0


def is_software(device: Device) -> bool:
    """A software renderer (Mesa's llvmpipe/lavapipe, SwiftShader), which ggml lists as a GPU."""
    text = f"{device.name} {device.description}".lower()
    return device.software or any(s in text for s in SOFTWARE_RENDERERS)


def backend_of(device: Device) -> str:
    """ "CUDA", "Metal", "Vulkan", ... from a ggml device name ("Vulkan0", "MTL0")."""
    name = device.name.rstrip("0123456789")
    return {"MTL": "Metal"}.get(name, name)


def used_gpu(devices: Sequence[Device]) -> Device | None:
    """The GPU llama.cpp offloads to when no device is named: its first discrete GPU, else its first
    integrated one (llama.cpp uses integrated GPUs only where no discrete GPU is present)."""
    gpus = [d for d in devices if d.kind == "GPU"] or [d for d in devices if d.kind == "IGPU"]
    return gpus[0] if gpus else None


def software_allowed() -> bool:
    return os.environ.get(ALLOW_SOFTWARE_ENV, "") not in ("", "0")


def gpu_device(devices: Sequence[Device], *, allow_software: bool | None = None) -> Device | None:
    """The GPU auto offload plans for: a real GPU, the discrete one before an integrated one, or None.
    A software renderer never (``TANDEM_ALLOW_SOFTWARE_GPU=1`` lets tests plan for one)."""
    if allow_software is None:
        allow_software = software_allowed()
    real = [d for d in devices if d.kind in ("GPU", "IGPU") and (allow_software or not is_software(d))]
    return used_gpu(real)


def no_gpu_reason(devices: Sequence[Device], backends: Mapping[str, int], *, gpu_offload: bool = True) -> str:
    """Why auto offload found no GPU to use, in a few words (for the placement line)."""
    software = [d for d in devices if d.kind in ("GPU", "IGPU") and is_software(d)]
    if software:
        d = software[0]
        return (
            f"{backend_of(d)} device {d.description or d.name} is a software renderer, slower than the "
            "CPU: auto offload skips it (--gpu-layers all uses it)"
        )
    gpu_backends = sorted(name for name in backends if name not in _NOT_GPU_BACKENDS)
    empty = [name for name in gpu_backends if not backends[name]]
    if empty:
        what = " and ".join(empty)
        driver = "no Vulkan driver, or only a software renderer" if empty == ["Vulkan"] else "no driver"
        return f"this build has {what}, but {what} found no GPU ({driver})"
    if not gpu_backends and not gpu_offload:
        return "this llama.cpp build has no GPU support"
    return "no GPU found"


def choose_device(
    devices: Sequence[Device],
    backends: Mapping[str, int],
    *,
    gpu_offload: bool,
    target_request: int | None = AUTO,
    draft_request: int | None = AUTO,
) -> tuple[Device | None, str]:
    """The GPU the plan is for, and why none where auto offload has none. Auto uses a real GPU only;
    GPU layers asked for the target explicitly go where llama.cpp puts them, a software renderer
    too (``GGML_VK_VISIBLE_DEVICES=0 --gpu-layers all``), and an automatic draft follows them."""
    if not gpu_offload:
        device = None
    else:
        device = gpu_device(devices)
        if device is None and target_request not in (AUTO, 0):
            device = used_gpu(devices)
    if device is not None or (target_request is not AUTO and draft_request is not AUTO):
        return device, ""
    return None, no_gpu_reason(devices, backends, gpu_offload=gpu_offload)


def gpus_for(devices: Sequence[Device], device: Device | None) -> tuple[str, ...] | None:
    """The GPUs llama.cpp may use for a plan on ``device``: its own choice, except that a plan without a
    GPU while a software renderer is visible uses no GPU at all."""
    if device is None and any(d.kind in ("GPU", "IGPU") and is_software(d) for d in devices):
        return ()
    return None


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


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
    draft_layers = 0 if draft_request is AUTO else draft_request  # an explicit count, footprint or not
    if draft is not None:
        if draft_request is AUTO:
            if draft.total <= left:
                draft_layers = ALL
                left -= draft.total
            else:  # a GPU that cannot hold the draft is not used for speculation at all
                reason = (
                    f"{device.description or device.name} has {_size(budget)} free for models, "
                    f"the draft needs {_size(draft.total)}"
                )
                target_layers = 0 if target_request is AUTO else target_request
                return OffloadPlan(target_layers, 0, device if target_layers else None, budget, reason)
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
