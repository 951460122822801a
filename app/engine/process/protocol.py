"""Messages between :class:`~app.engine.process.client.EngineClient` and the engine host process.

Every message is a small frozen (picklable) dataclass sent over a ``multiprocessing`` pipe. Requests go
client -> host; replies go host -> client and carry the ``request_id`` of the request they answer
(``Log`` and ``Ready`` answer nothing). Cancellation is *not* a message: it is a shared
``multiprocessing.Event`` the host's generation loop checks between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from app.engine.events import Finished, Started, Step
from app.engine.info import EngineInfo, EngineStatus, HistoryInfo
from app.engine.settings import GenerationSettings, LoadSettings

CrashKind = Literal["abort", "segfault", "exit"]
CRASH_KINDS: tuple[str, ...] = ("abort", "segfault", "exit")

# --------------------------------------------------------------------------------------------------
# Requests (client -> host)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """Base of all requests; the client numbers them so replies can be routed back."""

    request_id: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class Load(Request):
    """Load a target (and draft), replacing whatever is loaded. Replies: LoadProgress*, Loaded | Error."""

    settings: LoadSettings


@dataclass(frozen=True)
class Generate(Request):
    """Generate a reply to ``prompt`` (token ids), to ``text`` (tokenized as raw text) or to
    ``messages`` (rendered with the chat template). The host tokenizes between checks of the cancel
    flag; a request cancelled before its prompt is evaluated ends with Finished("cancelled") at once.

    Replies: Event(Started), Event(Step)*, Event(Finished) | Error.
    """

    prompt: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    settings: GenerationSettings = field(default_factory=GenerationSettings)


@dataclass(frozen=True)
class Tokenize(Request):
    """Text to prompt tokens. ``chat``: wrap ``text`` as one user message in the chat template;
    ``messages`` (if given) renders a whole chat instead. Reply: Tokens | Error."""

    text: str = ""
    chat: bool = False
    messages: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Gap(Request):
    """The target's best minus second-best logit after ``tokens``, evaluated from scratch (where a
    reply parts from plain decoding's, how close the call was). Reply: GapReply | Error."""

    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Unload(Request):
    """Free the models. Reply: Done."""


@dataclass(frozen=True)
class Info(Request):
    """What is loaded (answered between rounds even while generating). Reply: InfoReply."""


@dataclass(frozen=True)
class History(Request):
    """The drafting history: ``info``, ``forget`` everything, or ``remove`` documents (conversation
    ids). Reply: HistoryReply."""

    action: str = "info"
    documents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shutdown(Request):
    """Stop the host (a running generation is cancelled first). Reply: Done, then the process exits."""


@dataclass(frozen=True)
class Crash(Request):
    """Test only: make the host die like a native crash would ("abort", "segfault" or "exit")."""

    kind: str = "abort"


# --------------------------------------------------------------------------------------------------
# Replies (host -> client)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """Base of all replies."""

    request_id: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class Ready(Reply):
    """The host has started and imported llama.cpp."""

    pid: int
    version: str


@dataclass(frozen=True)
class LoadProgress(Reply):
    """Loading ``stage`` ("target" or "draft") is ``fraction`` (0..1) done."""

    stage: str
    fraction: float


@dataclass(frozen=True)
class Loaded(Reply):
    """The models are loaded; ``info`` is ``Engine.info()``."""

    info: EngineInfo


@dataclass(frozen=True)
class Event(Reply):
    """One record of the engine's generation stream."""

    event: Started | Step | Finished


@dataclass(frozen=True)
class Error(Reply):
    """A request failed. ``kind`` names the exception class; ``message`` is the engine's own text."""

    kind: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Tokens(Reply):
    """The tokens of a ``Tokenize`` request, and the context size they must fit in (0 if unknown)."""

    tokens: list[int]
    n_ctx: int = 0


@dataclass(frozen=True)
class GapReply(Reply):
    """The top-two logit gap a ``Gap`` request asked for."""

    gap: float


@dataclass(frozen=True)
class InfoReply(Reply):
    """The host's status: what is loaded, its pid, whether it is generating."""

    info: EngineStatus


@dataclass(frozen=True)
class HistoryReply(Reply):
    """The drafting history after a ``History`` request."""

    info: HistoryInfo


@dataclass(frozen=True)
class Done(Reply):
    """A request with no result (Unload, Shutdown) completed."""


@dataclass(frozen=True)
class Log(Reply):
    """A line of llama.cpp's log (forwarded so the caller's ``logging`` sees it)."""

    level: int
    line: str
    logger: str = "tandem.llama"
