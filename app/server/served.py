"""The engine behind the API: the client, the turns all callers take, the model's names, and one
request's generation run on a thread with its events delivered to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
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


@dataclass
class Served:
    """What the API serves: a loaded pair behind ``client``, and how requests reach it."""

    client: EngineClient
    turns: TurnQueue = field(default_factory=TurnQueue)
    mode: str = "auto"
    defaults: Defaults = field(default_factory=Defaults)
    ready: Callable[[], bool] = lambda: True  # False while the models load (answered with 503)
    restarting: bool = False
    model_path: str = ""
    n_ctx: int = 4096
    created: int = 0
    history: bool = False  # requests are recorded in the drafting history (each as its own document)

    @property
    def model_id(self) -> str:
        """The name clients use: the target file's name without ``.gguf``."""
        return Path(self.model_path).stem if self.model_path else "tandem"

    def knows(self, model: str | None) -> bool:
        """``model`` names the served model (its id or its file name); None means the default."""
        return model is None or model in (self.model_id, Path(self.model_path).name, "tandem")

    @property
    def available(self) -> bool:
        return self.ready() and not self.restarting

    def restart_after_crash(self) -> None:
        """A crash failed the request in flight: bring the engine back in the background (requests
        meanwhile get 503), so the next one works."""
        if self.restarting:
            return
        self.restarting = True

        def run() -> None:
            try:
                with self.turns.turn(bounded=False, first=True):  # before requests already waiting
                    self.client.restart()
            except Exception:
                log.exception("restarting the engine after a crash failed")
            finally:
                self.restarting = False

        threading.Thread(target=run, name="tandem-server-restart", daemon=True).start()


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
        client = self.served.client
        try:
            if not self.ticket.wait() or self.cancelled:
                return
            prompt = self.prompt
            if isinstance(prompt, str):
                prompt = client.tokenize(prompt)
            stream = client.generate(prompt=prompt, messages=self.messages, settings=self.settings)
            self._stream = stream
            with stream:
                if self.cancelled:
                    stream.cancel()
                for event in stream:
                    self._put(event)
        except EngineCrashedError as e:
            self._put(e)
            self.served.restart_after_crash()
        except BaseException as e:
            self._put(e)
        finally:
            self.ticket.release()
            self._put(_END)
