"""The engine facade: load a target (and a draft), turn chats into prompts, run generation modes."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from app.engine.auto import AutoDrafter, AutoMemory, CostModel, MeasuredCosts
from app.engine.chat import ChatTemplate, Message
from app.engine.drafting import Drafter, LookupDrafter, ModelDrafter
from app.engine.errors import EngineError, IncompatibleDraftError
from app.engine.events import Finished, Mode, Started, Step
from app.engine.info import EngineInfo, HistoryInfo, ModelInfo
from app.engine.llama import (
    Context,
    Model,
    ModelLoadError,
    backend_name,
    backends,
    check_model_file,
    devices,
    supports_gpu_offload,
)
from app.engine.offload import OffloadPlan, choose_device, gpus_for, load_with_fewer_layers, plan_offload
from app.engine.policy import (
    AdaptivePolicy,
    DraftPolicy,
    FixedPolicy,
    NoRollbackPolicy,
    PassPolicy,
    PlainPolicy,
)
from app.engine.prompt import PromptTokenizer, SpecialToken, TooManyTokens
from app.engine.sequence import MemoryInfo, probe_rollback
from app.engine.settings import MODES, GenerationSettings, LoadSettings
from app.engine.speculative import TargetCache, generate
from app.gguf import compat
from app.gguf.arch import MemoryKind, Rollback
from app.gguf.memory import RECURRENT_SNAPSHOTS, Footprint, file_footprint
from app.gguf.meta import GGUFError, read_metadata_file
from app.gguf.split import first_part, missing_parts, split_info

if TYPE_CHECKING:
    from app.engine.drafting.mtp import MtpDrafter
    from app.engine.grammar import Grammar, Vocabulary
    from app.engine.keeper import HistoryKeeper

log = logging.getLogger("tandem.engine")

_UNKNOWN, _USER_DEFINED = 2, 4  # GGUF token types llama.cpp matches by their text, as control tokens

__all__ = ["MODES", "Engine", "EngineError", "GenerationSettings", "IncompatibleDraftError", "LoadSettings"]


class Engine:
    """A loaded target (and optional draft) model with their contexts."""

    def __init__(
        self,
        settings: LoadSettings,
        *,
        progress: Callable[[str, float], None] | None = None,
        costs: CostModel | None = None,
    ):
        """Load the pair. ``progress(stage, fraction)`` reports loading ("target", then "draft").

        ``costs`` replaces auto mode's measured cost model (tests use synthetic ones).
        """
        self.settings = settings
        self._lock = threading.Lock()
        self.compatibility: compat.Compatibility | None = None
        target_path = _model_path(settings.target)
        draft_path = _model_path(settings.draft) if settings.draft else None
        if draft_path is not None:  # check the pair before loading anything large
            try:
                self.compatibility = compat.check_files(target_path, draft_path)
            except GGUFError as e:
                raise ModelLoadError(str(e)) from e
            if not self.compatibility.ok:
                raise IncompatibleDraftError(
                    f"the draft model cannot be used with this target: {self.compatibility.reason}"
                )
        self.plan = self._plan(settings, target_path, draft_path)
        self._keeper = _keeper(settings.history_dir, target_path)
        self.draft: Model | None = None
        self._draft_ctx: Context | None = None
        self._target_ctx: Context | None = None
        self.target: Model | None = None
        try:
            self.target, self._target_ctx = self._load(
                "target",
                target_path,
                self.plan.target_layers,
                settings.n_ctx,
                progress,
                retry=settings.n_gpu_layers is None and self.plan.target_layers != 0,
            )
            if draft_path is not None:  # the plan set GPU memory aside for it
                self.draft, self._draft_ctx = self._load(
                    "draft", draft_path, self.plan.draft_layers, self._target_ctx.n_ctx, progress, retry=False
                )
            self._cache = TargetCache(self._target_ctx)
            self.memory = probe_rollback(self._target_ctx)
            draft_memory = probe_rollback(self._draft_ctx) if self._draft_ctx is not None else None
        except BaseException:
            self.close()
            raise
        self.draft_memory = draft_memory
        usable = draft_memory is not None and draft_memory.rollback is not Rollback.NONE
        self._model_drafter = ModelDrafter(self._draft_ctx) if self._draft_ctx and usable else None
        if self._keeper is not None:  # a copy from the history ends before a turn marker, as lookup's
            self._keeper.drafter.stops = self.target.control_tokens
        # auto mode's cost measurements belong to this loaded pair on this machine: keep them
        self.costs: CostModel = costs or MeasuredCosts()
        self._auto: dict[int, AutoDrafter] = {}
        # what auto mode learned for this pair on this machine in earlier sessions (beside the history)
        plan = self.plan
        where = f"{backend_name()}, layers {plan.target_layers}/{plan.draft_layers}, {settings.n_threads}"
        self._memory = (
            AutoMemory.for_pair(settings.history_dir, target_path, draft_path, where) if not costs else None
        )
        self._remembered = (self._memory.load() or {}) if self._memory is not None else {}
        if isinstance(self.costs, MeasuredCosts) and isinstance(self._remembered.get("costs"), dict):
            self.costs.restore(self._remembered["costs"])
        self._mtp_drafter: MtpDrafter | None = None  # made on first use of mode "mtp"
        if costs is None:
            self._warm_up()
        template = self.target.chat_template()
        bos = self.target.token_name(self.target.bos) if self.target.bos >= 0 else ""
        eos = self.target.token_name(self.target.eos) if self.target.eos >= 0 else ""
        self.template = (
            ChatTemplate(template, bos_token=bos, eos_token=eos) if template else ChatTemplate.fallback()
        )
        self.has_chat_template = bool(template)

    def _plan(self, settings: LoadSettings, target: Path, draft: Path | None) -> OffloadPlan:
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

    def _context(self, model: Model, n_ctx: int, *, draft: bool = False) -> Context:
        """A context for one model. The target keeps per-token recurrent snapshots (where its
        architecture has them) so a rejected draft is undone without evaluating anything again; the
        draft drafts one token at a time, which snapshots cannot undo, and keeps a full-size
        sliding-window cache instead (small for a small model) so any of its tokens can be removed."""
        s = self.settings
        return Context(
            model,
            n_ctx=n_ctx,
            n_batch=s.n_batch,
            n_threads=(s.n_threads_draft or s.n_threads) if draft else s.n_threads,
            flash_attn=s.flash_attn,
            n_rs_seq=0 if draft else RECURRENT_SNAPSHOTS,
            swa_full=draft,
        )

    def _load(
        self,
        stage: str,
        path: Path,
        layers: int,
        n_ctx: int,
        progress: Callable[[str, float], None] | None,
        *,
        retry: bool,
    ) -> tuple[Model, Context]:
        """Load one model and its context with ``layers`` on the GPU; with ``retry`` (an automatic
        plan), with fewer layers each time the GPU runs out of memory."""

        def load(n: int) -> tuple[Model, Context]:
            report = (lambda f: progress(stage, f)) if progress else None
            mtp = stage == "target"  # its multi-token-prediction heads, where the file has them
            model = Model(path, n_gpu_layers=n, progress=report, gpus=self.plan.gpus, load_mtp=mtp)
            try:
                return model, self._context(model, n_ctx, draft=stage == "draft")
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

    def _warm_up(self) -> None:
        """First evaluations allocate buffers and are slow: run them now, and seed auto mode's costs.

        One pass is discarded; then each batch size a verification commonly uses is timed once (the
        cost does not grow smoothly with the batch: kernels change with its size), with one decode
        step timed between every two sizes: each size's cost is taken relative to the median of those
        steps, not to one step a busy machine may have slowed. Logits are computed for every row, as
        verification does: on a CPU the output layer is a real share of a batch's cost (Qwen2.5
        1.5B: a batch of 4 costs 1.7x one token with the last row's logits only, 2.1-2.9x with all
        four).
        """
        # varied tokens, as in real text: a mixture of experts routes each token to its own experts,
        # so a batch of one token repeated would read only one token's experts
        rng = np.random.default_rng(0)
        text = [int(t) for t in rng.integers(0, self.target.n_vocab, size=max(self.WARM_UP_BATCHES) + 1)]
        tok = text[0]
        seq = self._cache
        sizes = [b for b in self.WARM_UP_BATCHES if 1 < b <= self._target_ctx.n_ctx // 2]
        # the sizes a model draft verifies are timed three times (auto takes the median): one timing
        # on a busy machine can be off by half, and would keep that draft length out of its plans
        sizes += [b for b in sizes if b <= 9] * 2
        order = [1]
        for j in range(0, len(sizes), 2):
            order += [*sizes[j : j + 2], 1]
        timed: list[tuple[int, float]] = []
        for i, batch in enumerate((1, 4, *order)):
            t0 = time.perf_counter()
            seq.verify_batch(tok, text[1:batch])  # with a checkpoint where such a draft needs one
            dt = time.perf_counter() - t0
            seq.reset()
            if i >= 2:
                timed.append((batch, dt))
        for batch, dt in sorted(timed, key=lambda x: x[0] > 1):  # the steps first, then the batches
            self.costs.observe_verify(batch, dt)
        if self._draft_ctx is not None:
            for i in range(3):
                t0 = time.perf_counter()
                self._draft_ctx.decode([tok], 0, logits="last")
                if i:
                    self.costs.observe_draft(1, time.perf_counter() - t0)
                self._draft_ctx.clear()

    # -- prompts ------------------------------------------------------------------------------------
    def tokenize(
        self, text: str, *, cancel: Callable[[], bool] | None = None, limit: int | None = None
    ) -> list[int]:
        """Raw text to prompt tokens (BOS added if the model wants it; no special tokens parsed).
        Linear in the text; ``cancel`` and ``limit`` as in :meth:`chat_prompt`."""
        pt = self._prompt_tokens()
        segments = pt.text_segments(text)
        if len(segments) <= 1 and not any(isinstance(s, int) for s in segments):
            ids = self.target.tokenize(text, add_special=True, parse_special=False)
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(limit)
            return ids
        bos = [self.target.bos] if self.target.add_bos else []
        ids = pt.tokens(segments, prefix=bos, cancel=cancel, limit=limit)
        return [*ids, self.target.eos] if self.target.add_eos else ids

    def chat_prompt(
        self,
        messages: Sequence[Message | Mapping[str, str]],
        *,
        cancel: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> list[int]:
        """Render the chat with the model's template and tokenize it: the template's markers are special
        tokens, each message's content is text (special-token text in it is not parsed: a message
        cannot fake a turn). Linear in the prompt's length (:class:`PromptTokenizer`): ``cancel()`` is
        checked as it goes (:class:`TokenizeCancelled`), and a prompt of more than ``limit`` tokens
        stops early (:class:`TooManyTokens`)."""
        pt = self._prompt_tokens()
        text = self.template.render(pt.mask(messages, cancel), add_generation_prompt=True, cancel=cancel)
        add_bos = self.target.add_bos and not (
            self.template.bos_token and text.startswith(self.template.bos_token)
        )
        prefix = [self.target.bos] if add_bos else []
        return pt.tokens(pt.segments(text), prefix=prefix, cancel=cancel, limit=limit)

    def _prompt_tokens(self) -> PromptTokenizer:
        """The target's special tokens as llama.cpp matches them (built on first use): control tokens,
        and the unknown and user-defined tokens the GGUF names."""
        pt: PromptTokenizer | None = getattr(self, "_prompt_tokenizer", None)
        if pt is not None:
            return pt
        model = self.target
        kinds = dict.fromkeys(model.control_tokens, False)
        try:
            found = read_metadata_file(model.path).get("tokenizer.ggml.token_type")
        except (OSError, GGUFError):
            found = None
        types = [] if found is None else [int(k) for k in found]  # a long array comes as numpy's
        for t, kind in enumerate(types[: model.n_vocab]):
            if kind in (_UNKNOWN, _USER_DEFINED):
                kinds.setdefault(t, kind == _USER_DEFINED)
        specials = [SpecialToken(t, model.token_text(t), always) for t, always in kinds.items()]

        def plain(text: str) -> list[int]:
            return model.tokenize(text, add_special=False, parse_special=False)

        def strip(token: int) -> tuple[bool, bool]:
            text = model.token_text(token)
            left = model.tokenize(" " + text, add_special=False, parse_special=True) == [token]
            right = model.tokenize(text + " ", add_special=False, parse_special=True) == [token]
            return left, right

        pt = PromptTokenizer(specials, plain, strip)
        self._prompt_tokenizer = pt
        return pt

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.target.detokenize(tokens).decode("utf-8", errors="replace")

    @property
    def n_ctx(self) -> int:
        return self._target_ctx.n_ctx

    # -- generation ---------------------------------------------------------------------------------
    @property
    def can_draft(self) -> bool:
        """Whether the target's memory can undo a rejected draft (else every mode decodes plainly)."""
        return self.memory.rollback is not Rollback.NONE

    def _policy(self, gs: GenerationSettings) -> DraftPolicy:
        if gs.mode is Mode.PLAIN:
            return PlainPolicy()
        if not self.can_draft:
            return NoRollbackPolicy()
        if gs.mode is Mode.AUTO:
            return PassPolicy()  # the AutoDrafter chooses k (and sees how much of the reply is left)
        if gs.adaptive:
            return AdaptivePolicy(gs.n_min, gs.n_max)
        return FixedPolicy(gs.n_max)

    def _drafter(self, gs: GenerationSettings) -> Drafter | None:
        if gs.mode is Mode.PLAIN or not self.can_draft:
            return None
        if gs.mode is Mode.LOOKUP:
            return LookupDrafter(stops=self.target.control_tokens)
        if gs.mode is Mode.MTP:
            return self._mtp(gs)
        if gs.mode is Mode.AUTO:
            if gs.n_max not in self._auto:
                self._auto[gs.n_max] = AutoDrafter(
                    self._model_drafter,
                    LookupDrafter(stops=self.target.control_tokens),
                    history=self._keeper.drafter if self._keeper is not None else None,
                    n_max=gs.n_max,
                    costs=self.costs,
                )
            if self._model_drafter is not None:
                self._model_drafter.p_min = gs.p_min
                self._auto[gs.n_max].restore(self._remembered.get("auto") or {})
            return self._auto[gs.n_max]
        if self._model_drafter is None:
            raise EngineError("speculative mode needs a draft model: load one, or use mode 'lookup'")
        self._model_drafter.p_min = gs.p_min
        return self._model_drafter

    def _mtp(self, gs: GenerationSettings) -> Drafter:
        """The target's own MTP head (its context made on first use)."""
        if self.target.n_layer_nextn <= 0:
            raise EngineError(
                "mode 'mtp' needs a model with multi-token-prediction layers; this one has none"
            )
        if self._mtp_drafter is None:
            from app.engine.drafting.mtp import MtpDrafter

            self._mtp_drafter = MtpDrafter(self._target_ctx, n_threads=self.settings.n_threads)
            self._cache.rollback(0)  # the text cached so far left no hidden states: evaluate it again
        self._mtp_drafter.p_min = gs.p_min
        return self._mtp_drafter

    def generate(
        self,
        prompt: Sequence[int],
        settings: GenerationSettings | None = None,
        *,
        cancel: threading.Event | Callable[[], bool] | None = None,
    ) -> Iterator[Started | Step | Finished]:
        """Stream a reply to ``prompt`` (token ids). One generation at a time per engine."""
        gs = settings or GenerationSettings()
        drafter = self._drafter(gs)
        grammar = self._grammar(gs)
        is_cancelled = cancel.is_set if isinstance(cancel, threading.Event) else cancel
        if not self._lock.acquire(blocking=False):
            raise EngineError("a generation is already running on this engine")
        keeper = self._keeper if gs.history_doc else None
        if keeper is not None and drafter is not keeper.drafter and not isinstance(drafter, AutoDrafter):
            keeper.drafter.begin(prompt)  # other modes draft otherwise; the history still learns the reply
        try:
            for event in generate(
                self._cache,
                drafter,
                self._policy(gs),
                prompt,
                gs.sampling,
                piece=self.target.piece,
                is_eog=self.target.is_eog,
                max_tokens=gs.max_tokens,
                stop=gs.stop,
                cancel=is_cancelled,
                mode=gs.mode,
                grammar=grammar,
            ):
                if isinstance(event, Finished) and keeper is not None:
                    keeper.drafter.learn([*prompt, *event.tokens])
                    keeper.record(gs.history_doc)  # type: ignore[arg-type]
                yield event
        finally:
            self._lock.release()

    def _grammar(self, gs: GenerationSettings) -> Grammar | None:
        """A fresh grammar state for the request's constraint (the target's vocabulary for the grammar
        engine is read on the first one: about 1 s for 152k tokens)."""
        if gs.constraint is None:
            return None
        from app.engine.grammar import Grammar, compile_constraint  # llguidance, only when asked
        from app.engine.grammar_llama import vocabulary

        vocab: Vocabulary | None = getattr(self, "_grammar_vocab", None)
        if vocab is None:
            vocab = self._grammar_vocab = vocabulary(self.target)
        return Grammar(vocab, compile_constraint(gs.constraint))

    def top2_gap(self, context: Sequence[int]) -> float:
        """The target's best minus second-best logit after ``context``, evaluated from scratch.

        Batched and single-token evaluation are not bit-identical with quantized weights (about 0.1-0.2
        in a logit with Q4_K on a CPU), so two greedy runs can part only where this gap is that small.
        """
        ctx = Context(self.target, n_ctx=len(context) + 8, n_threads=self._target_ctx.n_threads)
        try:
            ctx.decode(context, 0, logits="last")
            top = np.sort(ctx.logits(-1).astype(np.float64))[-2:]
            return float(top[1] - top[0])
        finally:
            ctx.close()

    def reset(self) -> None:
        """Forget all cached context: the next request evaluates its whole prompt."""
        self._cache.rollback(0)
        for drafter in (self._model_drafter, getattr(self, "_mtp_drafter", None)):
            if drafter is not None:
                drafter.reset()

    def run(self, prompt: Sequence[int], settings: GenerationSettings | None = None) -> Finished:
        """Generate to the end and return the ``Finished`` event."""
        last = None
        for event in self.generate(prompt, settings):
            last = event
        assert isinstance(last, Finished)
        return last

    # -- information --------------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        """What is loaded, where, and how big (for the CLI, the status bar and bug reports)."""
        draft = None
        if self.draft is not None and self._draft_ctx is not None:
            draft = _model_info(self.draft, self._draft_ctx, self.draft_memory)
        return EngineInfo(
            backend=backend_name(),
            devices=tuple(devices()),
            n_ctx=self.n_ctx,
            target=_model_info(self.target, self._target_ctx, self.memory),
            draft=draft,
            gpu_offload=supports_gpu_offload(),
            offload_note=self.plan.reason,
        )

    # -- the drafting history ----------------------------------------------------------------------
    def history_info(self) -> HistoryInfo:
        return self._keeper.info() if self._keeper is not None else HistoryInfo(False)

    def forget_history(self) -> HistoryInfo:
        return self._keeper.forget() if self._keeper is not None else HistoryInfo(False)

    def remove_history(self, documents: Sequence[str]) -> HistoryInfo:
        return self._keeper.remove(documents) if self._keeper is not None else HistoryInfo(False)

    def close(self) -> None:
        memory, costs = getattr(self, "_memory", None), getattr(self, "costs", None)
        if memory is not None and isinstance(costs, MeasuredCosts):
            auto = next(iter(self._auto.values()), None)
            memory.save(
                {"costs": costs.state(), "auto": auto.state() if auto else self._remembered.get("auto")}
            )
        keeper = getattr(self, "_keeper", None)
        if keeper is not None:
            keeper.close()
        for obj in (
            getattr(self, "_mtp_drafter", None),
            getattr(self, "_draft_ctx", None),
            getattr(self, "draft", None),
            getattr(self, "_target_ctx", None),
            getattr(self, "target", None),
        ):
            if obj is not None:
                obj.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _keeper(folder: str | None, target: Path) -> HistoryKeeper | None:
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


def _model_path(path: str) -> Path:
    """The file llama.cpp opens (the first part of a split model), checked before anything loads."""
    first = first_part(path)
    missing = missing_parts(path) if split_info(Path(path).name) else []
    if missing:
        names = ", ".join(p.name for p in missing)
        raise ModelLoadError(f"{Path(path).name} is split into parts and some are missing: {names}")
    return check_model_file(first)


def _model_info(model: Model, ctx: Context, memory: MemoryInfo | None) -> ModelInfo:
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
