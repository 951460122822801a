"""The engine thread: one Python thread runs every blocking ``EngineClient`` call, in order.

:class:`EngineWorker` is a QObject living in the GUI thread. Jobs (load, generate, calibrate) run on its
thread; everything they report crosses back through one queued signal and is re-emitted from the GUI
thread, so every public signal is delivered in the GUI thread. Step events are coalesced: the engine
thread appends them to a buffer and posts at most one wake-up until the GUI has drained it, so a fast
model cannot flood the event loop. Cancelling stops the worker's own reply (thread-safe; the engine stops
within one round), never killing a thread, nor a request of the local server's that holds the engine.

The chat can go to a remote server instead (``use_remote``: an ``app.remote_client.RemoteClient``,
which streams the same events); loading a pair goes back to the engine.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.engine import (
    EngineClient,
    EngineCrashedError,
    Finished,
    GenerationSettings,
    LoadSettings,
    Started,
    Step,
    TurnQueue,
)
from app.speedcheck import run_check
from app.ui.core import forgotten

log = logging.getLogger("tandem.ui")

CALIBRATION_PROMPT = [{"role": "user", "content": "Say hello."}]


@dataclass
class _Job:
    kind: str  # load | generate | calibrate | check | connect | stop
    payload: Any = None
    cancelled: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)


class EngineWorker(QObject):
    """Drives an :class:`EngineClient` from its own thread and reports through Qt signals."""

    loadStarted = Signal(object)  # LoadSettings
    loadProgress = Signal(str, float)  # stage ("target", "draft", "restart"), fraction
    loaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)
    started = Signal(object)  # Started
    steps = Signal(list)  # list[Step], coalesced
    finished = Signal(object)  # Finished, or None when cancelled before it started
    failed = Signal(str, bool)  # message, the engine process crashed
    calibrated = Signal(list)  # list[Step] of a short plain-decoding run (empty: it failed)
    checkProgress = Signal(int, int)  # generations done, of how many
    checked = Signal(object)  # CheckResult, or None (cancelled, or no text)
    historyInfo = Signal(object)  # HistoryInfo, after a history request
    busyChanged = Signal(bool)
    connected = Signal(object)  # RemoteInfo: the chat goes to a remote server (None: to the engine again)
    connectFailed = Signal(str)

    _post = Signal(object)  # engine thread -> GUI thread

    def __init__(
        self,
        client: EngineClient | None = None,
        parent: QObject | None = None,
        turns: TurnQueue | None = None,
    ):
        super().__init__(parent)
        self.client = client or EngineClient(auto_restart=True)
        # the window's jobs take their turns at the engine with the local server's requests
        self.turns = turns or TurnQueue()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._lock = threading.Lock()
        self._buffer: list[Step] = []
        self._wake_pending = False
        self._current: _Job | None = None
        self._holds_turn = False  # the current job holds the engine (a local server's request does not)
        self._stream: Any = None  # the reply being streamed (the engine's or a remote server's)
        self.remote: Any = None  # the RemoteClient the chat uses instead of the engine, or None
        self._queued_generate: _Job | None = None
        self._busy = False
        self._closed = False
        self.on_event: Callable[[object], None] | None = None  # benchmarks: called in the engine thread
        self._post.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._thread = threading.Thread(target=self._run, name="tandem-ui-engine", daemon=True)
        self._thread.start()

    # -- requests (GUI thread) ----------------------------------------------------------------------
    def load(self, settings: LoadSettings) -> None:
        self._submit(_Job("load", settings))

    def generate(self, messages: Sequence[Mapping[str, Any]], settings: GenerationSettings) -> None:
        job = _Job("generate", settings, messages=[dict(m) for m in messages])
        with self._lock:
            self._queued_generate = job
        self._submit(job)

    def calibrate(self) -> None:
        """Measure plain decoding's step cost with a short plain reply (for the speedup estimate)."""
        self._submit(_Job("calibrate"))

    def check(self, prompts: Sequence[str], settings: GenerationSettings) -> None:
        """Does speculation pay here? Plain decoding against ``settings.mode`` on ``prompts``."""
        self._submit(_Job("check", settings, messages=[{"content": p} for p in prompts]))

    def use_remote(self, remote: Any) -> None:
        """Chat with ``remote`` (an ``app.remote_client.RemoteClient``) instead of the engine once it
        answers (``connected`` with its ``connect()``, or ``connectFailed``); None: the engine again."""
        self._submit(_Job("connect", remote))

    def history(self, action: str = "info", documents: Sequence[str] = ()) -> None:
        """Ask about the drafting history (``info``), ``forget`` it, or ``remove`` documents."""
        self._submit(_Job("history", action, messages=[{"content": d} for d in documents]))

    def cancel(self) -> None:
        """Stop the running (or queued) reply or check; the engine finishes the current round."""
        with self._lock:
            for job in (self._current, self._queued_generate):
                if job is not None and job.kind in ("generate", "check"):
                    job.cancelled = True
            stream, current, holds = self._stream, self._current, self._holds_turn
        if stream is not None:
            stream.cancel()
        elif holds and current is not None and current.kind in ("check", "calibrate"):
            self.client.cancel()

    @property
    def busy(self) -> bool:
        return self._busy

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel what runs, stop the engine process and join the engine thread."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        self._jobs.put(_Job("stop"))
        try:
            self.client.shutdown()
        finally:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the engine thread did not stop within %.0f s", timeout)

    def _submit(self, job: _Job) -> None:
        if self._closed:
            raise RuntimeError("the engine worker is shut down")
        self._set_busy(True)
        self._jobs.put(job)

    # -- GUI thread side ----------------------------------------------------------------------------
    @Slot(object)
    def _dispatch(self, item: tuple[str, Any]) -> None:
        kind, value = item
        if kind == "steps":
            with self._lock:
                batch, self._buffer = self._buffer, []
                self._wake_pending = False
            if batch:
                self.steps.emit(batch)
        elif kind == "idle":
            self._set_busy(not self._jobs.empty())
        else:
            getattr(self, kind).emit(*value)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    # -- engine thread ------------------------------------------------------------------------------
    def _emit(self, signal: str, *args: Any) -> None:
        self._post.emit((signal, args))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job.kind == "stop":
                return
            with self._lock:
                self._current = job
                if job is self._queued_generate:
                    self._queued_generate = None
            remote = job.kind == "connect" or (job.kind == "generate" and self.remote is not None)
            try:
                # the engine's jobs wait for their turn; a remote server's do not
                with contextlib.nullcontext() if remote else self.turns.turn(bounded=False):
                    self._holds_turn = not remote
                    getattr(self, f"_do_{job.kind}")(job)
            except Exception:  # a bug: report it, keep the thread alive
                log.exception("engine job %s failed", job.kind)
                self._emit("failed", "internal error (see the log)", False)
            finally:
                with self._lock:
                    self._current = None
                    self._holds_turn = False
                self._post.emit(("idle", None))

    def _do_load(self, job: _Job) -> None:
        settings: LoadSettings = job.payload
        self.remote = None  # loading a pair goes back to the engine
        self._emit("loadStarted", settings)
        try:
            info = self.client.load(settings, progress=lambda stage, f: self._emit("loadProgress", stage, f))
        except Exception as e:
            if not self._closed:
                self._emit("loadFailed", _describe(e))
            return
        self._emit("loaded", info)
        removed = forgotten.documents()
        if removed and settings.history_dir:
            try:
                self.client.history("remove", removed)
            except Exception as e:
                log.warning("removing deleted chats from the drafting history failed: %s", e)

    def _do_generate(self, job: _Job) -> None:
        if job.cancelled:
            self._emit("finished", None)
            return
        try:
            stream = (self.remote or self.client).generate(messages=job.messages, settings=job.payload)
            with self._lock:
                self._stream = stream
            with stream:
                if job.cancelled:
                    stream.cancel()
                for event in stream:
                    if self.on_event is not None:
                        self.on_event(event)
                    if isinstance(event, Step):
                        with self._lock:
                            self._buffer.append(event)
                            wake = not self._wake_pending
                            self._wake_pending = True
                        if wake:
                            self._post.emit(("steps", None))
                    elif isinstance(event, Started):
                        self._emit("started", event)
                    elif isinstance(event, Finished):
                        self._emit("finished", event)
        except EngineCrashedError as e:
            if self._closed:
                return
            self._emit("failed", _describe(e), True)
            self._restart()
        except Exception as e:
            if not self._closed:
                self._emit("failed", _describe(e), False)
        finally:
            with self._lock:
                self._stream = None

    def _do_connect(self, job: _Job) -> None:
        try:
            info = job.payload.connect() if job.payload is not None else None
        except Exception as e:
            if not self._closed:
                self._emit("connectFailed", _describe(e))
            return
        self.remote = job.payload
        self._emit("connected", info)

    def _restart(self) -> None:
        """After a crash: a fresh engine process with the same models, so the next message works."""
        if self.client.settings is None:
            return
        self._emit("loadStarted", self.client.settings)
        try:
            info = self.client.restart(progress=lambda stage, f: self._emit("loadProgress", stage, f))
        except Exception as e:
            if not self._closed:
                self._emit("loadFailed", f"restarting the engine failed: {_describe(e)}")
            return
        if info is not None:
            self._emit("loaded", info)

    def _do_calibrate(self, job: _Job) -> None:
        if self.client.settings is None:
            self._emit("calibrated", [])
            return
        t0 = time.perf_counter()
        steps: list[Step] = []
        settings = GenerationSettings(mode="plain", max_tokens=24)
        try:
            for event in self.client.generate(messages=CALIBRATION_PROMPT, settings=settings):
                if isinstance(event, Step):
                    steps.append(event)
        except Exception as e:  # not worth bothering the user: the estimate just stays unknown
            log.warning("calibrating plain decoding failed: %s", e)
            self._emit("calibrated", [])  # (replies waiting for it go on)
            return
        log.info("calibrated plain decoding in %.2f s", time.perf_counter() - t0)
        self._emit("calibrated", steps)

    def _do_check(self, job: _Job) -> None:
        if self.client.settings is None:
            self._emit("checked", None)
            return
        try:
            result = run_check(
                self.client,
                job.payload,
                [m["content"] for m in job.messages],
                progress=lambda done, total: self._emit("checkProgress", done, total),
                cancelled=lambda: job.cancelled,
            )
        except EngineCrashedError as e:
            if not self._closed:
                self._emit("failed", _describe(e), True)
                self._restart()
            return
        except Exception as e:
            if not self._closed:
                self._emit("failed", _describe(e), False)
            return
        self._emit("checked", result)

    def _do_history(self, job: _Job) -> None:
        documents = [m["content"] for m in job.messages]
        if job.payload == "remove":
            # every tokenizer family keeps its own history: remove from the others when they load
            forgotten.remember(documents)
        if self.client.settings is None:
            return
        try:
            info = self.client.history(job.payload, documents)
        except Exception as e:  # not worth failing a chat over
            log.warning("drafting history request failed: %s", e)
            return
        self._emit("historyInfo", info)


def _describe(e: BaseException) -> str:
    """A readable one-paragraph description of an engine error."""
    text = str(e) or type(e).__name__
    if isinstance(e, EngineCrashedError):
        return f"The engine stopped: {e.what}."
    return text
