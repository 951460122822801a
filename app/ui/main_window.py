"""The main window: it composes the views over one session model and owns the menus.

`MainWindow` creates the :class:`~app.ui.core.session.Session` (settings, store, engine worker, the open
conversation and the engine's state) and gives it, with the widgets each uses, to the views: the chat
pane and sidebar (`app.ui.chat`), the gauges and the speed check, the status bar and the local API
(`app.ui.server`). Views follow the session's signals; the window only places them and builds the menus.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, Qt, Signal, qVersion
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QMessageBox, QSplitter, QTabWidget, QWidget

from app import __version__
from app.engine import EngineClient
from app.ui.chat.gauges import GaugesPanel
from app.ui.chat.pane import ChatPane
from app.ui.chat.speed_check_view import SpeedCheckView
from app.ui.chat.status_bar import StatusBar
from app.ui.core.paths import data_dir
from app.ui.core.session import Session
from app.ui.core.settings import AppSettings
from app.ui.server.local_server import LocalServer
from app.ui.settings.dialog import SettingsDialog
from app.ui.shared.gc_guard import MainThreadGC
from app.ui.shared.metrics import ReplyMeter
from app.ui.shared.richtext import escape_lines

log = logging.getLogger("tandem.ui")

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


class MainWindow(QMainWindow):
    """The chat window. Every engine call goes through the session's :class:`EngineWorker`."""

    replyFinished = Signal(object)  # FinishReason
    replyFailed = Signal(str)
    modelLoaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)

    def __init__(self, client: EngineClient | None = None, data: Path | None = None):
        super().__init__()
        self._gc = MainThreadGC(self)
        self.data = Path(data) if data else data_dir()
        self.session = Session(self.data, client, self)
        self.store, self.worker, self.client = self.session.store, self.session.worker, self.session.client
        self.settings_dialog: SettingsDialog | None = None
        self.setWindowTitle("Tandem")
        self.resize(1280, 800)
        self._build()
        s = self.session
        s.pairLoaded.connect(self.modelLoaded)
        s.loadFailed.connect(self.loadFailed)
        s.stateChanged.connect(self.update_actions)
        s.highlightChanged.connect(self._show_highlight)
        self.reply.finished.connect(self.replyFinished)
        self.reply.failed.connect(self.replyFailed)
        self._restore_geometry()
        self.conversations.refresh()
        last = self.store.get_meta("last_conversation")
        conv = self.store.get(int(last)) if last and last.isdigit() else None
        convs = self.store.conversations()
        self.open_conversation((conv or (convs[0] if convs else None) or self.store.create()).id)
        self.pane.show_placeholder()
        self.update_actions()

    # -- construction -------------------------------------------------------------------------------
    def _build(self) -> None:
        s = self.session
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        splitter.setHandleWidth(1)
        self.splitter = splitter
        self.setCentralWidget(splitter)

        # right: gauges (the reply stream writes to them) and panels added by others
        self.side_tabs = QTabWidget()
        self.side_tabs.setObjectName("sideTabs")
        self.side_tabs.setDocumentMode(True)
        self.gauges = GaugesPanel()
        self.gauges.highlightToggled.connect(s.set_highlight)
        self.speed_check = SpeedCheckView(s)
        self.gauges.add_below(self.speed_check)
        self.side_tabs.addTab(self.gauges, "Gauges")
        self.side_tabs.setMinimumWidth(270)

        # sidebar: conversations; centre: header, messages, composer
        self.pane = ChatPane(s, self.gauges)
        self.pane.loadRequested.connect(self.choose_model_files)
        self.chat, self.composer, self.send_button = self.pane.chat, self.pane.composer, self.pane.send_button
        self.conversations, self.reply = self.pane.conversations, self.pane.reply
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.pane)
        splitter.addWidget(self.side_tabs)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setStretchFactor(2, 0)
        splitter.setSizes([230, 760, 290])

        # menus
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        self.load_action = self._action(file_menu, "&Load model files…", self.choose_model_files, "Ctrl+O")
        self.settings_action = self._action(
            file_menu, "&Settings…", self.open_settings, QKeySequence.StandardKey.Preferences
        )
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        chat_menu = menu.addMenu("&Chat")
        self._action(chat_menu, "&New chat", self.new_conversation, QKeySequence.StandardKey.New)
        self.stop_action = self._action(chat_menu, "&Stop", s.stop, "Esc")
        self.regen_action = self._action(chat_menu, "&Regenerate last reply", self.regenerate, "Ctrl+R")
        self.edit_action = self._action(chat_menu, "&Edit last message", self.edit_last, "Ctrl+E")
        self._action(chat_menu, "Re&name chat…", self.rename_conversation, "F2")
        self._action(chat_menu, "&Delete chat", self.delete_conversation)
        view_menu = menu.addMenu("&View")
        self.highlight_action = self._action(view_menu, "&Highlight drafted tokens", None, "Ctrl+H")
        self.highlight_action.setCheckable(True)
        self.highlight_action.toggled.connect(s.set_highlight)
        self.panels_menu = view_menu
        # the local API: Server › Serve the loaded pair, and its indicator in the status bar
        self.local_server = LocalServer(s, self)
        menu.addMenu(self.local_server.menu)
        help_menu = menu.addMenu("&Help")
        self.about_action = self._action(help_menu, "&About Tandem", self.show_about)

        # status bar
        self.status = StatusBar(s)
        self.status.addPermanentWidget(self.local_server.indicator)
        self.setStatusBar(self.status)

    def _action(self, menu: QMenu, text: str, slot: Any, shortcut: Any = None) -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut) if isinstance(shortcut, str) else shortcut)
        if slot is not None:
            act.triggered.connect(lambda _checked=False: slot())
        menu.addAction(act)
        return act

    # -- the session's state, for callers and tests -------------------------------------------------
    @property
    def settings(self) -> AppSettings:
        return self.session.settings

    @property
    def info(self) -> Any:
        """The engine's description of the loaded models, or the remote server the chat uses instead."""
        return self.session.info

    @property
    def loading(self) -> bool:
        return self.session.loading

    @property
    def calibrating(self) -> bool:
        return self.session.calibrating

    @property
    def generating(self) -> bool:
        return self.session.generating

    @property
    def shut_down(self) -> bool:
        return self.session.shut_down

    @property
    def conversation(self) -> Any:
        """The conversation shown in the chat view."""
        return self.session.conversation

    @property
    def meter(self) -> ReplyMeter | None:
        """The figures of the latest reply."""
        return self.reply.meter

    @property
    def render_count(self) -> int:
        """Re-renders of the latest reply while it streamed (tests, benchmark)."""
        return self.reply.render_count

    # -- panels -------------------------------------------------------------------------------------
    def add_panel(self, title: str, widget: QWidget) -> None:
        """Add a panel (e.g. a model picker) as a tab beside the gauges, and to the View menu."""
        index = self.side_tabs.addTab(widget, title)
        act = QAction(title, self)
        act.triggered.connect(lambda: self.side_tabs.setCurrentIndex(self.side_tabs.indexOf(widget)))
        self.panels_menu.addAction(act)
        if index == 0:
            self.side_tabs.setCurrentIndex(0)

    def panel_width(self, widget: QWidget, width: int) -> None:
        """Widen the side pane to ``width`` while ``widget``'s tab is open (the gauges need less)."""
        normal = self.splitter.sizes()[2] or 290

        def follow(_index: int) -> None:
            sizes = self.splitter.sizes()
            side = width if self.side_tabs.currentWidget() is widget else normal
            centre = max(420, sum(sizes) - sizes[0] - side)
            self.splitter.setSizes([sizes[0], centre, side])

        self.side_tabs.currentChanged.connect(follow)

    # -- models and settings ------------------------------------------------------------------------
    def load_pair(self, target: str, draft: str | None = None) -> None:
        """Load a target (and optional draft) GGUF with the current load settings."""
        self.session.load_pair(target, draft)

    def choose_model_files(self) -> None:
        last = self.settings.last_target
        start = str(Path(last).parent) if last else str(Path.home())
        target, _ = QFileDialog.getOpenFileName(self, "Choose the target model", start, GGUF_FILTER)
        if not target:
            return
        draft, _ = QFileDialog.getOpenFileName(
            self, "Choose a draft model (optional: Cancel for none)", str(Path(target).parent), GGUF_FILTER
        )
        self.load_pair(target, draft or None)

    def open_settings(self) -> SettingsDialog:
        """Open the (window-modal, non-blocking) Settings dialog; applies the result on OK."""
        dlg = SettingsDialog(self.settings, self, self.worker)
        self.settings_dialog = dlg
        dlg.accepted.connect(lambda: self.apply_settings(dlg.result_settings()))
        dlg.finished.connect(lambda _r: setattr(self, "settings_dialog", None))
        dlg.open()
        return dlg

    def apply_settings(self, new: AppSettings) -> None:
        """Persist ``new``; reload the models if a load-time setting changed."""
        self.session.apply_settings(new)

    # -- conversations and chatting (the chat pane's) -----------------------------------------------
    def open_conversation(self, conversation_id: int) -> None:
        self.conversations.open_conversation(conversation_id)

    def new_conversation(self) -> None:
        """Start a new chat (reuses the current one if it is still empty)."""
        self.conversations.new_conversation()

    def rename_conversation(self, conversation_id: int | None = None) -> None:
        self.conversations.rename_conversation(conversation_id)

    def delete_conversation(self, conversation_id: int | None = None, confirm: bool = True) -> None:
        self.conversations.delete_conversation(conversation_id, confirm)

    def send(self) -> None:
        """Send the composer's text as a user message and stream the reply."""
        self.pane.send()

    def stop(self) -> None:
        """Stop the reply being written (takes effect within one round)."""
        self.session.stop()

    def regenerate(self) -> None:
        self.pane.regenerate()

    def edit_last(self) -> None:
        self.pane.edit_last()

    def update_actions(self) -> None:
        """Enable the menu actions that apply now (the chat pane keeps Send and the messages' buttons)."""
        s = self.session
        self.stop_action.setEnabled(s.generating)
        self.regen_action.setEnabled(s.ready and not s.generating)
        self.edit_action.setEnabled(not s.generating)

    def set_highlight(self, on: bool) -> None:
        """Tint the text of accepted draft tokens (replies shown as plain text while on)."""
        self.session.set_highlight(on)

    def _show_highlight(self, on: bool) -> None:
        for src in (self.highlight_action, self.gauges.highlight):
            if src.isChecked() != on:
                src.blockSignals(True)
                src.setChecked(on)
                src.blockSignals(False)

    # -- window -------------------------------------------------------------------------------------
    def _restore_geometry(self) -> None:
        geo = self.store.get_meta("window_geometry")
        if geo:
            self.restoreGeometry(QByteArray.fromBase64(geo.encode()))
        sizes = self.store.get_meta("splitter_sizes")
        if sizes:
            self.splitter.setSizes([int(x) for x in sizes.split(",") if x.isdigit()])

    def about_text(self) -> str:
        """The About box's text: version, engine backend, where the licences are."""
        backend = self.status.about_backend()
        return (
            f"<h3>Tandem {__version__}</h3>"
            "<p>Local LLMs that answer faster with exactly the same words: lossless speculative "
            "decoding over llama.cpp.</p>"
            f"<p>Engine: llama.cpp through llama-cpp-python {_package_version('llama-cpp-python')}; "
            f"{escape_lines(backend)}<br>"
            f"Qt {qVersion()} (PySide6)</p>"
            "<p>Licences of the bundled components are in <code>resources/licenses</code>.</p>"
        )

    def show_about(self) -> QMessageBox:
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About Tandem", self.about_text(), parent=self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.open()
        return box

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Save state, stop the engine (and its thread) and close the database. Idempotent."""
        if self.shut_down:
            return
        self.session.shut_down = True
        self.status.stop()
        self.reply.stop_rendering()
        self.conversations.save_system_prompt()
        self.store.set_meta("window_geometry", bytes(self.saveGeometry().toBase64().data()).decode())
        self.store.set_meta("splitter_sizes", ",".join(str(s) for s in self.splitter.sizes()))
        self.local_server.shutdown()
        self.session.shutdown()
        self._gc.stop()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # e.g. a frozen app without dist-info
        return "(version unknown)"
