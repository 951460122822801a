"""Will a target/draft pair fit this machine, how fast will it answer, and which pair to recommend.

Estimate of what a pair needs (all in bytes)::

    weights   = size of both GGUF files (llama.cpp maps them whole)
    KV cache  = 2 (K and V) * n_kv_heads * head_dim * 2 (f16) * cells, over the layers with a KV cache
                (`kv_layers`): n_ctx cells a full layer, min(n_ctx, window + 512) padded to 256 a
                sliding-window one (`sliding_layers`)
                (a target's own MTP layers: that many more full layers, for its MTP context)
    recurrent = a hybrid or recurrent model's state (`recurrent_state`) * (1 + the engine's snapshots),
                and CHECKPOINT_SLOTS more copies the engine saves in RAM
    compute   = COMPUTE_BUFFER per model (llama.cpp's graph buffers at n_batch=512, logits included)
    overhead  = RUNTIME_OVERHEAD once (backend context, scratch, process)

(`app.gguf.memory` computes the same from a GGUF header.)
The machine (RAM, cores, bandwidth, GPUs and their budgets) is `models_registry.machine`'s, re-exported.

Speed (`pair_speed`): where the fit puts each model's layers, at the machine's bandwidths
(`models_registry.speed`), or what the engine measured for the file (`models_registry.measured`).
`recommend` picks, among the pairs that fit, the largest target whose expected speed reaches
`min_speed` (default `MIN_SPEED`), and the fastest pair when none does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from app.gguf.memory import (
    CHECKPOINT_SLOTS,
    COMPUTE_BUFFER,
    RUNTIME_OVERHEAD,
    kv_cache_bytes,
    recurrent_bytes,
)

from .catalog import Catalog, CatalogModel, Pair, QuantFile, default_catalog
from .machine import (
    CPU_FRACTION,
    GPU_RESERVE,
    Gpu,
    Machine,
    detect_machine,
    gpus_from_devices,
    metal_working_set,
)
from .measured import Measured, SpeedStore
from .speed import (
    ACCEPTANCE,
    CHAT_CONTEXT,
    MAX_DRAFT,
    Device,
    Experts,
    PairSpeed,
    gpu_time_share,
    kv_bytes_per_token,
    speculate,
    step_seconds,
)

__all__ = [
    "COMFORT",
    "COMPUTE_BUFFER",
    "CPU_FRACTION",
    "GPU_RESERVE",
    "MIN_SPEED",
    "RUNTIME_OVERHEAD",
    "Choice",
    "Gpu",
    "Machine",
    "ModelNeed",
    "PairFit",
    "PairNeed",
    "PairSpeed",
    "Verdict",
    "active_weights",
    "choose",
    "detect_machine",
    "estimate_model",
    "estimate_pair",
    "experts",
    "fit_catalog",
    "fit_pair",
    "gpus_from_devices",
    "kv_cache_bytes",
    "metal_working_set",
    "pair_speed",
    "rank_catalog",
    "recommend",
    "why",
]

#: a fit is "comfortable" when the need is at most this fraction of the budget
COMFORT = 0.9
#: tokens/s from which a reply reads as usable (the default of the setting)
MIN_SPEED = 15.0

Verdict = Literal["gpu", "partial", "cpu", "none"]


# ---------------------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class ModelNeed:
    """Memory one model needs at a context size."""

    name: str
    weights: int
    kv: int
    compute: int
    n_layers: int
    n_ctx: int
    recurrent: int = 0  # the recurrent state with the engine's snapshots
    checkpoints: int = 0  # the engine's saved copies of the recurrent state, in RAM

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.checkpoints + self.compute

    @property
    def per_layer(self) -> int:
        """Weights, KV and state of one repeating layer (embeddings spread evenly: a slight overestimate)."""
        return -(-(self.weights + self.kv + self.recurrent) // self.n_layers)


def estimate_model(
    model: CatalogModel,
    *,
    quant: str | None = None,
    n_ctx: int = 4096,
    weights: int | None = None,
    draft: bool = False,
) -> ModelNeed:
    """Need of a catalog model; `n_ctx` is capped at the model's trained context. A `draft` keeps no
    recurrent snapshots and a full-size sliding-window cache, as the engine holds it."""
    ctx = min(n_ctx, model.context_length)
    size = weights if weights is not None else model.file(quant).size
    kv = kv_cache_bytes(model.kv_layers, ctx, model.n_kv_heads, model.head_dim,
                        sliding_layers=0 if draft else model.sliding_layers,
                        sliding_window=model.sliding_window)  # fmt: skip
    if model.mtp_layers and not draft:  # its MTP context keeps a full cache of its own layers
        kv += kv_cache_bytes(model.mtp_layers, ctx, model.n_kv_heads, model.head_dim)
    state = recurrent_bytes(model.recurrent_state, model.architecture, snapshots=0 if draft else None)
    return ModelNeed(
        name=model.id, weights=size, kv=kv, compute=COMPUTE_BUFFER, n_layers=model.n_layers, n_ctx=ctx,
        recurrent=state, checkpoints=CHECKPOINT_SLOTS * model.recurrent_state,
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
        draft=estimate_model(draft, quant=draft_quant, n_ctx=n_ctx, draft=True),
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


# ---------------------------------------------------------------------------------------------- speed


def _tolerance(qf: QuantFile) -> float:
    """How far a measured file's size may be from the catalog's: 2 % where the catalog's is rounded."""
    return 0.02 if qf.size_approx else 0.0


def _measured(store: SpeedStore | None, qf: QuantFile, placement: str) -> Measured | None:
    return store.lookup(qf.file, qf.size, placement=placement, tolerance=_tolerance(qf)) if store else None


def experts(model: CatalogModel, qf: QuantFile) -> Experts | None:
    """A mixture of experts' bytes per step (its file, the KV of a chat's context); None if dense."""
    if not model.moe:
        return None
    kv = kv_bytes_per_token(model.kv_layers, model.n_kv_heads, model.head_dim) * CHAT_CONTEXT
    return Experts.from_params(qf.size, model.params, model.active_params, model.experts,
                               model.experts_used, other=kv)  # fmt: skip


def active_weights(model: CatalogModel, qf: QuantFile) -> int:
    """The weight bytes a decode step reads: the file, times ``active_params / params`` for a mixture."""
    return qf.size if model.active_params >= model.params else qf.size * model.active_params // model.params


def pair_speed(
    fit: PairFit,
    machine: Machine,
    target: CatalogModel,
    draft: CatalogModel,
    *,
    target_quant: str | None = None,
    draft_quant: str | None = None,
    measured: SpeedStore | None = None,
    max_draft: int | None = None,
) -> PairSpeed:
    """The expected decode speed of a pair where `fit` puts it: the target's layers on the GPU as the
    verdict says (the draft on the GPU whenever the target is partly there, as `fit_pair` plans), at the
    machine's bandwidths; a file's plain speed, the pair's speculative speed, acceptance and verify
    costs as the engine measured them where `measured` knows them. `max_draft`: the pair's draft limit
    (default its catalog ``n_max``)."""
    tq, dq = target.file(target_quant), draft.file(draft_quant)
    cpu, gpu = machine.ram_bandwidth, machine.gpu_read_bandwidth
    on_gpu = fit.verdict in ("gpu", "partial") and gpu > 0
    t_share = (1.0 if fit.verdict == "gpu" else fit.gpu_layers / target.n_layers) if on_gpu else 0.0
    t_where, d_where = Device(t_share, cpu, gpu), Device(1.0 if on_gpu else 0.0, cpu, gpu)
    t_place = "cpu" if not on_gpu else "gpu" if fit.verdict == "gpu" else "partial"
    t_meas, d_meas = _measured(measured, tq, t_place), _measured(measured, dq, "gpu" if on_gpu else "cpu")

    def step(m: CatalogModel, qf: QuantFile, where: Device, known: Measured | None) -> tuple[float, bool]:
        if known is not None and known.plain:
            return 1 / known.plain, True
        kv = kv_bytes_per_token(m.kv_layers, m.n_kv_heads, m.head_dim)
        return step_seconds(active_weights(m, qf), kv, where), False

    t_step, t_known = step(target, tq, t_where, t_meas)
    d_step, _ = step(draft, dq, d_where, d_meas)
    dkey = (dq.file, dq.size)
    tol = _tolerance(dq)
    seen_acceptance = t_meas.acceptance_with(dkey, tolerance=tol) if t_meas else None
    acceptance = ACCEPTANCE if seen_acceptance is None else seen_acceptance
    limit = max_draft if max_draft is not None else fit.pair.n_max if fit.pair is not None else MAX_DRAFT
    spec = speculate(
        t_step, d_step, acceptance=acceptance, max_draft=min(limit, MAX_DRAFT),
        gpu_share=gpu_time_share(t_where), verify_costs=t_meas.verify_costs if t_meas else None,
        experts=experts(target, tq),
    )  # fmt: skip
    spec_tps, spec_known = spec.tokens_per_second, False
    if t_meas is not None:
        for mode in ("speculative", "auto"):
            seen = t_meas.speed(mode, dkey, tolerance=tol)
            if seen:
                spec_tps, spec_known = seen, True
                break
    return PairSpeed(
        plain=1 / t_step, speculative=spec_tps, draft_length=spec.draft_length, acceptance=acceptance,
        plain_source="measured" if t_known else "estimated",
        speculative_source="measured" if spec_known else "estimated",
    )  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """A catalog pair on a machine: where it fits and how fast it answers."""

    fit: PairFit
    speed: PairSpeed
    params: int  # the target's parameters
    active_params: int = 0  # of those, what a token uses (a mixture of experts; 0: all)

    @property
    def moe(self) -> bool:
        """The target is a mixture of experts, estimated by its active parameters."""
        return 0 < self.active_params < self.params

    @property
    def pair(self) -> Pair:
        assert self.fit.pair is not None
        return self.fit.pair


def rank_catalog(
    machine: Machine,
    *,
    catalog: Catalog | None = None,
    n_ctx: int = 4096,
    measured: SpeedStore | None = None,
) -> list[Choice]:
    """Every catalog pair's fit and expected speed (default quantizations), in catalog order."""
    cat = catalog or default_catalog()
    out = []
    for f in fit_catalog(machine, catalog=cat, n_ctx=n_ctx):
        assert f.pair is not None
        t, d = cat.model(f.pair.target), cat.model(f.pair.draft)
        out.append(Choice(f, pair_speed(f, machine, t, d, measured=measured), t.params, t.active_params))
    return out


def choose(choices: Iterable[Choice], *, min_speed: float = MIN_SPEED) -> Choice | None:
    """Among the pairs that fit, the largest target whose expected speed reaches `min_speed` (comfortable
    fits first, then the faster); if none reaches it, the fastest. None if nothing fits."""
    fits = [c for c in choices if c.fit.verdict != "none"]
    usable = [c for c in fits if c.speed.best >= min_speed]
    if usable:
        return max(usable, key=lambda c: (c.fit.comfortable, c.params, c.speed.best))
    return max(fits, key=lambda c: (c.speed.best, c.fit.comfortable), default=None)


def recommend(
    machine: Machine,
    *,
    catalog: Catalog | None = None,
    n_ctx: int = 4096,
    min_speed: float = MIN_SPEED,
    measured: SpeedStore | None = None,
) -> PairFit | None:
    """The pair to recommend on `machine` (`choose` over `rank_catalog`); None if nothing fits."""
    best = choose(rank_catalog(machine, catalog=catalog, n_ctx=n_ctx, measured=measured), min_speed=min_speed)
    return best.fit if best is not None else None


def why(choice: Choice, min_speed: float = MIN_SPEED) -> str:
    """Why `choice` (what `choose` returned) is the pick, in a few words."""
    if choice.speed.best >= min_speed:
        return f"the largest model that reaches {min_speed:g} tokens/s here"
    return f"no pair reaches {min_speed:g} tokens/s here: the fastest"
