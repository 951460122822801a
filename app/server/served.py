"""The engine behind the API: the client, the turns all callers take, the model's names, and one
request's generation run on a thread with its events delivered to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine import (
    EngineClient,
    EngineCrashedError,
    Finished,
    GenerationSettings,
    GenerationStream,
    Mode,
    Started,
    Step,
    Ticket,
    TurnQueue,
)

log = logging.getLogger("tandem.server")

Event = Started | Step | Finished


@dataclass(frozen=True)
class Defaults:
    """Sampling used where a request does not say (llama.cpp's server's defaults)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05


class Unavailable(Exception):
    """The engine cannot answer now (loading, restarting, or failing to restart): a 503 with the reason."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Served:
    """What the API serves: a loaded pair behind ``client``, and how requests reach it.

    After a crash (or a stuck engine the watchdog killed) the engine is restarted in the background,
    and a restart that fails is tried again after ``backoff[0]`` seconds, doubling up to ``backoff[1]``,
    until it loads; meanwhile every request and ``/health`` say why (:meth:`unavailable`).
    """

    client: EngineClient
    turns: TurnQueue = field(default_factory=TurnQueue)
    mode: Mode = Mode.AUTO
    defaults: Defaults = field(default_factory=Defaults)
    ready: Callable[[], bool] = lambda: True  # False while the models load (answered with 503)
    restarting: bool = False  # a restart is being tried now
    model_path: str = ""
    n_ctx: int = 4096
    created: int = 0
    history: bool = False  # requests are recorded in the drafting history (each as its own document)
    # the draft length in speculative and lookup modes: at most n_max tokens a round, chosen by the
    # engine's adaptive policy, or (not adaptive) always n_max; in auto mode, the draft model's longest
    n_max: int = 8
    adaptive: bool = True
    backoff: tuple[float, float] = (0.5, 30.0)  # seconds before the first retry of a failed restart, most
    # -- what the engine is doing (for /health and the watchdog) --
    cause: str = field(default="", init=False)  # why the engine was last restarted
    failure: str = field(default="", init=False)  # why the last restart failed ("" once one succeeds)
    retry_at: float = field(default=0.0, init=False)  # time.monotonic() of the next restart attempt
    attempts: int = field(default=0, init=False)  # attempts of the restart in progress
    restarts: int = field(default=0, init=False)  # restarts that succeeded
    busy_since: float | None = field(default=None, init=False)  # our request's turn began (monotonic)
    progress_at: float | None = field(default=None, init=False)  # the engine's last event for it
    killed: str = field(default="", init=False)  # why the watchdog killed the engine (told to the request)
    _recovering: bool = field(default=False, init=False)
    _closed: threading.Event = field(default_factory=threading.Event, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def model_id(self) -> str:
        """The name clients use: the target file's name without ``.gguf``."""
        return Path(self.model_path).stem if self.model_path else "tandem"

    def knows(self, model: str | None) -> bool:
        """``model`` names the served model (its id or its file name); None means the default."""
        return model is None or model in (self.model_id, Path(self.model_path).name, "tandem")

    @property
    def n_vocab(self) -> int | None:
        info = self.client.loaded_info
        return info.target.n_vocab if info is not None else None

    @property
    def recovering(self) -> bool:
        """A restart is under way (tried now, or waiting to be tried again)."""
        return self._recovering

    @property
    def available(self) -> bool:
        return self.unavailable() is None

    def unavailable(self) -> Unavailable | None:
        """Why a request cannot be served now (None: it can)."""
        if self.restarting and self.failure:  # a retry after a failed restart: the failure is the why
            return Unavailable(f"the engine could not be restarted: {self.failure}; trying again now", 2)
        if self.restarting:
            why = f" after: {self.cause}" if self.cause else ""
            return Unavailable(f"the engine is restarting{why}; try again shortly", 2)
        if self.failure:
            wait = max(1.0, self.retry_at - time.monotonic())
            return Unavailable(
                f"the engine could not be restarted: {self.failure}; trying again in {wait:.0f} s", wait
            )
        if not self.ready():
            return Unavailable("the engine is loading the model; try again shortly", 2)
        state = self.client.state
        if self._recovering or state in ("dead", "starting"):
            return Unavailable("the engine is restarting; try again shortly", 2)
        if state == "loading":
            return Unavailable("the engine is loading the model; try again shortly", 2)
        if state == "stopped" or self.client.settings is None:
            return Unavailable("the engine has no model loaded; try again shortly", 2)
        return None

    def restart_after_crash(self, cause: str = "the engine process crashed") -> None:
        """A crash failed the request in flight (or the engine died or stuck): bring the engine back in
        the background, trying again with backoff until it loads (requests meanwhile get 503 with why)."""
        with self._lock:
            if self._recovering or self._closed.is_set():
                return
            self._recovering = True
            self.cause = cause
        threading.Thread(target=self._recover, name="tandem-server-restart", daemon=True).start()

    def _recover(self) -> None:
        delay = self.backoff[0]
        self.attempts = 0
        try:
            while not self._closed.is_set():
                self.attempts += 1
                self.restarting = True
                try:
                    with self.turns.turn(bounded=False, first=True):  # before requests already waiting
                        self.client.restart()
                except Exception as e:
                    reason = _one_line(e)
                    self.failure, self.retry_at = reason, time.monotonic() + delay
                    log.error(
                        "restarting the engine failed (attempt %d): %s; trying again in %.1f s",
                        self.attempts,
                        reason,
                        delay,
                    )
                else:
                    self.failure, self.killed = "", ""
                    self.restarts += 1
                    log.warning("the engine is back after: %s", self.cause)
                    return
                finally:
                    self.restarting = False
                if self._closed.wait(delay):
                    return
                delay = min(self.backoff[1], delay * 2)
        finally:
            self._recovering = False

    def kill_stuck(self, why: str) -> None:
        """The watchdog found the engine stuck: kill it (the request in flight fails saying ``why``) and
        restart it."""
        log.error("%s: restarting it", why)
        self.killed = why
        self.client.kill()
        self.restart_after_crash(why)

    def close(self) -> None:
        """Stop retrying restarts (the server is stopping)."""
        self._closed.set()

    # -- our requests' turns, for /health and the watchdog --
    def began(self) -> None:
        self.busy_since = self.progress_at = time.monotonic()

    def progressed(self) -> None:
        self.progress_at = time.monotonic()

    def ended(self) -> None:
        self.busy_since = self.progress_at = None


def _one_line(e: BaseException) -> str:
    what = getattr(e, "what", None) or str(e) or type(e).__name__
    return str(what).strip().splitlines()[0]


_END = object()


class Generation:
    """One request's reply: generated on a thread once its turn comes, events on an asyncio queue."""

    def __init__(
        self,
        served: Served,
        ticket: Ticket,
        settings: GenerationSettings,
        *,
        messages: Sequence[dict[str, Any]] | None = None,
        prompt: str | list[int] | None = None,
    ):
        self.served, self.ticket, self.settings = served, ticket, settings
        self.messages, self.prompt = messages, prompt
        self.n_prompt = 0
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._stream: GenerationStream | None = None
        self._thread = threading.Thread(target=self._run, name="tandem-server-request", daemon=True)

    def start(self) -> Generation:
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop generating (within one round), or leave the queue if the turn has not come yet."""
        self._cancelled.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        elif not self.ticket.active:
            self.ticket.release()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[Event]:
        """The reply's events; an engine error is raised here."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]

    def _put(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (server shutting down)
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _run(self) -> None:
        served, client = self.served, self.served.client
        began = False
        try:
            if not self.ticket.wait() or self.cancelled:
                return
            problem = served.unavailable()
            if problem is not None:
                raise problem
            served.began()
            began = True
            prompt = self.prompt
            text = prompt if isinstance(prompt, str) else None
            tokens = None if isinstance(prompt, str) else prompt
            stream = client.generate(prompt=tokens, messages=self.messages, settings=self.settings, text=text)
            self._stream = stream
            with stream:
                if self.cancelled:
                    stream.cancel()
                for event in stream:
                    served.progressed()
                    self._put(event)
        except EngineCrashedError as e:
            cause = served.killed or e.what
            self._put(Stalled(served.killed) if served.killed else e)
            served.restart_after_crash(cause)
        except BaseException as e:
            self._put(e)
        finally:
            if began:
                served.ended()
            self.ticket.release()
            self._put(_END)


class Stalled(Exception):
    """The watchdog killed the engine under this request: it made no progress for too long."""
