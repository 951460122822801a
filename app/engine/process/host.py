"""The engine host: the child process that owns the :class:`Engine` (and so every llama.cpp handle).

Started by :class:`~app.engine.process.client.EngineClient` with the multiprocessing *spawn* context;
the entry point :func:`main` is a top-level function so it also works in a frozen (PyInstaller) app. A native
crash here (GGML_ASSERT -> abort, a segfault, the OOM killer) kills only this process.

The host serves one request at a time from the request pipe. While it generates, it polls the pipe
between rounds, so Info, Tokenize and Shutdown are still answered; cancellation is a shared
``multiprocessing.Event`` the engine checks between rounds. Its stdout/stderr (llama.cpp's log, ggml's
abort message) go to a log file the client reads the tail of when the process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import IO, Any

from app import __version__
from app.engine import llama
from app.engine.engine import Engine, EngineError
from app.engine.errors import PromptTooLongError
from app.engine.events import Finished, FinishReason, StatsBuilder
from app.engine.info import EngineStatus, HistoryInfo
from app.engine.process.protocol import (
    CRASH_KINDS,
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
    Log,
    Ready,
    Reply,
    Request,
    Shutdown,
    Tokenize,
    Tokens,
    Unload,
)
from app.engine.prompt import TokenizeCancelled, TooManyTokens

log = logging.getLogger("tandem.host")

POLL_WHILE_TOKENIZING = 0.05  # seconds between looks at the request pipe while a prompt is tokenized

_fault_file: IO[str] | None = None  # kept open for faulthandler for the life of the process


def main(
    requests: Connection,
    replies: Connection,
    cancel: Any,
    log_path: str | None = None,
    fault_path: str | None = None,
) -> None:
    """Process entry point: serve requests until Shutdown or until the client goes away."""
    global _fault_file
    debug = bool(os.environ.get("TANDEM_DEBUG"))
    # The parent's terminal delivers Ctrl-C to the whole process group: cancelling is the client's job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not debug:
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # ggml would attach gdb: slow, noisy
        if log_path:
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 2)
            os.dup2(fd, 1)
            os.close(fd)
    if fault_path:
        _fault_file = open(fault_path, "w", encoding="utf-8")  # noqa: SIM115 -- lives with the process
        faulthandler.enable(file=_fault_file)
    host = Host(requests, replies, cancel)
    handler = logging.StreamHandler()  # stderr: the log file (or the terminal with TANDEM_DEBUG)
    handler.setFormatter(logging.Formatter("%(message)s"))
    forward = _ForwardHandler(host)
    forward.setLevel(logging.INFO)
    root = logging.getLogger("tandem")
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    root.addHandler(forward)
    llama.init_backend()
    host.serve()


class _ForwardHandler(logging.Handler):
    """Sends log records to the client, which re-emits them into its own ``logging``."""

    def __init__(self, host: Host):
        super().__init__()
        self.host = host

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # the client is gone: the log file still has the line
            self.host.send(Log(record.levelno, record.getMessage(), record.name))


class Host:
    """Owns one :class:`Engine` and answers :mod:`~app.engine.process.protocol` requests."""

    def __init__(self, requests: Connection, replies: Connection, cancel: Any):
        self.requests = requests
        self.replies = replies
        self.cancel = cancel
        self.engine: Engine | None = None
        self.generating = False
        self.stopping = False
        self._send_lock = threading.Lock()

    def send(self, reply: Reply) -> None:
        with self._send_lock:
            self.replies.send(reply)

    def serve(self) -> None:
        self.send(Ready(os.getpid(), __version__))
        try:
            while not self.stopping:
                try:
                    request = self.requests.recv()
                except (EOFError, OSError):
                    break  # the client closed the pipe or died
                self.handle(request)
        finally:
            self._close_engine()

    def poll_requests(self) -> None:
        """Handle requests that arrived meanwhile (called between generation rounds)."""
        try:
            while not self.stopping and self.requests.poll():
                self.handle(self.requests.recv())
        except (EOFError, OSError):
            self.stopping = True
            self.cancel.set()

    def handle(self, request: Request) -> None:
        """Run one request; an exception becomes an ``Error`` reply and the host keeps serving."""
        try:
            if isinstance(request, Generate):
                self._generate(request)
            elif isinstance(request, Load):
                self._load(request)
            elif isinstance(request, Tokenize):
                self._tokenize(request)
            elif isinstance(request, Info):
                self.send(InfoReply(self._status(), request_id=request.request_id))
            elif isinstance(request, Gap):
                self._refuse_while_generating("compare logits")
                gap = self._need_engine().top2_gap(list(request.tokens))
                self.send(GapReply(gap, request_id=request.request_id))
            elif isinstance(request, History):
                self._history(request)
            elif isinstance(request, Unload):
                self._refuse_while_generating("unload the model")
                self._close_engine()
                self.send(Done(request_id=request.request_id))
            elif isinstance(request, Shutdown):
                self.stopping = True
                self.cancel.set()  # a running generation ends after its current round
                self.send(Done(request_id=request.request_id))
            elif isinstance(request, Crash):
                crash(request.kind)
            else:
                raise EngineError(f"unknown request {type(request).__name__}")
        except Exception as e:
            log.debug("[host] %s failed: %s: %s", type(request).__name__, type(e).__name__, e)
            self.send(
                Error(
                    type(e).__name__,
                    str(e),
                    traceback.format_exc(),
                    request_id=getattr(request, "request_id", 0),
                )
            )

    # -- requests -----------------------------------------------------------------------------------
    def _need_engine(self) -> Engine:
        if self.engine is None:
            raise EngineError("no model is loaded: load one first")
        return self.engine

    def _refuse_while_generating(self, what: str) -> None:
        if self.generating:
            raise EngineError(f"cannot {what} while a reply is being generated: cancel it first")

    def _load(self, request: Load) -> None:
        self._refuse_while_generating("load a model")
        self._close_engine()  # free the old pair before loading the new one
        last: dict[str, float] = {}

        def progress(stage: str, fraction: float) -> None:
            prev = last.get(stage, -1.0)
            if fraction >= 1.0 or fraction - prev >= 0.01:  # at most ~100 messages per model
                last[stage] = fraction
                self.send(LoadProgress(stage, min(1.0, fraction), request_id=request.request_id))

        self.engine = Engine(request.settings, progress=progress)
        for stage in ("target", "draft") if request.settings.draft else ("target",):
            if last.get(stage, 0.0) < 1.0:  # llama.cpp may stop short of 1.0: end each stage there
                self.send(LoadProgress(stage, 1.0, request_id=request.request_id))
        self.send(Loaded(self.engine.info(), request_id=request.request_id))

    def _generate(self, request: Generate) -> None:
        if self.generating:
            raise EngineError("a generation is already running in the engine process")
        engine = self._need_engine()
        self.generating = True
        try:
            try:
                prompt = self._prompt(engine, request)
            except TokenizeCancelled:
                prompt = None
            if prompt is None or self.cancel.is_set():  # the client has gone: no prompt evaluation
                stats = StatsBuilder(mode=request.settings.mode).build(0.0)
                fin = Finished(FinishReason.CANCELLED, "", (), stats)
                self.send(Event(fin, request_id=request.request_id))
                return
            for event in engine.generate(prompt, request.settings, cancel=self.cancel.is_set):
                self.send(Event(event, request_id=request.request_id))
                if not isinstance(event, Finished):  # after Finished the client may send the next one
                    self.poll_requests()
        finally:
            self.generating = False

    def _prompt(self, engine: Engine, request: Generate) -> list[int]:
        """The request's prompt tokens: tokenized here between checks of the cancel flag (and answering
        Info and Shutdown meanwhile), stopped as soon as it cannot fit the context; token ids given by
        the client checked against the vocabulary."""
        n_ctx = engine.n_ctx
        limit = max(1, n_ctx - 1)
        last_poll = time.monotonic()

        def cancelled() -> bool:
            nonlocal last_poll
            if time.monotonic() - last_poll > POLL_WHILE_TOKENIZING:
                self.poll_requests()
                last_poll = time.monotonic()
            return self.cancel.is_set()

        try:
            if request.messages is not None:
                return engine.chat_prompt(request.messages, cancel=cancelled, limit=limit)
            if request.text is not None:
                return engine.tokenize(request.text, cancel=cancelled, limit=limit)
        except TooManyTokens:
            raise PromptTooLongError(
                f"the prompt has more than {limit} tokens but the context holds {n_ctx}: "
                "shorten it, start a new chat, or load the model with a larger context"
            ) from None
        if request.prompt is None:
            raise EngineError("a generation needs a prompt, a text or chat messages")
        prompt = list(request.prompt)
        check_token_ids(prompt, engine.target.n_vocab)
        return prompt

    def _tokenize(self, request: Tokenize) -> None:
        engine = self._need_engine()
        if request.messages is not None:
            tokens = engine.chat_prompt(request.messages)
        elif request.chat:
            tokens = engine.chat_prompt([{"role": "user", "content": request.text}])
        else:
            tokens = engine.tokenize(request.text)
        self.send(Tokens(tokens, engine.n_ctx, request_id=request.request_id))

    def _status(self) -> EngineStatus:
        engine = self.engine.info() if self.engine is not None else None
        backend = engine.backend if engine is not None else llama.backend_name()
        devices = tuple(llama.devices())
        return EngineStatus(
            os.getpid(), self.generating, backend, engine, devices, llama.supports_gpu_offload()
        )

    def _history(self, request: History) -> None:
        engine = self.engine
        if request.action != "info":
            self._refuse_while_generating("change the drafting history")
        if engine is None:
            info = HistoryInfo(False)
        elif request.action == "forget":
            info = engine.forget_history()
        elif request.action == "remove":
            info = engine.remove_history(request.documents)
        elif request.action == "info":
            info = engine.history_info()
        else:
            raise EngineError(f"unknown history action {request.action!r}")
        self.send(HistoryReply(info, request_id=request.request_id))

    def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


def check_token_ids(tokens: list[int], n_vocab: int) -> None:
    """Refuse a prompt with a token id outside the vocabulary (llama.cpp would fail to decode it, or
    overflow converting it), naming the first."""
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab:
            raise EngineError(
                f"prompt[{i}] = {t!r} is not a token id: the vocabulary has ids 0 to {n_vocab - 1}"
            )


def crash(kind: str) -> None:
    """Tests only: die like a native crash would."""
    if kind not in CRASH_KINDS:
        raise EngineError(f"unknown crash kind {kind!r}: choose one of {', '.join(CRASH_KINDS)}")
    log.warning("[host] crashing on request (%s)", kind)
    for handler in logging.getLogger("tandem").handlers:
        handler.flush()
    if kind == "abort":
        llama.force_abort("forced abort requested by a test")
    elif kind == "segfault":
        ctypes.string_at(0)
    os._exit(7)
