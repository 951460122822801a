"""Expected decode speed of a model and of a target/draft pair: pure arithmetic, no I/O.

**Plain decoding** is bound by memory bandwidth: each token reads every weight once, and the KV cache
of the context so far. One step takes, for the layers on each device, their bytes over that device's
bandwidth::

    bytes per token = weights + KV bytes per token of context * CHAT_CONTEXT
    step (s)        = gpu_share * bytes / gpu bandwidth + (1 - gpu_share) * bytes / cpu bandwidth
    tokens/s        = 1 / step

The weights are the GGUF file: where the input embedding is a tensor of its own only one row of it is
read per token, so this overestimates the bytes by the embedding's share (about 10 % for a 1.5B model,
5 % for a 7B one) and errs on the slow side.

**Speculative decoding**: a round drafts k tokens (k steps of the draft) and verifies them in one batch
of k+1 on the target. At a per-token acceptance rate a it yields 1 + a + ... + a^k tokens on average::

    tokens/s = (1 + a + ... + a^k) / (k * draft step + verify_cost(k+1) * target step)

at the best k up to the pair's draft limit. `verify_cost(b)` is a batch of b in target steps: about 1 on
a GPU up to b = 16 (`GPU_VERIFY_STEP` per extra token), 1 + 0.6 (b - 1) on a CPU (`CPU_VERIFY_STEP`:
the AMD EPYC's measured 1.67-1.79 for 2, 2.78-3.05 for 4, 4.57-5.18 for 8; docs/benchmarks.md); a
split model weighs the two by where its step's time goes. The acceptance `ACCEPTANCE` is 0.75: the
Qwen2.5-Coder 0.5B draft's 74 % for the 1.5B target over the benchmark's 16 prompts, and auto mode's
prior for a target that is not sure of its next token (`MODEL_CLASSES`, docs/benchmarks.md).

**A mixture of experts** reads per token only its shared weights (attention, embeddings, router,
shared experts) and the `u` of its `E` routed experts a token is sent to (`Experts`): from the catalog,
``active bytes = file size * active_params / params``, from a header the expert tensors' bytes * u / E
plus every other tensor. A verify batch of b tokens reads the experts any of them uses, on average
``E * (1 - (1 - u/E)^b)`` per layer, up to all of them: its cost grows by those bytes over a step's::

    verify_cost(b) = 1 + per-token cost * (b - 1) + (bytes read by b tokens / bytes read by one - 1)

What the engine measured replaces the arithmetic where known (`Measured`): a model's plain tokens/s, the
pair's speculative tokens/s, the acceptance and the verify costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app.gguf.arch import arch_facts
from app.gguf.memory import expert_weights
from app.gguf.meta import GGUFMetadata

__all__ = [
    "ACCEPTANCE",
    "CHAT_CONTEXT",
    "CPU_VERIFY_STEP",
    "GPU_VERIFY_STEP",
    "MAX_DRAFT",
    "Device",
    "Experts",
    "PairSpeed",
    "Speculation",
    "expected_tokens",
    "gpu_time_share",
    "kv_bytes_per_token",
    "speculate",
    "step_seconds",
    "verify_cost",
]

#: tokens in the KV cache at a typical point of a chat (the KV read per token grows with it)
CHAT_CONTEXT = 1024
#: per-token acceptance of a model draft (see the module's docstring)
ACCEPTANCE = 0.75
#: each token past the first in a verify batch, in decode steps: on a CPU, on a GPU
CPU_VERIFY_STEP = 0.6
GPU_VERIFY_STEP = 0.02
#: the longest draft considered
MAX_DRAFT = 16

Source = Literal["measured", "estimated"]


@dataclass(frozen=True)
class Device:
    """Where a model's layers are read from: the share on the GPU and both bandwidths (bytes/s)."""

    gpu_share: float  # of the layers, 0..1
    cpu_bandwidth: float
    gpu_bandwidth: float = 0.0


@dataclass(frozen=True)
class Experts:
    """What a mixture of experts reads per step: `shared` bytes whatever the batch (non-expert weights and
    the KV cache), and of the `routed` bytes (every routed expert) the experts the batch's tokens use."""

    shared: float
    routed: float
    count: int  # E: routed experts per layer
    used: int  # u: experts per token

    @classmethod
    def from_params(
        cls, weights: float, params: int, active_params: int, count: int, used: int, *, other: float = 0.0
    ) -> Experts:
        """From a file's size and its parameters in all and per token: the routed experts hold
        ``(params - active) / (1 - u/E)`` parameters, the rest is shared; `other`: more bytes every step
        reads (the KV cache)."""
        per_param = weights / params
        frac = used / count if count else 1.0
        routed = (params - active_params) / (1 - frac) if frac < 1 else 0.0
        routed = min(routed, float(params))
        return cls(shared=(params - routed) * per_param + other, routed=routed * per_param, count=count,
                   used=used)  # fmt: skip

    @classmethod
    def from_header(cls, meta: GGUFMetadata, weights: float, *, other: float = 0.0) -> Experts | None:
        """From a header's tensor infos (`app.gguf.memory.expert_weights`), scaled to the file's `weights`
        (every part of a split model); None for a dense model or without tensor infos."""
        facts, split = arch_facts(meta), expert_weights(meta)
        if split is None or not facts.moe:
            return None
        routed, rest = split
        scale = weights / (routed + rest) if weights > 0 else 1.0
        return cls(shared=rest * scale + other, routed=routed * scale, count=facts.experts,
                   used=facts.experts_used)  # fmt: skip

    def distinct(self, batch: int) -> float:
        """Experts per layer that `batch` tokens use, on average: ``E * (1 - (1 - u/E)^b)``."""
        if self.count <= 0:
            return 0.0
        return self.count * (1 - (1 - min(self.used, self.count) / self.count) ** max(1, batch))

    def bytes_read(self, batch: int = 1) -> float:
        """Bytes a step over `batch` tokens reads (1: a decode step's)."""
        share = self.distinct(batch) / self.count if self.count > 0 else 1.0
        return self.shared + self.routed * share

    def read_ratio(self, batch: int) -> float:
        """A batch's bytes read over a decode step's."""
        one = self.bytes_read(1)
        return self.bytes_read(batch) / one if one > 0 else 1.0


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_element: int = 2) -> int:
    """KV cache bytes one token of context adds (K and V, f16), all read again at every step."""
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element


def step_seconds(weights: int, kv_per_token: int, where: Device, *, context: int = CHAT_CONTEXT) -> float:
    """Seconds of one decode step: the bytes of the layers on each device over its bandwidth."""
    nbytes = weights + kv_per_token * context
    g = min(1.0, max(0.0, where.gpu_share)) if where.gpu_bandwidth > 0 else 0.0
    seconds = (1 - g) * nbytes / where.cpu_bandwidth
    if g:
        seconds += g * nbytes / where.gpu_bandwidth
    return seconds


def gpu_time_share(where: Device) -> float:
    """The share of a step's time spent on the GPU."""
    g = min(1.0, max(0.0, where.gpu_share)) if where.gpu_bandwidth > 0 else 0.0
    gpu, cpu = g / where.gpu_bandwidth if g else 0.0, (1 - g) / where.cpu_bandwidth
    return gpu / (gpu + cpu) if gpu + cpu else 0.0


def verify_cost(
    batch: int,
    *,
    gpu_share: float = 0.0,
    measured: Mapping[int, float] | None = None,
    experts: Experts | None = None,
) -> float:
    """A verify batch of `batch` tokens in decode steps of the target: `measured` costs (batch -> steps)
    where known, interpolated between them, else the default by device, weighted by `gpu_share` (the
    share of the target's step time spent on a GPU), plus for a mixture of `experts` the more experts
    the batch reads."""
    if batch <= 1:
        return 1.0
    per_token = gpu_share * GPU_VERIFY_STEP + (1 - gpu_share) * CPU_VERIFY_STEP

    def more(b: int) -> float:
        return experts.read_ratio(b) - 1 if experts is not None else 0.0

    known = {int(b): float(c) for b, c in (measured or {}).items() if b >= 1 and c > 0}
    if batch in known:
        return known[batch]
    points = sorted({1: 1.0, **known}.items())
    if len(points) == 1:
        return 1 + per_token * (batch - 1) + more(batch)
    for (b0, c0), (b1, c1) in itertools.pairwise(points):
        if b0 <= batch <= b1:
            return c0 + (c1 - c0) * (batch - b0) / (b1 - b0)
    last_b, last_c = points[-1]  # beyond the largest batch measured: the default slope from there
    return last_c + per_token * (batch - last_b) + more(batch) - more(last_b)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round that drafts `k` yields on average: 1 + a + a^2 + ... + a^k."""
    a = min(1.0, max(0.0, acceptance))
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclass(frozen=True)
class Speculation:
    """The best draft length for a pair and what it yields."""

    tokens_per_second: float
    draft_length: int
    tokens_per_round: float
    round_steps: float  # a round's cost in target steps


def speculate(
    target_step: float,
    draft_step: float,
    *,
    acceptance: float = ACCEPTANCE,
    max_draft: int = MAX_DRAFT,
    gpu_share: float = 0.0,
    verify_costs: Mapping[int, float] | None = None,
    experts: Experts | None = None,
) -> Speculation:
    """Tokens/s of speculative decoding at the best draft length k (1..`max_draft`): steps in seconds,
    `gpu_share` the share of the target's step time on a GPU and a mixture's `experts` (for the verify
    costs)."""
    best: Speculation | None = None
    for k in range(1, max(1, max_draft) + 1):
        tokens = expected_tokens(acceptance, k)
        steps = k * draft_step / target_step + verify_cost(
            k + 1, gpu_share=gpu_share, measured=verify_costs, experts=experts
        )
        tps = tokens / (steps * target_step)
        if best is None or tps > best.tokens_per_second:
            best = Speculation(tps, k, tokens, steps)
    assert best is not None
    return best


@dataclass(frozen=True)
class PairSpeed:
    """A pair's expected decode speed on a machine: plain (the target alone) and with the draft."""

    plain: float  # tokens/s
    speculative: float  # tokens/s with the draft at `draft_length`
    draft_length: int
    acceptance: float
    plain_source: Source = "estimated"
    speculative_source: Source = "estimated"

    @property
    def best(self) -> float:
        """What the app reaches: drafting only where it pays (auto mode), so the faster of the two."""
        return max(self.plain, self.speculative)

    @property
    def source(self) -> Source:
        """Where `best` comes from."""
        return self.speculative_source if self.speculative >= self.plain else self.plain_source
