"""One engine host process as the client holds it: start, stop, the reply pipe's reader thread, and
what a crash looked like."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

from app.engine.errors import (
    EngineError,
)
from app.engine.process.errors import EngineCrashedError, copy_error, error_from_reply, signal_name
from app.engine.process.protocol import (
    Error,
    Log,
    Ready,
    Reply,
    Request,
    Shutdown,
)

log = logging.getLogger("tandem.client")
# llama.cpp's log lines come up from the host as records of "tandem.llama": they are for the log file and
# error messages, never for stderr through logging's last resort (TANDEM_DEBUG=1 has the host itself
# write them to the terminal)
logging.getLogger("tandem.llama").addHandler(logging.NullHandler())

ProgressCallback = Callable[[str, float], None]
_POLL = 0.2  # seconds between liveness checks while waiting


_DEAD = object()  # queued to waiting calls when the host process is gone


def _host_main(*args: Any) -> None:
    """The engine process's entry point. Imported lazily: llama.cpp is loaded in the child only."""
    from app.engine.process.host import main

    main(*args)


class CancelFlag:
    """A flag both processes see, without a lock: a ``multiprocessing.Event`` has one, and a host
    killed while holding it (SIGKILL between rounds, as it reads the flag) would hang the client's
    next ``set`` for good."""

    def __init__(self, ctx: Any):
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        return bool(self._value.value)


class HostHandle:
    """One engine process: its pipes, cancel flag, log files and reply-routing reader thread."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.dir = tempfile.mkdtemp(prefix="tandem-engine-")
        self.log_path = os.path.join(self.dir, "engine.log")
        self.fault_path = os.path.join(self.dir, "python-traceback.txt")
        child_requests, self.requests = ctx.Pipe(duplex=False)
        self.replies, child_replies = ctx.Pipe(duplex=False)
        self.cancel = CancelFlag(ctx)
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
                raise copy_error(self.exit_error)
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
                    raise copy_error(self.exit_error) from None
                continue
            if msg is _DEAD:
                assert self.exit_error is not None
                raise copy_error(self.exit_error)
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
        if self.stopping and not self.crashed:
            err: Exception = EngineError("the engine process was stopped (shutdown or restart)")
        else:
            self.crashed = True
            err = self._crash_error(self._doing())
            log.error("%s", err)
        with self.lock:
            self.exit_error = err
            queues = [q for q, _ in self.pending.values()]
        for q in queues:
            q.put(_DEAD)

    def gone_error(self) -> Exception | None:
        """Why the process is gone: its exit error, or, in the moment between its exit and the reader
        thread noticing it, what its exit code says (None while it runs or after a clean stop)."""
        if self.exit_error is not None or self.stopping or self.is_alive():
            return self.exit_error
        if self.process.pid is None:
            return None
        return self._crash_error(self._doing())

    def _doing(self) -> str:
        """What the process was doing: the first call in flight, or "while idle"."""
        with self.lock:
            whats = [what for _, what in self.pending.values()]
        return whats[0] if whats else "while idle"

    def _crash_error(self, during: str) -> EngineCrashedError:
        code = self.exitcode()
        tail = _tail(self.log_path)
        name = signal_name(code)
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
