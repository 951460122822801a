"""The machine the fit and the speed estimate are for: RAM, cores, memory bandwidth and GPUs.

The GPUs come as data: the engine process lists ggml's compute devices (``EngineClient().info()``), and
the CLI and the app turn them into `Gpu` records with `gpus_from_devices` (duck-typed: this package
never imports the engine). Without them (the engine did not start) `detect_machine` guesses: Apple
Silicon has a Metal GPU whose budget is Metal's working set, anything else no GPU.

GPU budget: Apple Silicon (unified memory) gets Metal's recommendedMaxWorkingSetSize, about 2/3 of RAM up
to 36 GiB and 3/4 above (the engine reports the real figure); a discrete GPU gets its free memory minus
GPU_RESERVE. CPU budget: the available RAM (psutil), capped at 90 % of the total.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import psutil

from app.gguf.memory import GPU_RESERVE, GiB

from .bandwidth import DEFAULT_CPU, Bandwidth, cpu_name, gpu_bandwidth

__all__ = [
    "CPU_FRACTION",
    "GPU_EFFICIENCY",
    "GPU_RESERVE",
    "DeviceLike",
    "Gpu",
    "Machine",
    "detect_machine",
    "gpus_from_devices",
    "metal_working_set",
]

#: CPU budget is at most this fraction of total RAM
CPU_FRACTION = 0.9
#: the share of a GPU's peak bandwidth llama.cpp's decoding reaches: about 45-80 % in published runs
#: (Apple's M1 to M2 Ultra, an RTX 4090), lower on the fastest chips; docs/benchmarks.md
GPU_EFFICIENCY = 0.6

_BACKENDS = {"cuda": "cuda", "metal": "metal", "mtl": "metal", "vulkan": "vulkan", "rocm": "rocm",
             "hip": "rocm", "sycl": "sycl", "opencl": "opencl", "cann": "cann", "musa": "musa"}  # fmt: skip


@dataclass(frozen=True)
class Gpu:
    """One GPU. For unified memory (Apple) `total`/`free` are the Metal working-set budget.

    `kind` is the backend ("metal", "cuda", "vulkan", ...); `bandwidth` its peak memory bandwidth in
    bytes/s, None to look it up by name (`bandwidth.gpu_bandwidth`)."""

    name: str
    kind: str
    total: int
    free: int | None = None
    unified: bool = False
    bandwidth: float | None = None

    def peak_bandwidth(self, cpu: float = DEFAULT_CPU) -> float:
        """Bytes/s: the given figure, else the table's (an integrated GPU's default is `cpu`, the RAM's)."""
        if self.bandwidth:
            return self.bandwidth
        return gpu_bandwidth(self.name, apple=self.kind == "metal", integrated=self.unified, cpu=cpu)

    @property
    def budget(self) -> int:
        """Bytes the models may use on it."""
        if self.unified:
            return self.total
        return max(0, (self.free if self.free is not None else self.total) - GPU_RESERVE)


@dataclass(frozen=True)
class Machine:
    """The facts the fit and the speed estimate need; build by hand in tests, with `detect_machine` in
    the app. `cpu_bandwidth` is bytes/s (None: not measured, `DEFAULT_CPU` is assumed)."""

    total_ram: int
    available_ram: int
    physical_cores: int
    gpus: tuple[Gpu, ...] = ()
    cpu_bandwidth: float | None = None
    bandwidth_source: str = "assumed"  # measured | cached | assumed
    gpu_source: str = "given"  # engine (the engine's device list) | guessed (no engine) | given
    cpu: str = ""

    @property
    def unified(self) -> bool:
        return any(g.unified for g in self.gpus)

    @property
    def gpu_budget(self) -> int:
        """Bytes the model may use on GPU(s) (0 without a GPU); llama.cpp splits layers across GPUs."""
        return sum(g.budget for g in self.gpus)

    @property
    def cpu_budget(self) -> int:
        """Bytes of RAM the models may use."""
        return max(0, min(self.available_ram, int(self.total_ram * CPU_FRACTION)))

    @property
    def ram_bandwidth(self) -> float:
        """Bytes/s the CPU reads weights at: measured, else `DEFAULT_CPU`."""
        return self.cpu_bandwidth or DEFAULT_CPU

    @property
    def gpu_read_bandwidth(self) -> float:
        """Bytes/s decoding reads weights at on the GPU(s): `GPU_EFFICIENCY` of the peak; layers split
        across GPUs by their budgets are read one GPU after the other (0 without a GPU)."""
        budgets = [(g, g.budget) for g in self.gpus if g.budget > 0]
        total = sum(b for _, b in budgets)
        if not total:
            return 0.0
        cpu = self.ram_bandwidth
        return 1 / sum(b / total / (GPU_EFFICIENCY * g.peak_bandwidth(cpu)) for g, b in budgets)


def metal_working_set(total_ram: int) -> int:
    """Approximation of Metal's recommendedMaxWorkingSetSize for a Mac with `total_ram` bytes."""
    return int(total_ram * (0.75 if total_ram > 36 * GiB else 2 / 3))


class DeviceLike(Protocol):
    """A compute device as the engine lists it (``app.engine.Device``)."""

    name: str
    description: str
    kind: str  # "CPU", "GPU", "IGPU", "ACCEL"
    memory_free: int
    memory_total: int


def gpus_from_devices(devices: Iterable[DeviceLike]) -> tuple[Gpu, ...]:
    """`Gpu` records for the GPUs among the engine's devices (kinds "GPU" and "IGPU"); the backend from
    ggml's device name ("CUDA0", "Metal", "Vulkan0"), the name from its description."""
    gpus = []
    for d in devices:
        if d.kind not in ("GPU", "IGPU"):
            continue
        prefix = d.name.rstrip("0123456789").lower()
        backend = _BACKENDS.get(prefix, prefix or "gpu")
        gpus.append(Gpu(
            name=d.description or d.name, kind=backend, total=int(d.memory_total),
            free=int(d.memory_free) if d.memory_free else None,
            unified=backend == "metal" or d.kind == "IGPU",
        ))  # fmt: skip
    return tuple(gpus)


def _guess_gpus(total_ram: int) -> tuple[Gpu, ...]:
    """Without the engine's device list: Apple Silicon's Metal GPU, else none."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        ws = metal_working_set(total_ram)
        return (Gpu(name="Apple Silicon GPU", kind="metal", total=ws, free=ws, unified=True),)
    return ()


def detect_machine(gpus: Iterable[Gpu] | None = None, *, bandwidth: Bandwidth | None = None) -> Machine:
    """RAM and cores from psutil, the GPUs given (from the engine's devices: `gpus_from_devices`; None:
    guessed, see the module) and the CPU's `bandwidth` (None: not measured). Never fails."""
    vm = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    found = _guess_gpus(vm.total) if gpus is None else tuple(gpus)
    return Machine(
        total_ram=vm.total, available_ram=vm.available, physical_cores=cores, gpus=found,
        cpu_bandwidth=bandwidth.bytes_per_second if bandwidth is not None else None,
        bandwidth_source=bandwidth.source if bandwidth is not None else "assumed",
        gpu_source="guessed" if gpus is None else "engine", cpu=cpu_name(),
    )  # fmt: skip
