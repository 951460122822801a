"""``EngineClient``: the engine in its own process, behind a small typed, thread-safe API.

A llama.cpp abort, a segfault or the OOM killer takes down only the host process: the caller gets an
:class:`EngineCrashedError` naming what happened (and llama.cpp's last log lines), keeps its own state,
and can :meth:`~EngineClient.restart` the engine (or let ``auto_restart`` do it on the next call).
Errors the engine raises (``EngineError``, ``ModelLoadError``, ``PromptTooLongError``, ...) come back
as the same exception types.

Message flow: requests go down one pipe, replies come up another. A reader thread per host process
routes replies to the waiting call by ``request_id`` and notices the process dying (EOF on the reply
pipe, or ``exitcode`` set), which wakes every waiting call with the crash. Cancellation is a shared
``multiprocessing.Event`` the host checks between generation rounds.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from app.engine.errors import (
    EngineError,
)
from app.engine.events import Finished, Started, Step
from app.engine.info import EngineInfo, EngineStatus, HistoryInfo
from app.engine.process.errors import EngineCrashedError, crash_fields, error_from_reply
from app.engine.process.handle import HostHandle
from app.engine.process.protocol import (
    Crash,
    Done,
    Error,
    Event,
    Gap,
    GapReply,
    Generate,
    History,
    HistoryReply,
    Info,
    InfoReply,
    Load,
    Loaded,
    LoadProgress,
    Reply,
    Request,
    Tokenize,
    Tokens,
    Unload,
)
from app.engine.settings import GenerationSettings, LoadSettings

log = logging.getLogger("tandem.client")

ProgressCallback = Callable[[str, float], None]
_POLL = 0.2  # seconds between liveness checks while waiting


class EngineClient:
    """The engine in a child process. Thread-safe; one generation at a time; ``cancel()`` from anywhere.

    ``auto_restart``: after a crash (reported once, by the call it interrupted) the next call starts a
    fresh process and re-loads the last loaded settings first.
    """

    def __init__(
        self, *, auto_restart: bool = False, start_timeout: float = 120.0, stop_timeout: float = 5.0
    ):
        self.auto_restart = auto_restart
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.last_crash: EngineCrashedError | None = None  # the most recent crash, reported or not
        self._host: HostHandle | None = None
        self._settings: LoadSettings | None = None  # what is loaded
        self._wanted: LoadSettings | None = None  # what should be: a failed reload keeps it to retry
        self.loaded_info: EngineInfo | None = None  # the loaded pair's info (None if nothing is)
        self._starting = 0  # threads starting a process now
        self._loading = 0  # threads loading a pair now
        self._ids = itertools.count(1)
        self._lifecycle = threading.RLock()
        self._generation = threading.Lock()
        self._stream: weakref.ref[GenerationStream] | None = None  # weak: an abandoned stream closes

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine process (no model loaded) if it is not running."""
        with self._lifecycle:
            if self._host is not None and self._host.exit_error is None:
                return
            if self._host is not None:
                self._host.stop(self.stop_timeout)
                self._host = None
            host = HostHandle()
            self._starting += 1
            try:
                host.start(self.start_timeout)
            except BaseException:
                host.stop(self.stop_timeout)
                raise
            finally:
                self._starting -= 1
            self._host = host

    def shutdown(self) -> None:
        """Stop the engine process (cancelling a running generation) and wait for it to exit."""
        with self._lifecycle:
            host, self._host = self._host, None
            self._settings = self._wanted = self.loaded_info = None
        if host is not None:
            host.stop(self.stop_timeout)

    close = shutdown

    def restart(self, progress: ProgressCallback | None = None) -> EngineInfo | None:
        """Start a fresh engine process and re-load the pair that should be loaded (the last one loaded,
        even if reloading it failed since); returns its info. A failure leaves that pair wanted, so
        calling again retries it."""
        with self._lifecycle:
            settings = self._wanted
            host, self._host = self._host, None
            if host is not None:
                host.stop(self.stop_timeout)
            self.start()
            return self.load(settings, progress) if settings is not None else None

    @property
    def alive(self) -> bool:
        """True while the engine process is running."""
        host = self._host
        return host is not None and host.exit_error is None and host.is_alive()

    @property
    def state(self) -> str:
        """The engine process: "stopped" (none), "starting", "loading" (a pair), "running" or "dead" (gone,
        not restarted)."""
        if self._starting:
            return "starting"
        host = self._host
        if host is None:
            return "stopped"
        if host.exit_error is not None or not host.is_alive():
            return "dead"
        return "loading" if self._loading else "running"

    @property
    def exit_error(self) -> Exception | None:
        """Why the engine process is gone (an :class:`EngineCrashedError` after a crash), while it is
        not restarted; None while it runs."""
        host = self._host
        return host.gone_error() if host is not None else None

    @property
    def wanted(self) -> LoadSettings | None:
        """The pair that should be loaded: the last asked for, until shutdown, unload or another load
        that fails."""
        return self._wanted

    @property
    def pid(self) -> int | None:
        host = self._host
        return host.process.pid if host is not None else None

    @property
    def log_path(self) -> str | None:
        """The engine process's log file (llama.cpp's log, stderr), for bug reports."""
        host = self._host
        return host.log_path if host is not None else None

    @property
    def settings(self) -> LoadSettings | None:
        """What is loaded (None if nothing is)."""
        return self._settings

    def __enter__(self) -> EngineClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _ready(self, *, reload: bool = True, retry: bool = False) -> HostHandle:
        """The running host; starts one if needed, or after a crash (with ``auto_restart``). ``retry``:
        also load the wanted pair where reloading it failed before (with ``auto_restart``)."""
        with self._lifecycle:
            host = self._host
            if host is None:
                self.start()
            elif host.exit_error is not None:
                err = host.exit_error
                if not self.auto_restart:
                    raise EngineCrashedError(
                        f"the engine process is not running (call restart()): {err}",
                        *(crash_fields(err)),
                    )
                if isinstance(err, EngineCrashedError):
                    self.last_crash = err
                log.warning("restarting the engine process after: %s", err)
                self.start()
                if reload and self._wanted is not None:
                    self.load(self._wanted)
            elif retry and self.auto_restart and self._settings is None and self._wanted is not None:
                self.load(self._wanted)  # a reload failed before: the pair is still wanted
            assert self._host is not None
            return self._host

    def _remember_crash(self, host: HostHandle) -> None:
        err = host.exit_error
        if isinstance(err, EngineCrashedError):
            self.last_crash = err

    def _request_id(self) -> int:
        return next(self._ids)

    # -- requests -----------------------------------------------------------------------------------
    def load(self, settings: LoadSettings, progress: ProgressCallback | None = None) -> EngineInfo:
        """Load a target (and draft), replacing the loaded pair; blocks until loaded and returns its info.

        ``progress(stage, fraction)`` is called in this thread; stage is "target" or "draft".
        """
        self._refuse_while_generating("load a model")
        host = self._ready(reload=False)
        self._settings = self.loaded_info = None  # the host frees the old pair first
        if settings != self._wanted:
            self._wanted = None  # until it loads: a failed load of another pair is not retried
        rid = self._request_id()
        self._loading += 1
        try:
            q = host.submit(Load(settings, request_id=rid), "while loading the model")
            while True:
                reply = self._wait(host, q)
                if isinstance(reply, LoadProgress):
                    if progress is not None:
                        try:
                            progress(reply.stage, reply.fraction)
                        except Exception:
                            log.exception("load progress callback failed")
                elif isinstance(reply, Loaded):
                    self._settings = self._wanted = settings
                    self.loaded_info = reply.info
                    return reply.info
                elif isinstance(reply, Error):
                    raise error_from_reply(reply)
        finally:
            self._loading -= 1
            host.done(rid)

    def generate(
        self,
        prompt: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        settings: GenerationSettings | None = None,
        *,
        text: str | None = None,
    ) -> GenerationStream:
        """Stream a reply to ``prompt`` (token ids), ``text`` (raw text the host tokenizes) or
        ``messages`` (a chat the host renders). The host tokenizes between checks of the cancel flag.

        Yields Started, Steps, then Finished. Closing the stream early cancels the request.
        """
        if sum(x is not None for x in (prompt, messages, text)) != 1:
            raise EngineError("give one of a prompt (token ids), a text or chat messages")
        if not self._generation.acquire(blocking=False):
            raise EngineError("a generation is already running on this engine: cancel it or let it finish")
        try:
            host = self._ready(retry=True)
            host.cancel.clear()
            rid = self._request_id()
            request = Generate(
                prompt=list(prompt) if prompt is not None else None,
                messages=[dict(m) for m in messages] if messages is not None else None,
                text=text,
                settings=settings or GenerationSettings(),
                request_id=rid,
            )
            q = host.submit(request, "during generation")
        except BaseException:
            self._generation.release()
            raise
        stream = GenerationStream(self, host, rid, q)
        self._stream = weakref.ref(stream)
        return stream

    def cancel(self) -> None:
        """Cancel the running generation (any thread); its stream ends with Finished("cancelled")."""
        stream = self._active_stream()
        if stream is not None:
            stream.cancel()

    def tokenize(
        self, text: str = "", *, chat: bool = False, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Prompt tokens for raw ``text``, for ``text`` as a user chat message, or for ``messages``."""
        host = self._ready()
        msgs = [dict(m) for m in messages] if messages is not None else None
        reply = self._call(
            host, Tokenize(text, chat, msgs, request_id=self._request_id()), "while tokenizing"
        )
        assert isinstance(reply, Tokens)
        return list(reply.tokens)

    def top2_gap(self, tokens: Sequence[int]) -> float:
        """The target's best minus second-best logit after ``tokens`` (evaluated from scratch)."""
        self._refuse_while_generating("compare logits")
        host = self._ready()
        reply = self._call(host, Gap(tuple(tokens), request_id=self._request_id()), "while comparing logits")
        assert isinstance(reply, GapReply)
        return reply.gap

    def info(self) -> EngineStatus:
        """What is loaded, where, and how big (answered even while a reply is being generated)."""
        host = self._ready()
        reply = self._call(host, Info(request_id=self._request_id()), "while answering info")
        assert isinstance(reply, InfoReply)
        return reply.info

    def history(self, action: str = "info", documents: Sequence[str] = ()) -> HistoryInfo:
        """The drafting history (``info``), or ``forget`` all of it, or ``remove`` the tokens of
        these documents (conversation ids)."""
        if action != "info":
            self._refuse_while_generating("change the drafting history")
        host = self._ready()
        request = History(action, tuple(documents), request_id=self._request_id())
        reply = self._call(host, request, "while answering about the history")
        assert isinstance(reply, HistoryReply)
        return reply.info

    def unload(self) -> None:
        """Free the loaded models (the process keeps running)."""
        self._refuse_while_generating("unload the model")
        host = self._ready(reload=False)
        reply = self._call(host, Unload(request_id=self._request_id()), "while unloading")
        assert isinstance(reply, Done)
        self._settings = self._wanted = self.loaded_info = None

    def ping(self, timeout: float) -> bool | None:
        """Whether the engine process answers within ``timeout`` seconds (it answers between rounds
        while it generates); None when there is no process to ask. Never starts or restarts one."""
        host = self._host
        if host is None or host.exit_error is not None or not host.is_alive():
            return None
        rid = self._request_id()
        try:
            q = host.submit(Info(request_id=rid), "while answering a ping")
        except Exception:
            return None
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            return False
        finally:
            host.done(rid)
        return True if isinstance(reply, (InfoReply, Error)) else None  # else: the process is gone

    def kill(self) -> None:
        """Kill the engine process at once (SIGKILL): a stuck engine. The call in flight fails with
        :class:`EngineCrashedError`, and the next call restarts it (with ``auto_restart``)."""
        host = self._host
        if host is not None and host.is_alive():
            with host.proc_lock:
                if host.process.exitcode is None:
                    host.process.kill()

    def crash(self, kind: str) -> None:
        """Tests only: make the engine process die ("abort", "segfault" or "exit"). Raises the crash."""
        host = self._ready()
        self._call(host, Crash(kind, request_id=self._request_id()), "on a test's request")
        raise EngineError("the engine process did not crash")  # pragma: no cover

    # -- helpers ------------------------------------------------------------------------------------
    def _active_stream(self) -> GenerationStream | None:
        stream = self._stream() if self._stream is not None else None
        return stream if stream is not None and not stream.done else None

    def _refuse_while_generating(self, what: str) -> None:
        stream = self._active_stream()
        if stream is not None and stream._host is self._host:
            raise EngineError(f"cannot {what} while a reply is being generated: cancel it first")

    def _wait(self, host: HostHandle, q: queue.Queue[Any]) -> Reply:
        try:
            return host.wait(q)
        except EngineCrashedError:
            self._remember_crash(host)
            raise

    def _call(self, host: HostHandle, request: Request, what: str) -> Reply:
        try:
            return host.call(request, what)
        except EngineCrashedError:
            self._remember_crash(host)
            raise


class GenerationStream(Iterator[Started | Step | Finished]):
    """The events of one generation. ``close()`` (or leaving a ``with`` block) cancels and drains it."""

    def __init__(self, client: EngineClient, host: HostHandle, request_id: int, q: queue.Queue[Any]):
        self._client = client
        self._host = host
        self._rid = request_id
        self._q = q
        self.done = False
        self._release_lock = threading.Lock()

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> Started | Step | Finished:
        while not self.done:
            try:
                reply = self._client._wait(self._host, self._q)
            except BaseException:
                self._finish()
                raise
            if isinstance(reply, Event):
                if isinstance(reply.event, Finished):
                    self._finish()
                return reply.event
            if isinstance(reply, Error):
                self._finish()
                raise error_from_reply(reply)
        raise StopIteration

    def cancel(self) -> None:
        """Ask the host to stop after the current round (the stream then ends with Finished)."""
        if not self.done:
            self._host.cancel.set()

    def close(self) -> None:
        """Cancel the request and drain its remaining events (about one round)."""
        if self.done:
            return
        self._host.cancel.set()
        try:
            while not self.done:
                next(self)
        except (StopIteration, Exception):  # a crash is reported by the next call instead
            pass
        self._finish()

    def _finish(self) -> None:
        with self._release_lock:
            if self.done:
                return
            self.done = True
        self._host.done(self._rid)
        self._client._generation.release()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
