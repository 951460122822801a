"""The app's local API: the pair the window has loaded, served through the same OpenAI-compatible API as
``tandem serve`` (`app.server`), on 127.0.0.1 at the port of the app's settings (8080 by default).

`LocalServer` holds the *Server* menu with a checkable *Serve the loaded pair (local API)* action, an
indicator for the status bar (the window places both) and a dialog with the base URL, the model id and
examples to copy (`app.ui.server.server_dialog`). uvicorn runs on a thread of its own over the session's
``EngineClient`` and the worker's ``TurnQueue``, so
the window's chat and API requests take turns at the engine; requests get 503 while no pair is loaded
or one loads. The GUI thread never waits for it: the port is claimed at once (a taken port is said
so), the server's start and stop are followed by a timer. The window stops it when it closes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QToolButton, QWidget

from app.engine import Mode
from app.ui.core.session import Session

if TYPE_CHECKING:
    from app.ui.server.server_dialog import ServerDialog

log = logging.getLogger("tandem.ui")

__all__ = ["HOST", "LocalServer", "bind_socket", "port_problem"]

HOST = "127.0.0.1"
POLL_MS = 50
STOP_WAIT = 5.0  # seconds the window's shutdown waits for the server to stop
INDICATOR_STYLE = {
    "on": "color: #116329; font-weight: 600;",
    "failed": "color: #a40e26;",
}


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (raises OSError when the port is taken). A port a stopped
    server left in TIME_WAIT is free to use again; on Windows no other socket may share it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if os.name == "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def port_problem(port: int, e: OSError) -> str:
    """Why the server cannot listen on ``port``, for the user."""
    in_use = {errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", errno.EADDRINUSE)}
    # Windows answers EACCES for a port another program holds exclusively
    if e.errno in in_use or (e.errno == errno.EACCES and port >= 1024):
        return (
            f"Port {port} is taken: another program (perhaps tandem serve or another Tandem window) "
            "listens there. Choose another port."
        )
    if e.errno == errno.EACCES:
        return f"Port {port} needs administrator rights: choose a port from 1024 up."
    return f"Cannot listen on {HOST}:{port}: {e.strerror or e}."


class LocalServer(QObject):
    """The Server menu's switch, the status bar's indicator and the uvicorn server they control."""

    stateChanged = Signal(str)  # off | starting | on | stopping | failed

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.parent_widget = parent  # the dialog's
        self.state = "off"
        self.error = ""
        self.port = session.settings.server_port  # the running server's (the setting may change meanwhile)
        self._run: _Run | None = None
        self._thread: threading.Thread | None = None
        self.dialog: ServerDialog | None = None
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._follow)

        self.menu = QMenu("Se&rver", parent)
        self.action = QAction("&Serve the loaded pair (local API)", self)
        self.action.setCheckable(True)
        self.action.setToolTip(f"The OpenAI-compatible API on {HOST}, over the pair this window has loaded")
        self.action.toggled.connect(self.set_on)
        self.menu.addAction(self.action)
        self.details_action = QAction("Local API &address and examples…", self)
        self.details_action.triggered.connect(lambda _=False: self.show_dialog())
        self.menu.addAction(self.details_action)

        self.indicator = QToolButton()
        self.indicator.setObjectName("apiIndicator")
        self.indicator.setAutoRaise(True)
        self.indicator.clicked.connect(lambda _=False: self.show_dialog())
        session.pairLoaded.connect(self._on_model_loaded)
        self._show_state()

    # -- what it serves (also read from the server's threads) ---------------------------------------
    @property
    def served(self) -> Any:
        """The ``app.server.served.Served`` of the running server (None before it is built)."""
        return self._run.served if self._run is not None else None

    def _on_model_loaded(self, _info: object) -> None:
        self.sync()

    def ready(self) -> bool:
        """A pair is loaded and none is loading (else requests get 503); the served names follow it."""
        s = self.session
        if s.shut_down or s.loading or s.engine_info is None:
            return False
        self.sync()
        return True

    def sync(self) -> None:
        """The served model's id, context size and mode from the window's pair and settings."""
        served, info = self.served, self.session.engine_info
        if served is None or info is None:
            return
        mode = self.session.settings.mode
        served.model_path = info.target.path
        served.n_ctx = info.n_ctx
        served.mode = Mode.AUTO if mode is Mode.SPECULATIVE and info.draft is None else mode
        served.history = self.session.settings.keep_history  # requests join the drafting history too

    @property
    def model_id(self) -> str:
        """The model id clients send: the target file's name without .gguf ("" before a pair is loaded),
        as `app.server.served.Served` names it."""
        info = self.session.engine_info
        return Path(info.target.path).stem if info is not None else ""

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    # -- on and off ---------------------------------------------------------------------------------
    def set_on(self, on: bool) -> None:
        """Start or stop serving (returns at once; ``stateChanged`` follows)."""
        if on and self.state in ("off", "failed"):
            self.start()
        elif not on and self.state in ("starting", "on"):
            self.stop()

    def start(self) -> None:
        """Claim the port (a taken one fails at once) and start the server's thread."""
        port = self.port = self.session.settings.server_port
        try:
            sock = bind_socket(HOST, port)
        except OSError as e:
            self._fail(port_problem(port, e))
            return
        s = self.session
        self._run = _Run(sock, port, s.client, s.worker.turns, self.ready, self.sync)
        self._thread = threading.Thread(target=self._run.serve, name="tandem-ui-api", daemon=True)
        self.error = ""
        self._set_state("starting")
        self._thread.start()
        self._poll.start()

    def stop(self) -> None:
        """Ask the server to stop (requests in flight get two seconds); ``stateChanged("off")`` follows."""
        if self._run is None:
            return
        self._run.stop()
        self._set_state("stopping")
        self._poll.start()

    def shutdown(self, timeout: float = STOP_WAIT) -> None:
        """Stop the server and wait for it (the window is closing)."""
        self._poll.stop()
        if self._run is not None:
            self._run.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the local API server did not stop within %.0f s", timeout)
        self._run = self._thread = None
        self.state = "off"

    def _follow(self) -> None:
        """The timer: has the server started, stopped, or died?"""
        run, thread = self._run, self._thread
        alive = thread is not None and thread.is_alive()
        if self.state == "starting" and run is not None and run.started and alive:
            self._set_state("on")
            what = self.model_id or "the loaded pair"
            self.session.notify(f"Serving {what} at {self.base_url}", 8000)
        elif self.state in ("starting", "on") and not alive:
            error = run.error if run is not None else ""
            self._run = self._thread = None
            self._fail(f"The local API server stopped: {error or 'see the log'}.")
        elif self.state == "stopping" and not alive:
            self._run = self._thread = None
            self._set_state("off")
        if self.state not in ("starting", "stopping"):
            self._poll.stop()

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_state("failed")
        self.session.notify(message, 15000)

    def _set_state(self, state: str) -> None:
        self.state = state
        with contextlib.suppress(RuntimeError):  # the window is gone
            self._show_state()
            self.stateChanged.emit(state)

    # -- views --------------------------------------------------------------------------------------
    def _show_state(self) -> None:
        on = self.state in ("starting", "on")
        if self.action.isChecked() != on:
            self.action.blockSignals(True)
            self.action.setChecked(on)
            self.action.blockSignals(False)
        text = {
            "off": "API off",
            "starting": "API starting…",
            "on": f"API on · {HOST}:{self.port}",
            "stopping": "API stopping…",
            "failed": "API off (failed)",
        }[self.state]
        self.indicator.setText(text)
        self.indicator.setStyleSheet(INDICATOR_STYLE.get(self.state, "color: #57606a;"))
        tip = (
            f"The loaded pair is served at {self.base_url} (click for examples)"
            if self.state == "on"
            else (self.error or "The local API is off (click to switch it on)")
        )
        self.indicator.setToolTip(tip)

    def show_dialog(self) -> ServerDialog:
        """Open (or raise) the dialog with the switch, the port, the URL and examples to copy."""
        from app.ui.server.server_dialog import ServerDialog

        if self.dialog is None:
            self.dialog = ServerDialog(self, self.session, self.parent_widget)
            self.dialog.finished.connect(lambda _r: setattr(self, "dialog", None))
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog


class _Run:
    """One run of the server, on its own thread: builds the API there with `app.server.serving`, as
    ``tandem serve`` does (importing FastAPI and uvicorn takes a second or two the GUI thread must not
    wait), and serves on the socket already claimed."""

    def __init__(
        self,
        sock: socket.socket,
        port: int,
        client: Any,
        turns: Any,
        ready: Callable[[], bool],
        sync: Callable[[], None],
    ) -> None:
        self.sock, self.port, self.client, self.turns = sock, port, client, turns
        self.ready, self.sync = ready, sync
        self.served: Any = None  # app.server.served.Served
        self.server: Any = None  # uvicorn.Server
        self.error = ""
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self.server is not None and bool(self.server.started)

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            if self.server is not None:
                self.server.should_exit = True

    def serve(self) -> None:
        try:
            from app.server.serving import api_server

            api = api_server(
                self.client,
                HOST,
                self.port,
                turns=self.turns,
                ready=self.ready,
                log_config=None,
                graceful_s=2,
            )
            self.served = api.served
            self.sync()  # the served names, context size, mode and history from the session
            with self._lock:
                if self._stopping.is_set():
                    return
                self.server = api.server
            api.run(self.sock)
        except BaseException as e:  # uvicorn exits (SystemExit) when it cannot start
            self.error = f"{type(e).__name__}: {e}"
            log.exception("the local API server stopped")
        finally:
            self.sock.close()
