"""What a model's architecture means for speculation: its memory kind, how it rolls back, its experts.

The lists follow the pinned llama.cpp (llama-cpp-python 0.3.36, vendored 2026-10-01):
``llm_arch_is_recurrent``, ``llm_arch_is_hybrid`` and ``llm_arch_supports_rs_rollback`` in
``src/llama-arch.cpp``; the sliding-window families set ``hparams.swa_type`` in ``src/models/*.cpp``.
A GGUF header names its architecture (``general.architecture``); mixtures of experts say how many
experts they have and use per token (``<arch>.expert_count``, ``<arch>.expert_used_count``).

Imports nothing of Tandem but the GGUF reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from app.gguf.meta import GGUFMetadata


class MemoryKind(str, Enum):
    """What a model keeps of the text it has read."""

    ATTENTION = "attention"  # a KV cache: any suffix can be removed
    SLIDING_WINDOW = "sliding-window"  # some layers keep only a window of the last tokens (iSWA)
    HYBRID = "hybrid"  # attention layers beside recurrent ones (a fixed-size state per sequence)
    RECURRENT = "recurrent"  # only a fixed-size state: no per-token cache at all


class Rollback(str, Enum):
    """How the engine undoes a rejected draft on a memory kind."""

    TRIM = "trim"  # remove the rejected positions from the KV cache
    SNAPSHOT = "snapshot"  # per-token snapshots of the recurrent state, up to a bound; else a checkpoint
    CHECKPOINT = "checkpoint"  # save the state before verifying, restore it and replay the accepted tokens
    NONE = "none"  # the memory can neither remove tokens nor save and restore its state: no drafting


RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
SNAPSHOTS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)
"""Architectures whose recurrent layers keep per-token snapshots for a bounded rollback (``n_rs_seq``)."""

SLIDING_WINDOW = frozenset(
    {
        "afmoe",
        "cohere2",
        "cohere2moe",
        "dots3note",
        "exaone-moe",
        "exaone4",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4",
        "granite_swa",
        "laguna",
        "llama4",
        "mellum",
        "mimo2",
        "olmo2",
        "gpt-oss",
        "plamo3",
        "smallthinker",
        "step35",
    }
)
"""Architectures with sliding-window layers in the pinned llama.cpp (some only when the header sets a
window: ``<arch>.attention.sliding_window``)."""


def memory_kind(architecture: str | None, *, sliding_window: int = 0) -> MemoryKind:
    """The memory kind of an architecture name (and its header's sliding window, where it has one)."""
    arch = (architecture or "").lower()
    if arch in RECURRENT:
        return MemoryKind.RECURRENT
    if arch in HYBRID:
        return MemoryKind.HYBRID
    if arch in SLIDING_WINDOW and sliding_window != 0:
        return MemoryKind.SLIDING_WINDOW
    return MemoryKind.ATTENTION


def rollback_for(kind: MemoryKind, architecture: str | None) -> Rollback:
    """How a rejected draft is undone on this kind of memory."""
    if kind in (MemoryKind.ATTENTION, MemoryKind.SLIDING_WINDOW):
        return Rollback.TRIM
    if (architecture or "").lower() in SNAPSHOTS:
        return Rollback.SNAPSHOT
    return Rollback.CHECKPOINT


@dataclass(frozen=True)
class ArchFacts:
    """A model's architecture as speculation sees it, from its GGUF header."""

    architecture: str
    memory: MemoryKind
    rollback: Rollback
    sliding_window: int = 0  # tokens a sliding-window layer sees (0: none)
    experts: int = 0  # experts per MoE layer (0: a dense model)
    experts_used: int = 0  # experts each token is routed to

    @property
    def moe(self) -> bool:
        return self.experts > 1 and self.experts_used > 0

    @property
    def draft_kind(self) -> str:
        """What the file drafts as when given as a draft: "eagle3", "assistant" or "" (a draft model)."""
        return {"eagle3": "eagle3", "gemma4-assistant": "assistant"}.get(self.architecture, "")

    @property
    def words(self) -> str:
        """One line: 'qwen35moe: hybrid (recurrent + attention), mixture of 256 experts (8 per token)'."""
        kind = {
            MemoryKind.ATTENTION: "attention",
            MemoryKind.SLIDING_WINDOW: f"sliding-window attention ({self.sliding_window}-token window)"
            if self.sliding_window > 0
            else "sliding-window attention",
            MemoryKind.HYBRID: "hybrid (recurrent + attention layers)",
            MemoryKind.RECURRENT: "recurrent (state-space / linear attention)",
        }[self.memory]
        moe = f", mixture of {self.experts} experts ({self.experts_used} per token)" if self.moe else ""
        return f"{self.architecture}: {kind}{moe}"


def _int(meta: GGUFMetadata, key: str) -> int:
    value = meta.get(key)
    if isinstance(value, (list, tuple)):  # some headers store a value per layer
        value = max((v for v in value if isinstance(v, int)), default=0)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def arch_facts(meta: GGUFMetadata) -> ArchFacts:
    """The architecture facts of a GGUF header."""
    arch = (meta.architecture or "unknown").lower()
    window = _int(meta, f"{arch}.attention.sliding_window")
    if arch == "gemma2" and window == 0:
        window = 4096  # llama.cpp's default where a Gemma 2 header leaves it out
    kind = memory_kind(arch, sliding_window=window)
    return ArchFacts(
        architecture=arch,
        memory=kind,
        rollback=rollback_for(kind, arch),
        sliding_window=max(window, 0),
        experts=_int(meta, f"{arch}.expert_count"),
        experts_used=_int(meta, f"{arch}.expert_used_count"),
    )
