"""The app's settings: one dataclass, persisted as JSON in the data directory, mapped to engine settings."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from app.engine import EngineError, GenerationSettings, LoadSettings, Mode, parse_gpu_layers
from app.ui.core.paths import data_dir
from models_registry.fit import MIN_SPEED

log = logging.getLogger("tandem.ui")

DRAFT_SOURCES = ("auto", "model", "lookup", "mtp")
FILE_NAME = "settings.json"

# fields that only take effect when the models are (re)loaded
LOAD_FIELDS = ("n_ctx", "gpu_layers", "gpu_layers_draft", "n_threads", "keep_history")


@dataclass(frozen=True)
class AppSettings:
    """Everything the Settings dialog edits. ``n_threads`` 0 = llama.cpp's default; ``seed`` -1 = random."""

    speculative: bool = True
    draft_source: str = "auto"  # auto | model | lookup | mtp
    n_max: int = 8
    n_min: int = 1
    p_min: float = 0.0
    adaptive: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    seed: int = -1
    max_tokens: int = 1024
    n_ctx: int = 4096
    gpu_layers: str = "auto"  # auto (as many as fit), all, cpu, or a layer count
    gpu_layers_draft: str = "auto"
    keep_history: bool = True  # the history drafter learns from the user's chats (on this machine)
    n_threads: int = 0
    min_speed: float = MIN_SPEED  # tokens/s: the Models panel recommends the largest pair reaching it
    server_port: int = 8080  # the local API (Server › Local API server) on 127.0.0.1
    last_target: str = ""
    last_draft: str = ""

    @property
    def mode(self) -> Mode:
        """The engine's generation mode for these settings."""
        if not self.speculative:
            return Mode.PLAIN
        sources = {"auto": Mode.AUTO, "model": Mode.SPECULATIVE, "lookup": Mode.LOOKUP, "mtp": Mode.MTP}
        return sources.get(self.draft_source, Mode.AUTO)

    def generation(self, *, has_draft: bool = True, has_mtp: bool = True) -> GenerationSettings:
        """Per-reply engine settings. Without a draft model, "draft model" falls back to auto mode;
        with a target that has no multi-token-prediction layers, so does "the model's own MTP layers"."""
        mode = self.mode
        if (mode is Mode.SPECULATIVE and not has_draft) or (mode is Mode.MTP and not has_mtp):
            mode = Mode.AUTO
        return GenerationSettings.from_options(
            mode,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
            max_tokens=max(1, self.max_tokens),
            n_max=max(1, self.n_max),
            n_min=self.n_min,
            p_min=self.p_min,
            adaptive=self.adaptive,
        )

    def load(self, target: str, draft: str | None) -> LoadSettings:
        """Load-time engine settings for a target (and draft) file."""
        return LoadSettings(
            target=target,
            draft=draft or None,
            n_ctx=self.n_ctx,
            n_threads=self.n_threads or None,
            n_gpu_layers=_gpu_layers(self.gpu_layers),
            n_gpu_layers_draft=_gpu_layers(self.gpu_layers_draft),
            history_dir=str(data_dir() / "history") if self.keep_history else None,
        )

    def needs_reload(self, other: AppSettings) -> bool:
        """True if switching from ``self`` to ``other`` changes how models are loaded."""
        return any(getattr(self, f) != getattr(other, f) for f in LOAD_FIELDS)

    # -- persistence --------------------------------------------------------------------------------
    @classmethod
    def read(cls, directory: Path) -> AppSettings:
        """The saved settings (defaults for anything missing or unreadable)."""
        path = Path(directory) / FILE_NAME
        try:
            raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable settings file %s: %s", path, e)
            return cls()
        known = {f.name: f for f in fields(cls)}
        default = cls()
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key in known and isinstance(value, type(getattr(default, key))):
                values[key] = value
            elif key in known and isinstance(getattr(default, key), float) and isinstance(value, int):
                values[key] = float(value)
        settings = replace(default, **values)
        if settings.draft_source not in DRAFT_SOURCES:
            settings = replace(settings, draft_source="auto")
        return settings

    def write(self, directory: Path) -> None:
        path = Path(directory) / FILE_NAME
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        tmp.replace(path)


def _gpu_layers(text: str) -> int | None:
    """A saved GPU-layers choice for the engine (an unreadable one means auto)."""
    try:
        return parse_gpu_layers(text)
    except EngineError:
        log.warning("ignoring the GPU layers setting %r: using auto", text)
        return None
