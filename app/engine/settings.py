"""What to load and how to generate: plain frozen settings shared by the engine, its process and the UI.

No llama_cpp import here, so the UI process can build settings without loading llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.errors import ConstraintError, EngineError
from app.engine.events import Mode
from app.engine.sampling import SamplingParams

MODES = tuple(m.value for m in Mode if m is not Mode.REMOTE)  # the modes a reply may ask for
CONSTRAINT_KINDS = ("json_object", "json_schema", "gbnf")


@dataclass(frozen=True)
class LoadSettings:
    """What to load and how. ``n_gpu_layers``: None = auto (as many layers on the GPU as fit, all
    where they fit), -1 = all layers, 0 = CPU only, N = the last N layers."""

    target: str
    draft: str | None = None
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_threads_draft: int | None = None
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    flash_attn: bool | None = None
    # where the drafting history is kept (one file per tokenizer family); None: no history drafter
    history_dir: str | None = None

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise EngineError(f"n_ctx must be at least 16, not {self.n_ctx}")
        if self.n_batch < 1:
            raise EngineError(f"n_batch must be >= 1, not {self.n_batch}")
        for name in ("n_threads", "n_threads_draft"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise EngineError(f"{name} must be >= 1, not {v}")
        for name in ("n_gpu_layers", "n_gpu_layers_draft"):
            v = getattr(self, name)
            if v is not None and v < -1:
                raise EngineError(
                    f"{name} must be -1 (all), 0 (CPU only), a layer count or None (auto), not {v}"
                )


def parse_gpu_layers(text: str) -> int | None:
    """``auto`` -> None, ``all`` -> -1, ``cpu`` -> 0, ``N`` -> N (for the CLI and settings files)."""
    word = text.strip().lower()
    named = {"auto": None, "all": -1, "cpu": 0}
    if word in named:
        return named[word]
    try:
        n = int(word)
    except ValueError:
        raise EngineError(f"GPU layers must be auto, all, cpu or a number, not {text!r}") from None
    if n < -1:
        raise EngineError(f"GPU layers must be auto, all, cpu or a number >= 0, not {text!r}")
    return n


@dataclass(frozen=True)
class Constraint:
    """Structured output: the reply must follow a grammar, in every mode and losslessly.

    ``kind``: "json_object" (any JSON object), "json_schema" (``schema``: a JSON schema as JSON text)
    or "gbnf" (``gbnf``: a grammar in llama.cpp's GBNF, or in llguidance's Lark, told apart by its
    syntax: Lark names special tokens, ``<tool_call>``, and embeds JSON schemas, ``%json {...}``, so a
    tool call in a model's own format can be required). ``strict`` (json_schema): every keyword of the
    schema must be enforceable, else :class:`ConstraintError`; without it, keywords the grammar engine
    does not implement are ignored (the reply still follows the rest of the schema). Building one
    checks the schema or grammar (:class:`ConstraintError`, one line: fit for an API's 400).
    """

    kind: str
    schema: str | None = None
    gbnf: str | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ConstraintError(
                f"unknown constraint kind {self.kind!r}: choose one of {', '.join(CONSTRAINT_KINDS)}"
            )
        wants = {"json_object": None, "json_schema": "schema", "gbnf": "gbnf"}[self.kind]
        for name in ("schema", "gbnf"):
            value = getattr(self, name)
            if name == wants and not (isinstance(value, str) and value.strip()):
                raise ConstraintError(f"a {self.kind} constraint needs its {name} (text)")
            if name != wants and value is not None:
                raise ConstraintError(f"a {self.kind} constraint takes no {name}")
        from app.engine.grammar import compile_constraint  # the grammar engine checks it

        compile_constraint(self)


@dataclass(frozen=True)
class GenerationSettings:
    """How to generate one reply."""

    mode: Mode = Mode.AUTO  # (its word is taken too: "auto", ...)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512
    n_max: int = 8
    n_min: int = 1
    p_min: float = 0.0
    adaptive: bool = True
    stop: tuple[str, ...] = ()
    # the conversation (or API request) this reply belongs to, for the drafting history (None: not kept)
    history_doc: str | None = None
    # structured output: the reply follows this grammar (None: free text)
    constraint: Constraint | None = None
    # where the target runs on a GPU, queue a plain round's evaluation before planning it (see
    # app.engine.overlap; off: every batch after its round is planned, as on a CPU: for benchmarks)
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise EngineError(f"unknown mode {str(self.mode)!r}: choose one of {', '.join(MODES)}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.n_max < 1:
            raise EngineError(f"n_max must be at least 1, not {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise EngineError(f"n_min must be between 0 and n_max ({self.n_max}), not {self.n_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise EngineError(f"p_min must be in [0, 1], not {self.p_min}")
        if self.max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, not {self.max_tokens}")
        if any(not s for s in self.stop):
            raise EngineError("stop strings must not be empty")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise EngineError(f"constraint must be a Constraint, not {type(self.constraint).__name__}")

    @classmethod
    def from_options(
        cls,
        mode: Mode | str = Mode.AUTO,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repeat_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        max_tokens: int = 512,
        n_max: int = 8,
        n_min: int = 1,
        p_min: float = 0.0,
        adaptive: bool = True,
        stop: tuple[str, ...] = (),
        constraint: Constraint | None = None,
    ) -> GenerationSettings:
        """Settings from flat options, as the CLI, the app and the server take them (``n_min`` is
        clamped to ``n_max``; a negative ``seed`` means a random one)."""
        return cls(
            mode=Mode(mode) if mode in MODES else mode,  # type: ignore[arg-type]
            sampling=SamplingParams(
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                min_p=min_p,
                repeat_penalty=repeat_penalty,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                seed=None if seed is None or seed < 0 else seed,
            ),
            max_tokens=max_tokens,
            n_max=n_max,
            n_min=min(max(0, n_min), n_max),
            p_min=p_min,
            adaptive=adaptive,
            stop=tuple(stop),
            constraint=constraint,
        )
