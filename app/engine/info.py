"""What the engine has loaded and where: frozen records for the UI, the CLI and bug reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Device:
    """A ggml compute device (CPU, a CUDA GPU, Apple Metal, ...)."""

    name: str
    description: str
    kind: str  # "CPU", "GPU", "IGPU", "ACCEL"
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class Offload:
    """Where a loaded model's layers run."""

    n_gpu_layers_requested: int  # -1: all
    layers_offloaded: int
    layers_total: int  # the repeating layers and the output layer
    backend: str  # "CPU", "CUDA", "Metal", ...

    @property
    def on_gpu(self) -> bool:
        return self.layers_offloaded > 0


@dataclass(frozen=True)
class ModelInfo:
    """One loaded model."""

    path: str
    description: str  # llama.cpp's one-line description (architecture, size, quantization)
    size_bytes: int
    n_params: int
    n_layer: int
    n_vocab: int
    offload: Offload
    n_threads: int


@dataclass(frozen=True)
class EngineInfo:
    """The loaded pair: the target, the draft (if any), the context size and the compute devices."""

    backend: str
    devices: tuple[Device, ...]
    n_ctx: int
    target: ModelInfo
    draft: ModelInfo | None = None

    @property
    def size_bytes(self) -> int:
        """Both models' weights."""
        return self.target.size_bytes + (self.draft.size_bytes if self.draft else 0)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON output."""
        return asdict(self)


@dataclass(frozen=True)
class EngineStatus:
    """The engine process as its client sees it: what is loaded, and whether it is generating."""

    pid: int
    generating: bool
    backend: str
    engine: EngineInfo | None = None  # None: nothing loaded

    @property
    def loaded(self) -> bool:
        return self.engine is not None
