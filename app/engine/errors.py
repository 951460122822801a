"""Exceptions the engine raises. No llama_cpp import here: the UI process catches these too."""

from __future__ import annotations


class LlamaError(RuntimeError):
    """An error reported by llama.cpp (or detected before calling it)."""


class ModelLoadError(LlamaError):
    """A model file could not be loaded."""


class DecodeError(LlamaError):
    """``llama_decode`` failed."""


class ContextFullError(DecodeError):
    """The batch does not fit in the context's KV cache."""


class EngineError(ValueError):
    """Bad settings or a request the loaded models cannot serve."""


class ConstraintError(EngineError):
    """A structured-output constraint (JSON schema, GBNF grammar) that cannot be used; the message is
    one line, fit for an API's 400."""


class IncompatibleDraftError(EngineError):
    """The draft model's vocabulary does not match the target's."""


class PromptTooLongError(ValueError):
    """The prompt does not fit in the context."""
