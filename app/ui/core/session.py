"""The session model: what the window's views show and change, in one QObject the window owns.

`Session` holds the app's settings (and writes them), the conversation store, the engine worker, the
open conversation, the loaded pair (or the remote server the chat uses instead) and whether a pair loads,
calibrates or a reply streams; it emits a typed signal when one of them changes. Each view is given the
session and the widgets it uses, never the window, and follows the session's signals; views never call
one another.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.engine import EngineClient, EngineInfo, GenerationSettings, LoadSettings
from app.remote_client import RemoteInfo
from app.ui.core.settings import AppSettings
from app.ui.core.store import Conversation, Store
from app.ui.core.workers import EngineWorker

__all__ = ["Session"]


class Session(QObject):
    """Settings, store, worker, the open conversation and the engine's state, with typed signals."""

    settingsChanged = Signal(object)  # AppSettings (after they are written)
    loadStarted = Signal(object)  # LoadSettings
    pairLoaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)
    calibratedChanged = Signal(bool)  # the short plain run after a load is (not) running
    remoteChanged = Signal(object)  # RemoteInfo: the chat uses a remote server (None: the engine again)
    conversationChanged = Signal(object)  # Conversation | None: another conversation is open
    generatingChanged = Signal(bool)  # a reply is (no longer) being written
    highlightChanged = Signal(bool)  # accepted draft tokens are tinted
    stateChanged = Signal()  # something that decides which actions apply changed
    message = Signal(str, int)  # a short note for the status bar, and for how many ms

    def __init__(self, data: Path, client: EngineClient | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.data = data
        self.store = Store(data / "conversations.db")
        self.settings = AppSettings.read(data)
        self.worker = EngineWorker(client)
        self.client = self.worker.client
        self.conversation: Conversation | None = None
        self.engine_info: EngineInfo | None = None  # the loaded pair
        self.remote: RemoteInfo | None = None  # the server the chat uses instead of the engine
        self.loading = False
        self.calibrating = False  # the short plain run after a load (replies wait behind it)
        self.generating = False
        self.streaming_conversation = 0  # the conversation whose reply is (or was last) written
        self.highlight = False
        self.busy_elsewhere = False  # a view holds the engine (the speed check): no replies meanwhile
        self.shut_down = False
        w = self.worker
        w.loadStarted.connect(self._on_load_started)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.calibrated.connect(lambda _steps: self._set_calibrating(False))
        w.connected.connect(self._on_connected)

    # -- what the views read ------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo | RemoteInfo | None:
        """The engine's description of the loaded models, or the remote server the chat uses instead."""
        return self.remote or self.engine_info

    @property
    def has_draft(self) -> bool:
        """A draft model is loaded."""
        return self.engine_info is not None and self.engine_info.draft is not None

    @property
    def has_mtp(self) -> bool:
        """The loaded target has multi-token-prediction layers (mode "mtp" can draft)."""
        return self.engine_info is not None and self.engine_info.target.mtp_layers > 0

    @property
    def ready(self) -> bool:
        """A reply can start now (a pair is loaded or a server is used, none loads, nothing holds it)."""
        return bool(self.info) and not self.loading and not self.busy_elsewhere

    def where(self) -> str:
        """Where the models run, for the gauges: "CPU", "GPU", "server" or "" (nothing loaded)."""
        if self.remote is not None:
            return "server"
        if self.engine_info is None:
            return ""
        return "GPU" if self.engine_info.target.offload.on_gpu else "CPU"

    def generation(self) -> GenerationSettings:
        """The settings of the next reply."""
        return self.settings.generation(has_draft=self.has_draft, has_mtp=self.has_mtp)

    # -- settings -----------------------------------------------------------------------------------
    def apply_settings(self, new: AppSettings) -> None:
        """Write ``new``; reload the models if a load-time setting changed."""
        old, self.settings = self.settings, new
        new.write(self.data)
        self.settingsChanged.emit(new)
        if old.needs_reload(new) and self.client.settings is not None and new.last_target:
            self.load_pair(new.last_target, new.last_draft or None)

    # -- the pair -----------------------------------------------------------------------------------
    def load_pair(self, target: str, draft: str | None = None) -> None:
        """Load a target (and optional draft) GGUF with the current load settings."""
        if self.generating:
            self.stop()
        self.settings = replace(self.settings, last_target=str(target), last_draft=str(draft or ""))
        self.settings.write(self.data)
        self.loading = True  # at once: a message sent before the worker reports waits for the pair
        self.stateChanged.emit()
        try:
            self.worker.load(self.settings.load(str(target), str(draft) if draft else None))
        except Exception as e:  # bad settings
            self._on_load_failed(str(e))

    def use_remote(self, remote: object) -> None:
        """Send the chat to ``remote`` (an ``app.remote_client.RemoteClient``; None: the engine again)."""
        self.worker.use_remote(remote)

    def _on_load_started(self, settings: LoadSettings) -> None:
        self.loading = True
        self.remote = None  # loading a pair goes back to the engine
        self.loadStarted.emit(settings)
        self.stateChanged.emit()

    def _on_loaded(self, info: EngineInfo) -> None:
        if self.shut_down:  # a late event after the window closed
            return
        self.loading = False
        self.engine_info = info
        self._set_calibrating(True)
        self.worker.calibrate()
        self.pairLoaded.emit(info)
        self.stateChanged.emit()

    def _on_load_failed(self, message: str) -> None:
        if self.shut_down:
            return
        self.loading = False
        if not self.client.settings:  # the engine has no pair loaded any more
            self.engine_info = None
        self.stateChanged.emit()
        self.loadFailed.emit(message)

    def _set_calibrating(self, on: bool) -> None:
        if on != self.calibrating:
            self.calibrating = on
            self.calibratedChanged.emit(on)

    def _on_connected(self, info: RemoteInfo | None) -> None:
        self.remote = info
        self.remoteChanged.emit(info)
        self.stateChanged.emit()

    # -- conversations and replies ------------------------------------------------------------------
    def set_conversation(self, conversation: Conversation | None) -> None:
        """Open ``conversation`` (the views show it)."""
        self.conversation = conversation
        if conversation is not None:
            self.store.set_meta("last_conversation", str(conversation.id))
        self.conversationChanged.emit(conversation)

    def set_generating(self, on: bool, conversation_id: int = 0) -> None:
        """A reply is being written into ``conversation_id`` (Send becomes Stop), or not."""
        if on:
            self.streaming_conversation = conversation_id
        self.generating = on
        self.generatingChanged.emit(on)
        self.stateChanged.emit()

    def stop(self) -> None:
        """Stop the reply being written (takes effect within one round)."""
        if self.generating:
            self.worker.cancel()
            self.message.emit("Stopping…", 2000)

    def set_highlight(self, on: bool) -> None:
        if on != self.highlight:
            self.highlight = on
            self.highlightChanged.emit(on)

    def set_busy_elsewhere(self, busy: bool) -> None:
        self.busy_elsewhere = busy
        self.stateChanged.emit()

    def notify(self, text: str, ms: int = 5000) -> None:
        """A short note for the status bar."""
        self.message.emit(text, ms)

    def shutdown(self) -> None:
        """Stop the engine (and its thread) and close the store."""
        self.shut_down = True
        self.worker.shutdown()
        self.store.close()
