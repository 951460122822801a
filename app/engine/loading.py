"""Loading a pair: where its layers go, each model with its context (fewer layers where the GPU runs out
of memory), the drafting history it keeps, the first evaluations timed for auto mode, and what is shown of
a loaded model. :class:`app.engine.engine.Engine` composes these."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from app.engine.info import ModelInfo
from app.engine.llama import (
    Context,
    Model,
    ModelLoadError,
    backends,
    check_model_file,
    devices,
    supports_gpu_offload,
)
from app.engine.offload import OffloadPlan, choose_device, gpus_for, load_with_fewer_layers, plan_offload
from app.engine.sequence import MemoryInfo
from app.engine.settings import LoadSettings
from app.gguf import compat
from app.gguf.arch import MemoryKind, Rollback
from app.gguf.drafts import DraftKind, draft_facts
from app.gguf.memory import RECURRENT_SNAPSHOTS, Footprint, file_footprint
from app.gguf.meta import GGUFError, read_metadata_file
from app.gguf.split import first_part, missing_parts, split_info

if TYPE_CHECKING:
    from app.engine.auto import CostModel
    from app.engine.keeper import HistoryKeeper
    from app.engine.speculative import TargetCache

log = logging.getLogger("tandem.engine")


def head_kind(path: Path) -> DraftKind | None:
    """Whether a draft file is a head that drafts through its target's context (an EAGLE-3 head, a
    Gemma 4 assistant: its header says so), and which; None for a draft model."""
    try:
        kind = draft_facts(read_metadata_file(path)).kind
    except (GGUFError, OSError):
        return None
    return kind if kind in (DraftKind.EAGLE3, DraftKind.GEMMA4_ASSISTANT) else None


def plan_for(settings: LoadSettings, target: Path, draft: Path | None) -> OffloadPlan:
    """Where the layers go: an explicit count as asked; "auto" from the GGUF headers and the free
    memory of a real GPU (nothing on a CPU-only build, without a GPU or on a software renderer;
    the plan's ``reason`` says why)."""
    requests = {"target_request": settings.n_gpu_layers, "draft_request": settings.n_gpu_layers_draft}
    found = devices()
    device, why = choose_device(found, backends(), gpu_offload=supports_gpu_offload(), **requests)
    if device is None or (settings.n_gpu_layers is not None and settings.n_gpu_layers_draft is not None):
        plan = plan_offload(Footprint(0, 1, 0), None, device, **requests)
        return replace(plan, reason=why, gpus=gpus_for(found, device) if why else None)
    try:
        tfp = file_footprint(target, settings.n_ctx)
        dfp = file_footprint(draft, settings.n_ctx, draft=True) if draft is not None else None
    except (GGUFError, OSError) as e:
        raise ModelLoadError(str(e)) from e
    return plan_offload(tfp, dfp, device, **requests)


def new_context(settings: LoadSettings, model: Model, n_ctx: int, *, draft: bool = False) -> Context:
    """A context for one model. The target keeps per-token recurrent snapshots (where its
    architecture has them) so a rejected draft is undone without evaluating anything again; the
    draft drafts one token at a time, which snapshots cannot undo, and keeps a full-size
    sliding-window cache instead (small for a small model) so any of its tokens can be removed."""
    s = settings
    return Context(
        model,
        n_ctx=n_ctx,
        n_batch=s.n_batch,
        n_threads=(s.n_threads_draft or s.n_threads) if draft else s.n_threads,
        flash_attn=s.flash_attn,
        n_rs_seq=0 if draft else RECURRENT_SNAPSHOTS,
        swa_full=draft,
    )


def load_model(
    settings: LoadSettings,
    gpus: tuple[str, ...] | None,
    stage: str,
    path: Path,
    layers: int,
    n_ctx: int,
    progress: Callable[[str, float], None] | None,
    *,
    retry: bool,
    context: bool = True,
) -> tuple[Model, Context | None]:
    """Load one model and its context with ``layers`` on the GPU; with ``retry`` (an automatic
    plan), with fewer layers each time the GPU runs out of memory. Without ``context`` (an EAGLE-3
    head, a Gemma 4 assistant: its drafter makes its context, bound to the target's), the model alone."""

    def load(n: int) -> tuple[Model, Context | None]:
        report = (lambda f: progress(stage, f)) if progress else None
        mtp = stage == "target"  # its multi-token-prediction heads, where the file has them
        model = Model(path, n_gpu_layers=n, progress=report, gpus=gpus, load_mtp=mtp)
        if not context:
            return model, None
        try:
            return model, new_context(settings, model, n_ctx, draft=stage == "draft")
        except BaseException:
            model.close()
            raise

    total = 1 << 16  # the real count is known once loaded: "all" halves from the model's own
    if retry:
        with contextlib.suppress(GGUFError, OSError):
            total = file_footprint(path, n_ctx).layers_total
    (model, ctx), loaded, failed = load_with_fewer_layers(load, layers, total, retry=retry)
    if failed:
        log.warning("%s: the GPU ran out of memory with %s layers; loaded with %d", stage, failed, loaded)
        model.offload = replace(model.offload, failed_layers=failed)
    return model, ctx


# verify costs timed at load (the rest are interpolated); 64 is the longest copy's batch. The cost
# does not grow smoothly: on a 2-core AMD EPYC (AVX-512) a batch of 12 or 16 costs 8.0 decode steps,
# 32 costs 14.8 and 64 costs 20.7, so a long copy that holds pays where a batch of 4 (3.3) does not.
WARM_UP_BATCHES = (1, 2, 3, 4, 6, 8, 9, 12, 16, 32, 64)
# decode steps evaluated back to back after the batches, the first untimed (the second of two alike is
# where CUDA captures its graph again): the step auto mode plans plain rounds at
RUN_STEPS = 4
DRAFT_STEPS = 2  # the draft's steps timed after each of its batches of 2 (a draft of 3 tokens)


def relative_to_neighbours(
    timed: list[tuple[int, float]], last: int = 3, run: list[float] | None = None
) -> list[tuple[int, float]]:
    """Timings in the order taken (batch size, seconds), steps (size 1) between the batches, as the
    machine is at the end: the ``last`` steps, then each batch's time scaled from the steps timed
    beside it to those steps' median. Another program starting or stopping beside this one changes
    every timing tens of times on a small CPU; a batch's cost relative to the steps around it holds.

    ``run``: steps timed back to back after the last of them, as plain decoding evaluates them; they
    are the step given. A step timed between two batch sizes is not one: on CUDA each change of shape
    makes llama.cpp run the next two evaluations without their CUDA graph, and a step after a batch
    cost 1.27x what a step of plain decoding does on an H200 (docs/benchmarks.md, "A decode step
    after a batch"). On a CPU the two agree."""
    steps = [(i, dt) for i, (b, dt) in enumerate(timed) if b <= 1]
    if not steps:
        return timed
    now = [dt for _, dt in steps[-last:]]
    reference = statistics.median(now)
    out = [(1, dt) for dt in (run or now)]
    for i, (batch, dt) in enumerate(timed):
        if batch <= 1:
            continue
        before = [t for j, t in steps if j < i][-1:]
        after = [t for j, t in steps if j > i][:1]
        # a batch costs at least one step (tiny models' timings are mostly noise)
        out.append((batch, max(dt / statistics.mean(before + after), 1.0) * reference))
    return out


def warm_up(
    seq: TargetCache, n_vocab: int, draft_ctx: Context | None, costs: CostModel, *, on_gpu: bool = False
) -> None:
    """First evaluations allocate buffers and are slow: run them now, and seed auto mode's costs.

    A step and a batch of 4 are evaluated untimed first. With ``on_gpu`` (the target's layers on a
    GPU) so is every other size: a GPU backend loads (Metal, Vulkan: compiles) each size's kernels
    and grows its buffer pools on first use. Then each batch size a verification commonly uses is timed (the
    cost does not grow smoothly with the batch: kernels change with its size), with one decode
    step timed between every two sizes: each size's cost is taken relative to the steps timed beside
    it (:func:`relative_to_neighbours`), not to one step a busy machine may have slowed. The step
    itself is timed last, in a run of RUN_STEPS, as plain decoding evaluates it; the draft's steps
    are timed as a round drafts, after a batch of 2. Logits are
    computed for every row, as verification does: on a CPU the output layer is a real share of a
    batch's cost (Qwen2.5 1.5B: a batch of 4 costs 1.7x one token with the last row's logits only,
    2.1-2.9x with all four).
    """
    # varied tokens, as in real text: a mixture of experts routes each token to its own experts,
    # so a batch of one token repeated would read only one token's experts
    rng = np.random.default_rng(0)
    text = [int(t) for t in rng.integers(0, n_vocab, size=max(WARM_UP_BATCHES) + 1)]
    tok = text[0]
    sizes = [b for b in WARM_UP_BATCHES if 1 < b <= seq.ctx.n_ctx // 2]
    # the sizes a model draft verifies are timed three times (auto takes the median): one timing
    # on a busy machine can be off by half, and would keep that draft length out of its plans
    sizes += [b for b in sizes if b <= 9] * 2
    order = [1]
    for j in range(0, len(sizes), 2):
        order += [*sizes[j : j + 2], 1]
    # evaluated once before any timing; on a CPU a first evaluation costs about what later ones do,
    # so the other sizes are not (docs/benchmarks.md, "First evaluations on a GPU")
    untimed = [1, 4]
    if on_gpu:
        untimed += [b for b in dict.fromkeys(sizes) if b != 4]
    timed: list[tuple[int, float]] = []
    run: list[float] = []
    for i, batch in enumerate((*untimed, *order, *[1] * RUN_STEPS)):
        t0 = time.perf_counter()
        seq.verify_batch(tok, text[1:batch])  # with a checkpoint where such a draft needs one
        dt = time.perf_counter() - t0
        seq.reset()
        if i >= len(untimed) + len(order) + 1:
            run.append(dt)
        elif len(untimed) <= i < len(untimed) + len(order):
            timed.append((batch, dt))
    for batch, dt in relative_to_neighbours(timed, run=run):  # the steps first, then the batches
        costs.observe_verify(batch, dt)
    if draft_ctx is not None:
        # as a round drafts: a batch of the text the draft has not seen (the last round's last draft
        # token and the target's), then its steps; on CUDA the steps after a batch run without their
        # graph, as a short draft's do, where steps timed back to back would replay it. The first
        # round allocates: not timed.
        for i in range(3):
            draft_ctx.decode(text[:2], 0, logits="last")
            for j in range(DRAFT_STEPS):
                t0 = time.perf_counter()
                draft_ctx.decode([text[2 + j]], 2 + j, logits="last")
                if i:
                    costs.observe_draft(1, time.perf_counter() - t0)
            draft_ctx.clear()


def history_keeper(folder: str | None, target: Path) -> HistoryKeeper | None:
    """The drafting history for the target's tokenizer family (None without a history folder)."""
    if not folder:
        return None
    from app.engine.keeper import HistoryKeeper

    try:
        meta = read_metadata_file(target)
        fingerprint = compat.vocab_fingerprint(meta)[:16]
    except (GGUFError, OSError) as e:
        log.warning("no drafting history: cannot read the target's vocabulary: %s", e)
        return None
    n_vocab = compat.vocab_info(meta).n_vocab  # a file with token ids outside it is refused
    return HistoryKeeper(folder, fingerprint, n_vocab=n_vocab or None)


def model_path(path: str) -> Path:
    """The file llama.cpp opens (the first part of a split model), checked before anything loads."""
    first = first_part(path)
    missing = missing_parts(path) if split_info(Path(path).name) else []
    if missing:
        names = ", ".join(p.name for p in missing)
        raise ModelLoadError(f"{Path(path).name} is split into parts and some are missing: {names}")
    return check_model_file(first)


def model_info(model: Model, ctx: Context, memory: MemoryInfo | None) -> ModelInfo:
    arch = model.meta("general.architecture") or ""
    memory = memory or MemoryInfo(MemoryKind.ATTENTION, Rollback.TRIM)

    def count(key: str) -> int:
        value = model.meta(f"{arch}.{key}") or "0"
        return int(value) if value.isdigit() else 0

    return ModelInfo(
        path=str(model.path),
        description=model.description(),
        size_bytes=model.size_bytes,
        n_params=model.n_params,
        n_layer=model.n_layer,
        n_vocab=model.n_vocab,
        offload=model.offload,
        n_threads=ctx.n_threads,
        architecture=arch,
        memory=memory.kind,
        rollback=memory.rollback,
        snapshots=memory.snapshots,
        window=memory.window,
        experts=count("expert_count"),
        experts_used=count("expert_used_count"),
        mtp_layers=model.n_layer_nextn,
    )
