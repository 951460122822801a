"""The engine facade: load a target (and a draft), turn chats into prompts, run generation modes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine.auto import AutoDrafter, AutoMemory, CostModel, MeasuredCosts
from app.engine.chat import ChatTemplate, Message
from app.engine.drafting import Drafter, LookupDrafter, ModelDrafter
from app.engine.errors import EngineError, IncompatibleDraftError
from app.engine.events import Finished, Mode, Started, Step
from app.engine.info import EngineInfo, HistoryInfo
from app.engine.llama import (
    Context,
    Model,
    ModelLoadError,
    backend_name,
    devices,
    supports_gpu_offload,
)
from app.engine.loading import (
    WARM_UP_BATCHES,
    head_kind,
    history_keeper,
    load_model,
    model_info,
    model_path,
    plan_for,
    warm_up,
)
from app.engine.overlap import Overlap
from app.engine.policy import (
    AdaptivePolicy,
    DraftPolicy,
    FixedPolicy,
    NoRollbackPolicy,
    PassPolicy,
    PlainPolicy,
)
from app.engine.prompt import PromptTokenizer, SpecialToken, TooManyTokens
from app.engine.sequence import probe_rollback
from app.engine.settings import MODES, GenerationSettings, LoadSettings
from app.engine.speculative import TargetCache, generate
from app.gguf import compat
from app.gguf.arch import Rollback
from app.gguf.drafts import DraftKind
from app.gguf.meta import GGUFError, read_metadata_file

if TYPE_CHECKING:
    from app.engine.drafting.mtp import MtpDrafter
    from app.engine.grammar import Grammar, Vocabulary

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
        target_path = model_path(settings.target)
        draft_path = model_path(settings.draft) if settings.draft else None
        if draft_path is not None:  # check the pair before loading anything large
            try:
                self.compatibility = compat.check_files(target_path, draft_path)
            except GGUFError as e:
                raise ModelLoadError(str(e)) from e
            if not self.compatibility.ok:
                raise IncompatibleDraftError(
                    f"the draft model cannot be used with this target: {self.compatibility.reason}"
                )
        head = head_kind(draft_path) if draft_path is not None else None  # a head, not a draft model
        self.plan = plan_for(settings, target_path, draft_path)
        self._keeper = history_keeper(settings.history_dir, target_path)
        self.draft: Model | None = None
        self._draft_ctx: Context | None = None
        self._target_ctx: Context | None = None
        self.target: Model | None = None
        try:
            self.target, self._target_ctx = load_model(
                settings,
                self.plan.gpus,
                "target",
                target_path,
                self.plan.target_layers,
                settings.n_ctx,
                progress,
                retry=settings.n_gpu_layers is None and self.plan.target_layers != 0,
            )
            if draft_path is not None:  # the plan set GPU memory aside for it
                self.draft, self._draft_ctx = load_model(
                    settings,
                    self.plan.gpus,
                    "draft",
                    draft_path,
                    self.plan.draft_layers,
                    self._target_ctx.n_ctx,
                    progress,
                    retry=False,
                    context=head is None,
                )
            self._cache = TargetCache(self._target_ctx)
            self.memory = probe_rollback(self._target_ctx)
            draft_memory = probe_rollback(self._draft_ctx) if self._draft_ctx is not None else None
        except BaseException:
            self.close()
            raise
        self.draft_memory = draft_memory
        usable = draft_memory is not None and draft_memory.rollback is not Rollback.NONE
        self._model_drafter: Drafter | None = (
            ModelDrafter(self._draft_ctx) if self._draft_ctx and usable else None
        )
        self._eagle = None  # an EAGLE-3 head's or a Gemma 4 assistant's drafter, in the draft model's place
        if head is not None and self.draft is not None:  # it reads the target from its next batch on
            from app.engine.drafting.eagle3 import Eagle3Drafter
            from app.engine.drafting.gemma4_assistant import AssistantDrafter

            kind = Eagle3Drafter if head is DraftKind.EAGLE3 else AssistantDrafter
            self._eagle = kind(self._target_ctx, self.draft, n_threads=settings.n_threads)
            self._model_drafter = self._eagle
        if self._keeper is not None:  # a copy from the history ends before a turn marker, as lookup's
            self._keeper.drafter.stops = self.target.control_tokens
        # auto mode's cost measurements belong to this loaded pair on this machine: keep them
        self.costs: CostModel = costs or MeasuredCosts()
        self._auto: dict[int, AutoDrafter] = {}
        # a target whose every layer is on a GPU queues its evaluations: plain rounds may then be queued
        # before they are planned (app.engine.overlap), learned per mode
        offload = self.target.offload
        self._queues = offload.on_gpu and offload.layers_offloaded >= offload.layers_total
        self._overlap: dict[Mode, Overlap] = {}
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
            warm_up(
                self._cache,
                self.target.n_vocab,
                self._draft_ctx,
                self.costs,
                on_gpu=self.target.offload.on_gpu,
            )
        template = self.target.chat_template()
        bos = self.target.token_name(self.target.bos) if self.target.bos >= 0 else ""
        eos = self.target.token_name(self.target.eos) if self.target.eos >= 0 else ""
        self.template = (
            ChatTemplate(template, bos_token=bos, eos_token=eos) if template else ChatTemplate.fallback()
        )
        self.has_chat_template = bool(template)

    WARM_UP_BATCHES = WARM_UP_BATCHES  # the batch sizes timed at load (app.engine.loading)

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
                    # the target's own MTP head, where it has one (one instance for every mode)
                    mtp=self._mtp(gs) if self.target.n_layer_nextn > 0 and not self._eagle else None,  # type: ignore[arg-type]
                    n_max=gs.n_max,
                    costs=self.costs,
                )
                # what the last session learned, once: later replies go on from what this one learns
                self._auto[gs.n_max].restore(self._remembered.get("auto") or {})
            for drafter in (self._model_drafter, self._mtp_drafter):
                if drafter is not None:
                    drafter.p_min = gs.p_min
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
        if self._eagle is not None:
            raise EngineError("mode 'mtp' is not available while a head given as the draft is loaded")
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
                overlap=self._overlap.setdefault(gs.mode, Overlap()) if self._queues and gs.overlap else None,
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
        if self.draft is not None:  # a head (EAGLE-3, an assistant) has no context of its own: the target's
            draft = model_info(self.draft, self._draft_ctx or self._target_ctx, self.draft_memory)
        return EngineInfo(
            backend=backend_name(),
            devices=tuple(devices()),
            n_ctx=self.n_ctx,
            target=model_info(self.target, self._target_ctx, self.memory),
            draft=draft,
            gpu_offload=supports_gpu_offload(),
            offload_note=self.plan.reason,
            auto_costs=self.costs.state() if isinstance(self.costs, MeasuredCosts) else None,
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
            getattr(self, "_eagle", None),
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
