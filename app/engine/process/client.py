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
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

from app.engine.chat import ChatTemplateError
from app.engine.errors import (
    ContextFullError,
    DecodeError,
    EngineError,
    IncompatibleDraftError,
    LlamaError,
    ModelLoadError,
    PromptTooLongError,
)
from app.engine.events import Finished, Started, Step
from app.engine.info import EngineInfo, EngineStatus
from app.engine.process.protocol import (
    Crash,
    Done,
    Error,
    Event,
    Generate,
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
from app.engine.sampling import SamplingError
from app.engine.settings import GenerationSettings, LoadSettings
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


# --------------------------------------------------------------------------------------------------
# One host process
# --------------------------------------------------------------------------------------------------

_DEAD = object()  # queued to waiting calls when the host process is gone


def _host_main(*args: Any) -> None:
    """The engine process's entry point. Imported lazily: llama.cpp is loaded in the child only."""
    from app.engine.process.host import main

    main(*args)


class _Host:
    """One engine process: its pipes, cancel flag, log files and reply-routing reader thread."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.dir = tempfile.mkdtemp(prefix="tandem-engine-")
        self.log_path = os.path.join(self.dir, "engine.log")
        self.fault_path = os.path.join(self.dir, "python-traceback.txt")
        child_requests, self.requests = ctx.Pipe(duplex=False)
        self.replies, child_replies = ctx.Pipe(duplex=False)
        self.cancel = ctx.Event()
        self.process = ctx.Process(
            target=_host_main,
            args=(child_requests, child_replies, self.cancel, self.log_path, self.fault_path),
            name="tandem-engine",
            daemon=True,
        )
        self._child_ends = (child_requests, child_replies)
        self.lock = threading.Lock()
        self.proc_lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.pending: dict[int, tuple[queue.Queue[Any], str]] = {}
        self.exit_error: Exception | None = None  # set once the process is gone
        self.crashed = False  # gone without being asked to stop
        self.stopping = False
        self.reader: threading.Thread | None = None
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Start the process and wait until it has imported llama.cpp and says Ready."""
        self.process.start()
        for end in self._child_ends:
            end.close()  # the child's copies stay open there: EOF here now means the child is gone
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.replies.recv() if self.replies.poll(_POLL) else None
            except (EOFError, OSError):
                self.join(5)
                raise self._crash_error("while starting") from None
            if isinstance(msg, Ready):
                break
            if isinstance(msg, Log):
                _relog(msg)
            elif msg is None and not self.is_alive():
                raise self._crash_error("while starting")
            elif time.monotonic() > deadline:
                self.kill()
                raise EngineCrashedError(f"the engine process did not start within {timeout:.0f} s")
        self.reader = threading.Thread(target=self._read, name="tandem-engine-reader", daemon=True)
        self.reader.start()

    def stop(self, timeout: float) -> None:
        """Ask the host to exit; terminate, then kill it if it does not. Never hangs on a dead host."""
        self.stopping = True
        self.cancel.set()
        if self.is_alive():
            try:
                with self.send_lock:
                    self.requests.send(Shutdown())
            except (OSError, ValueError):
                pass
            self.join(timeout)
        self.kill()
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(timeout)
        for conn in (self.requests, self.replies):
            conn.close()
        self._remove_dir()

    # Process.is_alive/join/exitcode all reap with waitpid: serialise them, or two threads racing
    # (this one and the reader) may see ECHILD and a transient "still running".
    def exitcode(self) -> int | None:
        with self.proc_lock:
            return self.process.exitcode if self.process.pid is not None else None

    def is_alive(self) -> bool:
        return self.process.pid is not None and self.exitcode() is None

    def join(self, timeout: float | None) -> int | None:
        """Wait (without holding the lock) for the process to exit; its exit code or None."""
        if self.process.pid is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        wait_for([self.process.sentinel], timeout)
        while True:
            # the sentinel (and our pipe) close slightly before the kernel makes the child reapable
            with self.proc_lock:
                code = self.process.exitcode
                if code is not None:
                    self.process.join(0)  # forget it in multiprocessing's list of children
                    return code
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def kill(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) unless it has exited; reap it."""
        for send in (self.process.terminate, self.process.kill):
            if not self.is_alive():
                return
            with self.proc_lock:
                send()
            self.join(2)
        self.join(None)

    # -- requests -----------------------------------------------------------------------------------
    def submit(self, request: Request, what: str) -> queue.Queue[Any]:
        """Register a reply queue for ``request`` and send it."""
        q: queue.Queue[Any] = queue.Queue()
        with self.lock:
            if self.exit_error is not None:
                raise _copy(self.exit_error)
            self.pending[request.request_id] = (q, what)
        try:
            with self.send_lock:
                self.requests.send(request)
        except (OSError, ValueError):  # the host is dying: the reader thread will report how
            pass
        return q

    def wait(self, q: queue.Queue[Any]) -> Reply:
        """The next reply for a request; raises the crash if the process died meanwhile."""
        while True:
            try:
                msg = q.get(timeout=_POLL * 5)
            except queue.Empty:
                if self.reader is not None and not self.reader.is_alive() and self.exit_error is None:
                    self.exit_error = EngineCrashedError("the engine client's reader thread stopped")
                if self.exit_error is not None and q.empty():
                    raise _copy(self.exit_error) from None
                continue
            if msg is _DEAD:
                assert self.exit_error is not None
                raise _copy(self.exit_error)
            return msg

    def done(self, request_id: int) -> None:
        with self.lock:
            self.pending.pop(request_id, None)

    def call(self, request: Request, what: str) -> Reply:
        """Send ``request`` and wait for its one reply; ``Error`` replies are raised."""
        q = self.submit(request, what)
        try:
            reply = self.wait(q)
        finally:
            self.done(request.request_id)
        if isinstance(reply, Error):
            raise error_from_reply(reply)
        return reply

    # -- the reader thread --------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    if not self.replies.poll(_POLL):
                        if self.is_alive():
                            continue
                        if not self.replies.poll(0):  # nothing left to drain
                            break
                    msg = self.replies.recv()
                except (EOFError, OSError):
                    break
                if isinstance(msg, Log):
                    _relog(msg)
                    continue
                with self.lock:
                    entry = self.pending.get(msg.request_id)
                if entry is not None:
                    entry[0].put(msg)
        finally:
            self._on_exit()

    def _on_exit(self) -> None:
        if self.join(5) is None:  # it closed its pipe but lives on: do not leave it half-alive
            self.kill()
        with self.lock:
            whats = [what for _, what in self.pending.values()]
        if self.stopping and not self.crashed:
            err: Exception = EngineError("the engine process was stopped (shutdown or restart)")
        else:
            self.crashed = True
            err = self._crash_error(whats[0] if whats else "while idle")
            log.error("%s", err)
        with self.lock:
            self.exit_error = err
            queues = [q for q, _ in self.pending.values()]
        for q in queues:
            q.put(_DEAD)

    def _crash_error(self, during: str) -> EngineCrashedError:
        code = self.exitcode()
        tail = _tail(self.log_path)
        name = _signal_name(code)
        if name == "SIGKILL":
            what = f"was killed by SIGKILL {during} (possibly out of memory)"
        elif name == "SIGABRT":
            what = f"aborted (SIGABRT) inside llama.cpp {during}"
        elif name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "ACCESS_VIOLATION", "STACK_OVERFLOW"):
            what = f"crashed ({name}) {during}"
        elif name is not None:
            what = f"was terminated by {name} {during}"
        elif code is None:
            what = f"stopped responding {during}"
        else:
            what = f"exited unexpectedly with code {code} {during}"
        message = summary = f"the engine process (pid {self.process.pid}) {what}"
        if tail:
            message += "; its last log lines:\n  " + "\n  ".join(tail)
        try:
            traceback_text = Path(self.fault_path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            traceback_text = ""
        return EngineCrashedError(message, code, name, tail, traceback_text, summary)


def _relog(msg: Log) -> None:
    logging.getLogger(msg.logger).log(msg.level, "%s", msg.line)


def _copy(err: Exception) -> Exception:
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


def _signal_name(code: int | None) -> str | None:
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


def _tail(path: str, n: int = 6) -> list[str]:
    """The last ``n`` non-empty lines of the host's log file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line.rstrip() for line in lines if line.strip()][-n:]


# --------------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------------


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
        self._host: _Host | None = None
        self._settings: LoadSettings | None = None
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
            host = _Host()
            try:
                host.start(self.start_timeout)
            except BaseException:
                host.stop(self.stop_timeout)
                raise
            self._host = host

    def shutdown(self) -> None:
        """Stop the engine process (cancelling a running generation) and wait for it to exit."""
        with self._lifecycle:
            host, self._host = self._host, None
            self._settings = None
        if host is not None:
            host.stop(self.stop_timeout)

    close = shutdown

    def restart(self, progress: ProgressCallback | None = None) -> EngineInfo | None:
        """Start a fresh engine process and re-load the last loaded settings; returns their info."""
        with self._lifecycle:
            settings = self._settings
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

    def _ready(self, *, reload: bool = True) -> _Host:
        """The running host; starts one if needed, or after a crash (with ``auto_restart``)."""
        with self._lifecycle:
            host = self._host
            if host is None:
                self.start()
            elif host.exit_error is not None:
                err = host.exit_error
                if not self.auto_restart:
                    raise EngineCrashedError(
                        f"the engine process is not running (call restart()): {err}",
                        *(_crash_fields(err)),
                    )
                if isinstance(err, EngineCrashedError):
                    self.last_crash = err
                log.warning("restarting the engine process after: %s", err)
                settings = self._settings
                self.start()
                if reload and settings is not None:
                    self.load(settings)
            assert self._host is not None
            return self._host

    def _remember_crash(self, host: _Host) -> None:
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
        self._settings = None  # the host frees the old pair first
        rid = self._request_id()
        q = host.submit(Load(settings, request_id=rid), "while loading the model")
        try:
            while True:
                reply = self._wait(host, q)
                if isinstance(reply, LoadProgress):
                    if progress is not None:
                        try:
                            progress(reply.stage, reply.fraction)
                        except Exception:
                            log.exception("load progress callback failed")
                elif isinstance(reply, Loaded):
                    self._settings = settings
                    return reply.info
                elif isinstance(reply, Error):
                    raise error_from_reply(reply)
        finally:
            host.done(rid)

    def generate(
        self,
        prompt: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        settings: GenerationSettings | None = None,
    ) -> GenerationStream:
        """Stream a reply to ``prompt`` (token ids) or ``messages`` (a chat the host renders).

        Yields Started, Steps, then Finished. Closing the stream early cancels the request.
        """
        if (prompt is None) == (messages is None):
            raise EngineError("give either a prompt (token ids) or chat messages")
        if not self._generation.acquire(blocking=False):
            raise EngineError("a generation is already running on this engine: cancel it or let it finish")
        try:
            host = self._ready()
            host.cancel.clear()
            rid = self._request_id()
            request = Generate(
                prompt=list(prompt) if prompt is not None else None,
                messages=[dict(m) for m in messages] if messages is not None else None,
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

    def info(self) -> EngineStatus:
        """What is loaded, where, and how big (answered even while a reply is being generated)."""
        host = self._ready()
        reply = self._call(host, Info(request_id=self._request_id()), "while answering info")
        assert isinstance(reply, InfoReply)
        return reply.info

    def unload(self) -> None:
        """Free the loaded models (the process keeps running)."""
        self._refuse_while_generating("unload the model")
        host = self._ready(reload=False)
        reply = self._call(host, Unload(request_id=self._request_id()), "while unloading")
        assert isinstance(reply, Done)
        self._settings = None

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

    def _wait(self, host: _Host, q: queue.Queue[Any]) -> Reply:
        try:
            return host.wait(q)
        except EngineCrashedError:
            self._remember_crash(host)
            raise

    def _call(self, host: _Host, request: Request, what: str) -> Reply:
        try:
            return host.call(request, what)
        except EngineCrashedError:
            self._remember_crash(host)
            raise


def _crash_fields(err: Exception) -> tuple[Any, ...]:
    if isinstance(err, EngineCrashedError):
        return (err.exitcode, err.signal_name, err.log_tail, err.python_traceback, err.what)
    return ()


class GenerationStream(Iterator[Started | Step | Finished]):
    """The events of one generation. ``close()`` (or leaving a ``with`` block) cancels and drains it."""

    def __init__(self, client: EngineClient, host: _Host, request_id: int, q: queue.Queue[Any]):
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
