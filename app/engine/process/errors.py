"""Errors the engine client raises: a crashed engine process, and engine errors rebuilt from replies."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.chat import ChatTemplateError
from app.engine.errors import (
    ConstraintError,
    ContextFullError,
    DecodeError,
    EngineError,
    IncompatibleDraftError,
    LlamaError,
    ModelLoadError,
    PromptTooLongError,
)
from app.engine.process.protocol import (
    Error,
)
from app.engine.sampling import SamplingError
from app.gguf.meta import GGUFError

log = logging.getLogger("tandem.client")

ProgressCallback = Callable[[str, float], None]
_POLL = 0.2  # seconds between liveness checks while waiting


class EngineCrashedError(RuntimeError):
    """The engine process died (native crash, killed, exited). Its loaded models are gone."""

    def __init__(
        self,
        message: str,
        exitcode: int | None = None,
        signal_name: str | None = None,
        log_tail: Sequence[str] = (),
        python_traceback: str = "",
        what: str = "",
    ):
        super().__init__(message)
        self.what = what or message  # what happened, in one line (without the log lines)
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.log_tail = list(log_tail)
        self.python_traceback = python_traceback  # faulthandler's dump of the host's Python stack


class RemoteError(RuntimeError):
    """An unexpected exception inside the engine process (``kind`` names its class)."""

    def __init__(self, message: str, kind: str = ""):
        super().__init__(message)
        self.kind = kind


_ERROR_TYPES: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        EngineError,
        ConstraintError,
        IncompatibleDraftError,
        ModelLoadError,
        LlamaError,
        DecodeError,
        ContextFullError,
        PromptTooLongError,
        SamplingError,
        ChatTemplateError,
        GGUFError,
        ValueError,
        TypeError,
        RuntimeError,
        OSError,
        FileNotFoundError,
        PermissionError,
        MemoryError,
    )
}


def error_from_reply(reply: Error) -> Exception:
    """The exception an ``Error`` reply stands for (same class where known), with the host traceback."""
    cls = _ERROR_TYPES.get(reply.kind)
    try:
        exc: Exception = (
            cls(reply.message) if cls else RemoteError(f"{reply.kind}: {reply.message}", reply.kind)
        )
    except Exception:  # an exception class with an unusual constructor
        exc = RemoteError(f"{reply.kind}: {reply.message}", reply.kind)
    exc.remote_traceback = reply.traceback  # type: ignore[attr-defined]
    return exc


def copy_error(err: Exception) -> Exception:
    """A fresh exception with the same class and fields (an instance must not be raised twice)."""
    new = type(err)(*err.args)
    new.__dict__.update(err.__dict__)
    return new


_WINDOWS_CODES = {
    0xC0000005: "ACCESS_VIOLATION",
    0xC00000FD: "STACK_OVERFLOW",
    0xC0000409: "SIGABRT",  # __fastfail / abort() in recent MSVC runtimes
    3: "SIGABRT",  # abort() in the classic MSVC runtime
}


def signal_name(code: int | None) -> str | None:
    if code is None:
        return None
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if sys.platform == "win32":
        return _WINDOWS_CODES.get(code & 0xFFFFFFFF)
    return None


def crash_fields(err: Exception) -> tuple[Any, ...]:
    if isinstance(err, EngineCrashedError):
        return (err.exitcode, err.signal_name, err.log_tail, err.python_traceback, err.what)
    return ()
