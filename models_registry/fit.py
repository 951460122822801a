"""Will a target/draft pair fit this machine? Memory estimates and verdicts (pure functions + detection).

Estimate of what a pair needs (all in bytes)::

    weights  = size of both GGUF files (llama.cpp maps them whole)
    KV cache = 2 (K and V) * n_layers * n_ctx * n_kv_heads * head_dim * 2 (f16), per model
    compute  = COMPUTE_BUFFER per model (llama.cpp's graph buffers at n_batch=512, logits included)
    overhead = RUNTIME_OVERHEAD once (backend context, scratch, process)

Gemma 3's sliding-window layers need less KV than this formula says: the estimate errs on the safe side.

GPU budget: Apple Silicon (unified memory) gets Metal's recommendedMaxWorkingSetSize, about 2/3 of RAM up
to 36 GiB and 3/4 above; NVIDIA gets the free VRAM that ``nvidia-smi`` reports minus GPU_RESERVE. CPU
budget: the available RAM (psutil), capped at 90 % of the total.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import psutil

from .catalog import Catalog, CatalogModel, Pair, default_catalog

__all__ = [
    "COMFORT",
    "COMPUTE_BUFFER",
    "GPU_RESERVE",
    "RUNTIME_OVERHEAD",
    "Gpu",
    "Machine",
    "ModelNeed",
    "PairFit",
    "PairNeed",
    "Verdict",
    "detect_machine",
    "estimate_model",
    "estimate_pair",
    "fit_catalog",
    "fit_pair",
    "kv_cache_bytes",
    "metal_working_set",
    "recommend",
]

MiB = 1024**2
GiB = 1024**3
#: KV cache element size (llama.cpp's default f16 cache)
KV_BYTES_PER_ELEMENT = 2
#: graph/compute buffers of one model at n_batch 512 (logits for ~150k-262k vocabularies included)
COMPUTE_BUFFER = 384 * MiB
#: backend context, scratch buffers and the process itself, once per pair
RUNTIME_OVERHEAD = 512 * MiB
#: VRAM left untouched on discrete GPUs (display, driver)
GPU_RESERVE = 512 * MiB
#: a fit is "comfortable" when the need is at most this fraction of the budget
COMFORT = 0.9
#: CPU budget is at most this fraction of total RAM
CPU_FRACTION = 0.9

Verdict = Literal["gpu", "partial", "cpu", "none"]


# ----------------------------------------------------------------------------------------- machine


@dataclass(frozen=True)
class Gpu:
    """One GPU. For unified memory (Apple) `total`/`free` are the Metal working-set budget."""

    name: str
    kind: Literal["metal", "cuda"]
    total: int
    free: int | None = None
    unified: bool = False


@dataclass(frozen=True)
class Machine:
    """The facts the fit needs; build by hand in tests, with `detect_machine` in the app."""

    total_ram: int
    available_ram: int
    physical_cores: int
    gpus: tuple[Gpu, ...] = ()

    @property
    def unified(self) -> bool:
        return any(g.unified for g in self.gpus)

    @property
    def gpu_budget(self) -> int:
        """Bytes the model may use on GPU(s) (0 without a GPU); llama.cpp splits layers across GPUs."""
        total = 0
        for g in self.gpus:
            if g.unified:
                total += g.total
            else:
                total += max(0, (g.free if g.free is not None else g.total) - GPU_RESERVE)
        return total

    @property
    def cpu_budget(self) -> int:
        """Bytes of RAM the models may use."""
        return max(0, min(self.available_ram, int(self.total_ram * CPU_FRACTION)))


def metal_working_set(total_ram: int) -> int:
    """Approximation of Metal's recommendedMaxWorkingSetSize for a Mac with `total_ram` bytes."""
    return int(total_ram * (0.75 if total_ram > 36 * GiB else 2 / 3))


def _nvidia_gpus(timeout: float = 5.0) -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """Parse ``nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        try:
            total, free = int(float(parts[1])) * MiB, int(float(parts[2])) * MiB
        except ValueError:
            continue
        gpus.append(Gpu(name=parts[0], kind="cuda", total=total, free=free))
    return tuple(gpus)


def detect_machine() -> Machine:
    """RAM and cores from psutil, plus Apple Silicon (Metal) or NVIDIA GPUs; never fails on missing GPUs."""
    vm = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    gpus: tuple[Gpu, ...] = ()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        ws = metal_working_set(vm.total)
        gpus = (Gpu(name="Apple Silicon GPU", kind="metal", total=ws, free=ws, unified=True),)
    else:
        gpus = _nvidia_gpus()
    return Machine(total_ram=vm.total, available_ram=vm.available, physical_cores=cores, gpus=gpus)


# ---------------------------------------------------------------------------------------- estimates


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
class ModelNeed:
    """Memory one model needs at a context size."""

    name: str
    weights: int
    kv: int
    compute: int
    n_layers: int
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def per_layer(self) -> int:
        """Weights + KV of one repeating layer (embeddings spread evenly: a slight overestimate)."""
        return -(-(self.weights + self.kv) // self.n_layers)


def estimate_model(
    model: CatalogModel,
    *,
    quant: str | None = None,
    n_ctx: int = 4096,
    weights: int | None = None,
) -> ModelNeed:
    """Need of a catalog model; `n_ctx` is capped at the model's trained context."""
    ctx = min(n_ctx, model.context_length)
    size = weights if weights is not None else model.file(quant).size
    return ModelNeed(
        name=model.id, weights=size, kv=kv_cache_bytes(model.n_layers, ctx, model.n_kv_heads, model.head_dim),
        compute=COMPUTE_BUFFER, n_layers=model.n_layers, n_ctx=ctx,
    )  # fmt: skip


@dataclass(frozen=True)
class PairNeed:
    target: ModelNeed
    draft: ModelNeed
    overhead: int = RUNTIME_OVERHEAD

    @property
    def total(self) -> int:
        return self.target.total + self.draft.total + self.overhead


def estimate_pair(
    target: CatalogModel,
    draft: CatalogModel,
    *,
    n_ctx: int = 4096,
    target_quant: str | None = None,
    draft_quant: str | None = None,
) -> PairNeed:
    """Need of a pair: both models at the same context."""
    return PairNeed(
        target=estimate_model(target, quant=target_quant, n_ctx=n_ctx),
        draft=estimate_model(draft, quant=draft_quant, n_ctx=n_ctx),
    )


# ------------------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class PairFit:
    """Where a pair can run on a machine."""

    verdict: Verdict
    need: PairNeed
    gpu_layers: int  # target layers on the GPU (all of them for "gpu", 0 for "cpu"/"none")
    gpu_budget: int
    cpu_budget: int
    comfortable: bool
    pair: Pair | None = field(default=None, compare=False)

    @property
    def summary(self) -> str:
        n = self.need.target.n_layers
        if self.verdict == "gpu":
            return "fits fully on GPU"
        if self.verdict == "partial":
            on_cpu = n - self.gpu_layers
            return f"fits with {self.gpu_layers} target layers offloaded to the GPU ({on_cpu} on CPU)"
        if self.verdict == "cpu":
            return "fits on CPU only"
        return "does not fit"


def fit_pair(need: PairNeed, machine: Machine, *, pair: Pair | None = None) -> PairFit:
    """Verdict for `need` on `machine`: all on GPU, target partly offloaded, CPU only, or no fit.

    Partial offload keeps the draft, both compute buffers and the runtime overhead on the GPU and gives
    the rest of the GPU budget to whole target layers (weights + KV); the other layers must fit in RAM.
    On unified memory everything also counts against RAM.
    """
    gpu, cpu = machine.gpu_budget, machine.cpu_budget
    total = need.total
    t = need.target

    def result(verdict: Verdict, layers: int, used_gpu: int, used_cpu: int) -> PairFit:
        ok_gpu = used_gpu <= COMFORT * gpu if used_gpu else True
        ok_cpu = used_cpu <= COMFORT * cpu if used_cpu else True
        comfy = verdict != "none" and ok_gpu and ok_cpu
        return PairFit(verdict, need, layers, gpu, cpu, comfy, pair)

    if gpu and total <= gpu and (not machine.unified or total <= cpu):
        return result("gpu", t.n_layers, total, total if machine.unified else 0)
    if gpu:
        fixed = need.draft.total + t.compute + need.overhead
        layers = min(t.n_layers - 1, max(0, (gpu - fixed) // t.per_layer)) if gpu > fixed else 0
        if layers > 0:
            on_gpu = fixed + layers * t.per_layer
            on_cpu = total if machine.unified else (t.n_layers - layers) * t.per_layer
            if on_cpu <= cpu:
                return result("partial", int(layers), on_gpu, on_cpu)
    if total <= cpu:
        return result("cpu", 0, 0, total)
    return result("none", 0, 0, 0)


_RANK: dict[Verdict, int] = {"gpu": 3, "partial": 2, "cpu": 1, "none": 0}


def fit_catalog(
    machine: Machine,
    *,
    catalog: Catalog | None = None,
    n_ctx: int = 4096,
    pairs: Iterable[Pair] | None = None,
) -> list[PairFit]:
    """`fit_pair` for every catalog pair (default quantizations), in catalog order."""
    cat = catalog or default_catalog()
    out = []
    for p in pairs if pairs is not None else cat.pairs:
        need = estimate_pair(cat.model(p.target), cat.model(p.draft), n_ctx=n_ctx)
        out.append(fit_pair(need, machine, pair=p))
    return out


def recommend(machine: Machine, *, catalog: Catalog | None = None, n_ctx: int = 4096) -> PairFit | None:
    """The best pair for `machine`: comfortable fits first, then GPU over partial over CPU, then the
    largest target (by parameters). None if nothing fits."""
    cat = catalog or default_catalog()
    fits = [f for f in fit_catalog(machine, catalog=cat, n_ctx=n_ctx) if f.verdict != "none"]
    if not fits:
        return None

    def key(f: PairFit) -> tuple[bool, int, int, int]:
        assert f.pair is not None
        return (f.comfortable, _RANK[f.verdict], cat.model(f.pair.target).params, -f.need.total)

    return max(fits, key=key)
