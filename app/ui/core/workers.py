"""The engine thread: one Python thread runs every blocking ``EngineClient`` call, in order.

:class:`EngineWorker` is a QObject living in the GUI thread. Jobs, one type for each kind of work
(`LoadJob`, `GenerateJob`, `CalibrateJob`, `CheckJob`, `ConnectJob`, `HistoryJob`), run on its thread;
everything they report crosses back through one queued signal as (the worker's signal, its arguments) and
is emitted from the GUI thread, so every public signal is delivered in the GUI thread. Step events are
coalesced: the engine thread appends them to a buffer and posts at most one wake-up until the GUI has
drained it, so a fast model cannot flood the event loop. Cancelling stops the worker's own reply (thread-
safe; the engine stops within one round), never killing a thread, nor a request of the local server's
that holds the engine.

The chat can go to a remote server instead (``use_remote``: an ``app.remote_client.RemoteClient``, which
streams the same events); loading a pair goes back to the engine.
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

from PySide6.QtCore import QObject, Qt, Signal, SignalInstance, Slot

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
_STEPS = object()  # posted: steps wait in the buffer
_IDLE = object()  # posted: a job ended


@dataclass(kw_only=True)
class _Job:
    """One piece of work for the engine thread; ``cancelled`` is set from the GUI thread."""

    cancelled: bool = False


@dataclass(kw_only=True)
class LoadJob(_Job):
    settings: LoadSettings


@dataclass(kw_only=True)
class GenerateJob(_Job):
    messages: list[dict[str, Any]]
    settings: GenerationSettings


@dataclass(kw_only=True)
class CalibrateJob(_Job):
    pass


@dataclass(kw_only=True)
class CheckJob(_Job):
    prompts: list[str]
    settings: GenerationSettings


@dataclass(kw_only=True)
class ConnectJob(_Job):
    remote: Any  # an app.remote_client.RemoteClient, or None: the engine again


@dataclass(kw_only=True)
class HistoryJob(_Job):
    action: str  # info | forget | remove
    documents: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class StopJob(_Job):
    pass


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

    _post = Signal(object)  # engine thread -> GUI thread: (signal, args), _STEPS or _IDLE

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
        self._submit(LoadJob(settings=settings))

    def generate(self, messages: Sequence[Mapping[str, Any]], settings: GenerationSettings) -> None:
        job = GenerateJob(messages=[dict(m) for m in messages], settings=settings)
        with self._lock:
            self._queued_generate = job
        self._submit(job)

    def calibrate(self) -> None:
        """Measure plain decoding's step cost with a short plain reply (for the speedup estimate)."""
        self._submit(CalibrateJob())

    def check(self, prompts: Sequence[str], settings: GenerationSettings) -> None:
        """Does speculation pay here? Plain decoding against ``settings.mode`` on ``prompts``."""
        self._submit(CheckJob(prompts=list(prompts), settings=settings))

    def use_remote(self, remote: Any) -> None:
        """Chat with ``remote`` (an ``app.remote_client.RemoteClient``) instead of the engine once it
        answers (``connected`` with its ``connect()``, or ``connectFailed``); None: the engine again."""
        self._submit(ConnectJob(remote=remote))

    def history(self, action: str = "info", documents: Sequence[str] = ()) -> None:
        """Ask about the drafting history (``info``), ``forget`` it, or ``remove`` documents."""
        self._submit(HistoryJob(action=action, documents=list(documents)))

    def cancel(self) -> None:
        """Stop the running (or queued) reply or check; the engine finishes the current round."""
        with self._lock:
            for job in (self._current, self._queued_generate):
                if isinstance(job, GenerateJob | CheckJob):
                    job.cancelled = True
            stream, current, holds = self._stream, self._current, self._holds_turn
        if stream is not None:
            stream.cancel()
        elif holds and isinstance(current, CheckJob | CalibrateJob):
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
        self._jobs.put(StopJob())
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
    def _dispatch(self, item: object) -> None:
        if item is _STEPS:
            with self._lock:
                batch, self._buffer = self._buffer, []
                self._wake_pending = False
            if batch:
                self.steps.emit(batch)
        elif item is _IDLE:
            self._set_busy(not self._jobs.empty())
        else:
            signal, args = item  # type: ignore[misc]
            signal.emit(*args)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    # -- engine thread ------------------------------------------------------------------------------
    def _emit(self, signal: SignalInstance, *args: Any) -> None:
        """Emit ``signal`` (one of this worker's) with ``args`` in the GUI thread."""
        self._post.emit((signal, args))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if isinstance(job, StopJob):
                return
            with self._lock:
                self._current = job
                if job is self._queued_generate:
                    self._queued_generate = None
            remote = isinstance(job, ConnectJob) or (isinstance(job, GenerateJob) and self.remote is not None)
            try:
                # the engine's jobs wait for their turn; a remote server's do not
                with contextlib.nullcontext() if remote else self.turns.turn(bounded=False):
                    self._holds_turn = not remote
                    self._do(job)
            except Exception:  # a bug: report it, keep the thread alive
                log.exception("engine job %s failed", type(job).__name__)
                self._emit(self.failed, "internal error (see the log)", False)
            finally:
                with self._lock:
                    self._current = None
                    self._holds_turn = False
                self._post.emit(_IDLE)

    def _do(self, job: _Job) -> None:
        match job:
            case LoadJob():
                self._load(job)
            case GenerateJob():
                self._generate(job)
            case CalibrateJob():
                self._calibrate()
            case CheckJob():
                self._check(job)
            case ConnectJob():
                self._connect(job)
            case HistoryJob():
                self._history(job)

    def _load(self, job: LoadJob) -> None:
        settings = job.settings
        self.remote = None  # loading a pair goes back to the engine
        self._emit(self.loadStarted, settings)
        try:
            info = self.client.load(
                settings, progress=lambda stage, f: self._emit(self.loadProgress, stage, f)
            )
        except Exception as e:
            if not self._closed:
                self._emit(self.loadFailed, _describe(e))
            return
        self._emit(self.loaded, info)
        removed = forgotten.documents()
        if removed and settings.history_dir:
            try:
                self.client.history("remove", removed)
            except Exception as e:
                log.warning("removing deleted chats from the drafting history failed: %s", e)

    def _generate(self, job: GenerateJob) -> None:
        if job.cancelled:
            self._emit(self.finished, None)
            return
        try:
            stream = (self.remote or self.client).generate(messages=job.messages, settings=job.settings)
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
                            self._post.emit(_STEPS)
                    elif isinstance(event, Started):
                        self._emit(self.started, event)
                    elif isinstance(event, Finished):
                        self._emit(self.finished, event)
        except EngineCrashedError as e:
            if self._closed:
                return
            self._emit(self.failed, _describe(e), True)
            self._restart()
        except Exception as e:
            if not self._closed:
                self._emit(self.failed, _describe(e), False)
        finally:
            with self._lock:
                self._stream = None

    def _connect(self, job: ConnectJob) -> None:
        try:
            info = job.remote.connect() if job.remote is not None else None
        except Exception as e:
            if not self._closed:
                self._emit(self.connectFailed, _describe(e))
            return
        self.remote = job.remote
        self._emit(self.connected, info)

    def _restart(self) -> None:
        """After a crash: a fresh engine process with the same models, so the next message works."""
        if self.client.settings is None:
            return
        self._emit(self.loadStarted, self.client.settings)
        try:
            info = self.client.restart(progress=lambda stage, f: self._emit(self.loadProgress, stage, f))
        except Exception as e:
            if not self._closed:
                self._emit(self.loadFailed, f"restarting the engine failed: {_describe(e)}")
            return
        if info is not None:
            self._emit(self.loaded, info)

    def _calibrate(self) -> None:
        if self.client.settings is None:
            self._emit(self.calibrated, [])
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
            self._emit(self.calibrated, [])  # (replies waiting for it go on)
            return
        log.info("calibrated plain decoding in %.2f s", time.perf_counter() - t0)
        self._emit(self.calibrated, steps)

    def _check(self, job: CheckJob) -> None:
        if self.client.settings is None:
            self._emit(self.checked, None)
            return
        try:
            result = run_check(
                self.client,
                job.settings,
                job.prompts,
                progress=lambda done, total: self._emit(self.checkProgress, done, total),
                cancelled=lambda: job.cancelled,
            )
        except EngineCrashedError as e:
            if not self._closed:
                self._emit(self.failed, _describe(e), True)
                self._restart()
            return
        except Exception as e:
            if not self._closed:
                self._emit(self.failed, _describe(e), False)
            return
        self._emit(self.checked, result)

    def _history(self, job: HistoryJob) -> None:
        documents = job.documents
        if job.action == "remove":
            # every tokenizer family keeps its own history: remove from the others when they load
            forgotten.remember(documents)
        if self.client.settings is None:
            return
        try:
            info = self.client.history(job.action, documents)
        except Exception as e:  # not worth failing a chat over
            log.warning("drafting history request failed: %s", e)
            return
        self._emit(self.historyInfo, info)


def _describe(e: BaseException) -> str:
    """A readable one-paragraph description of an engine error."""
    text = str(e) or type(e).__name__
    if isinstance(e, EngineCrashedError):
        return f"The engine stopped: {e.what}."
    return text
