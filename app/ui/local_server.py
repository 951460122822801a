"""The app's local API: the pair the window has loaded, served through the same OpenAI-compatible API as
``tandem serve`` (`app.server`), on 127.0.0.1 at the port of the app's settings (8080 by default).

`LocalServer` adds a checkable *Server › Serve the loaded pair (local API)* action, an indicator in the
status bar and a dialog with the base URL, the model id and examples to copy (`app.ui.server_dialog`).
uvicorn runs on a thread of its own over the window's ``EngineClient`` and the worker's ``TurnQueue``, so
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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QToolButton

if TYPE_CHECKING:
    from app.ui.main_window import MainWindow
    from app.ui.server_dialog import ServerDialog

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

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.state = "off"
        self.error = ""
        self.port = window.settings.server_port  # the running server's (the setting may change meanwhile)
        self.served: Any = None  # app.server.served.Served while it runs
        self._server: Any = None  # uvicorn.Server
        self._thread: threading.Thread | None = None
        self.dialog: ServerDialog | None = None
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._follow)

        self.menu = QMenu("Se&rver", window)
        bar = window.menuBar()
        help_menu = bar.actions()[-1] if bar.actions() else None
        bar.insertMenu(help_menu, self.menu) if help_menu is not None else bar.addMenu(self.menu)
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
        window.status.addPermanentWidget(self.indicator)
        window.modelLoaded.connect(lambda _info: self.sync())
        self._show_state()

    # -- what it serves (also read from the server's threads) ---------------------------------------
    def ready(self) -> bool:
        """A pair is loaded and none is loading (else requests get 503); the served names follow it."""
        w = self.window
        if w.shut_down or w.loading or w.status.info is None:
            return False
        self.sync()
        return True

    def sync(self) -> None:
        """The served model's id, context size and mode from the window's pair and settings."""
        served, info = self.served, self.window.status.info
        if served is None or info is None:
            return
        mode = self.window.settings.mode
        served.model_path = info.target.path
        served.n_ctx = info.n_ctx
        served.mode = "auto" if mode == "speculative" and info.draft is None else mode

    @property
    def model_id(self) -> str:
        """The model id clients send: the target file's name without .gguf ("" before a pair is loaded),
        as `app.server.served.Served` names it."""
        info = self.window.status.info
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
        import uvicorn

        from app.server.api import allowed_hosts, create_app
        from app.server.served import Served

        port = self.port = self.window.settings.server_port
        try:
            sock = bind_socket(HOST, port)
        except OSError as e:
            self._fail(port_problem(port, e))
            return
        w = self.window
        self.served = Served(w.client, turns=w.worker.turns, ready=self.ready, created=int(time.time()))
        self.sync()
        app = create_app(self.served, allowed_hosts=allowed_hosts(HOST, port))
        config = uvicorn.Config(
            app, host=HOST, port=port, log_config=None, log_level="warning", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=_serve, args=(self._server, sock), name="tandem-ui-api", daemon=True
        )
        self.error = ""
        self._set_state("starting")
        self._thread.start()
        self._poll.start()

    def stop(self) -> None:
        """Ask the server to stop (requests in flight get two seconds); ``stateChanged("off")`` follows."""
        if self._server is None:
            return
        self._server.should_exit = True
        self._set_state("stopping")
        self._poll.start()

    def shutdown(self, timeout: float = STOP_WAIT) -> None:
        """Stop the server and wait for it (the window is closing)."""
        self._poll.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the local API server did not stop within %.0f s", timeout)
        self._server = self._thread = self.served = None
        self.state = "off"

    def _follow(self) -> None:
        """The timer: has the server started, stopped, or died?"""
        thread, server = self._thread, self._server
        alive = thread is not None and thread.is_alive()
        if self.state == "starting" and server is not None and server.started and alive:
            self._set_state("on")
            what = self.model_id or "the loaded pair"
            self.window.statusBar().showMessage(f"Serving {what} at {self.base_url}", 8000)
        elif self.state in ("starting", "on") and not alive:
            self._server = self._thread = self.served = None
            self._fail("The local API server stopped unexpectedly (see the log).")
        elif self.state == "stopping" and not alive:
            self._server = self._thread = self.served = None
            self._set_state("off")
        if self.state not in ("starting", "stopping"):
            self._poll.stop()

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_state("failed")
        self.window.statusBar().showMessage(message, 15000)

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
        from app.ui.server_dialog import ServerDialog

        if self.dialog is None:
            self.dialog = ServerDialog(self, self.window)
            self.dialog.finished.connect(lambda _r: setattr(self, "dialog", None))
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog


def _serve(server: Any, sock: socket.socket) -> None:
    """The server's thread: uvicorn on the socket already claimed (no signal handlers off the main
    thread)."""
    try:
        server.run(sockets=[sock])
    except BaseException:  # uvicorn exits (SystemExit) when it cannot start
        log.exception("the local API server stopped")
    finally:
        sock.close()
