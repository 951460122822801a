"""What the engine has loaded and where: frozen records for the UI, the CLI and bug reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.gguf.arch import MemoryKind, Rollback


@dataclass(frozen=True)
class Device:
    """A ggml compute device (CPU, a CUDA GPU, Apple Metal, a Vulkan GPU, ...)."""

    name: str  # ggml's name: "CPU", "CUDA0", "MTL0", "Vulkan0"
    description: str
    kind: str  # "CPU", "GPU", "IGPU", "ACCEL"
    memory_free: int
    memory_total: int
    software: bool = False  # a software renderer (Mesa's llvmpipe, SwiftShader) that ggml lists as a GPU


@dataclass(frozen=True)
class Offload:
    """Where a loaded model's layers run."""

    n_gpu_layers_requested: int  # -1: all
    layers_offloaded: int
    layers_total: int  # the repeating layers and the output layer
    backend: str  # "CPU", "CUDA", "Metal", ...
    device: str = ""  # the GPU's description (empty on the CPU)
    failed_layers: tuple[int, ...] = ()  # layer counts whose load ran out of GPU memory first
    device_kind: str = ""  # "GPU" (discrete), "IGPU" (integrated), "software" (a software renderer)

    @property
    def on_gpu(self) -> bool:
        return self.layers_offloaded > 0

    def describe(self) -> str:
        """Where the layers run, e.g. "29/29 layers on CUDA (NVIDIA GeForce RTX 4060)" or "CPU"."""
        if not self.on_gpu:
            text = "CPU"
        else:
            what = {"IGPU": "integrated GPU", "software": "software renderer"}.get(self.device_kind, "")
            device = ", ".join(x for x in (self.device, what) if x)
            where = f"{self.backend} ({device})" if device else self.backend
            text = f"{self.layers_offloaded}/{self.layers_total} layers on {where}"
        if self.failed_layers:
            text += f", fewer than planned: the GPU ran out of memory with {self.failed_layers[0]}"
        return text


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
    architecture: str = ""  # the GGUF's general.architecture
    memory: MemoryKind = MemoryKind.ATTENTION
    rollback: Rollback = Rollback.TRIM  # how a rejected draft is undone
    snapshots: int = 0  # per-token recurrent snapshots kept (rollbacks up to this many are free)
    window: int = 0  # sliding-window size of a window that reuses its cells (0: none)
    experts: int = 0  # a mixture of experts: experts per layer (0: dense)
    experts_used: int = 0  # experts each token uses
    mtp_layers: int = 0  # multi-token-prediction layers loaded with it (mode "mtp" drafts with them)


@dataclass(frozen=True)
class EngineInfo:
    """The loaded pair: the target, the draft (if any), the context size and the compute devices."""

    backend: str
    devices: tuple[Device, ...]
    n_ctx: int
    target: ModelInfo
    draft: ModelInfo | None = None
    gpu_offload: bool = False  # this llama.cpp build can offload to a GPU
    offload_note: str = ""  # why auto offload left a model on the CPU (no GPU, a software renderer, ...)
    # what auto mode's cost model holds now: each batch size's cost in decode steps ("ratios") and the
    # draft's step ("draft"), timed at load and by every round since (None: no such model)
    auto_costs: dict[str, Any] | None = None

    def placement(self) -> str:
        """Where each model runs, in one line (for the CLI, the self-test and the status bar)."""
        gpus = [d for d in self.devices if d.kind in ("GPU", "IGPU")]
        if not self.target.offload.on_gpu and not (self.draft and self.draft.offload.on_gpu):
            if self.offload_note:
                return f"CPU only ({self.offload_note})"
            if not self.gpu_offload:
                return "CPU only (this llama.cpp build has no GPU support)"
            if not gpus:
                return "CPU only (no GPU found)"
        parts = [f"target: {self.target.offload.describe()}"]
        if self.draft is not None:
            parts.append(f"draft: {self.draft.offload.describe()}")
        line = "; ".join(parts)
        return f"{line} ({self.offload_note})" if self.offload_note else line

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
    devices: tuple[Device, ...] = ()  # the compute devices llama.cpp sees (loaded or not)
    gpu_offload: bool = False  # this llama.cpp build can offload to a GPU

    @property
    def loaded(self) -> bool:
        return self.engine is not None


@dataclass(frozen=True)
class HistoryInfo:
    """The drafting history: what the history drafter has learned from the user's conversations."""

    enabled: bool  # the loaded pair keeps a history (``LoadSettings.history_dir``)
    ready: bool = False  # loaded from disk (it loads in the background)
    tokens: int = 0
    documents: int = 0  # conversations and API requests
    size_bytes: int = 0  # on disk
