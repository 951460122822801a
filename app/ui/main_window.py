"""The main window: conversations sidebar, chat, composer, gauges, menus and status bar.

`MainWindow` composes the views: the sidebar (`app.ui.conversations`), the reply being written
(`app.ui.reply_stream`) and the status bar (`app.ui.status_bar`).
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, Qt, Signal, Slot, qVersion
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.engine import EngineClient, EngineInfo, LoadSettings
from app.remote_client import RemoteInfo
from app.ui.chat_view import ChatView, MessageWidget
from app.ui.composer import Composer
from app.ui.conversations import NEW_TITLE, ConversationsView
from app.ui.gauges import GaugesPanel
from app.ui.gc_guard import MainThreadGC
from app.ui.local_server import LocalServer
from app.ui.metrics import PlainCost, ReplyMeter
from app.ui.paths import data_dir
from app.ui.reply_stream import ReplyStream, draft_spans
from app.ui.richtext import escape_lines
from app.ui.settings import AppSettings
from app.ui.settings_dialog import SettingsDialog
from app.ui.speed_check_view import SpeedCheckView
from app.ui.status_bar import StatusBar
from app.ui.store import Conversation, Store
from app.ui.workers import EngineWorker

log = logging.getLogger("tandem.ui")

STOP_STYLE = "QPushButton { background: #d1453b; } QPushButton:hover { background: #b93a31; }"
GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


class MainWindow(QMainWindow):
    """The chat window. Every engine call goes through :class:`~app.ui.workers.EngineWorker`."""

    replyFinished = Signal(str)  # finish reason ("eog", "length", "cancelled", ...)
    replyFailed = Signal(str)
    modelLoaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)

    def __init__(self, client: EngineClient | None = None, data: Path | None = None):
        super().__init__()
        self._gc = MainThreadGC(self)
        self.data = Path(data) if data else data_dir()
        self.store = Store(self.data / "conversations.db")
        self.settings = AppSettings.read(self.data)
        self.worker = EngineWorker(client)
        self.client = self.worker.client
        self.loading = False
        self.calibrating = False  # the short plain run after a load (replies wait behind it)
        self.generating = False
        self.waiting: tuple[int, int] | None = None  # (conversation, message) sent while a pair loads
        self.settings_dialog: SettingsDialog | None = None
        self.shut_down = False

        self.setWindowTitle("Tandem")
        self.resize(1280, 800)
        self.reply = ReplyStream(self)
        self._build()
        self._connect_worker()
        self.local_server = LocalServer(self)  # Server › Serve the loaded pair, and its status indicator
        self._restore_geometry()
        self.conversations.refresh()
        last = self.store.get_meta("last_conversation")
        conv = self.store.get(int(last)) if last and last.isdigit() else None
        convs = self.store.conversations()
        self.open_conversation((conv or (convs[0] if convs else None) or self.store.create()).id)
        self._update_model_state()

    # -- construction -------------------------------------------------------------------------------
    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        splitter.setHandleWidth(1)
        self.splitter = splitter
        self.setCentralWidget(splitter)

        # sidebar: conversations
        self.conversations = ConversationsView(self)
        splitter.addWidget(self.conversations)

        # centre: header, system prompt, messages, composer
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.conversations.header)
        self.chat = ChatView()
        self.chat.placeholder.linkActivated.connect(self._placeholder_link)
        cl.addWidget(self.chat, 1)
        box = QFrame()
        box.setObjectName("composerBox")
        bl = QHBoxLayout(box)
        bl.setContentsMargins(16, 10, 16, 12)
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.clicked.connect(self._send_or_stop)
        bl.addWidget(self.composer, 1)
        bl.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        cl.addWidget(box)
        splitter.addWidget(centre)

        # right: gauges and panels added by others
        self.side_tabs = QTabWidget()
        self.side_tabs.setObjectName("sideTabs")
        self.side_tabs.setDocumentMode(True)
        self.gauges = GaugesPanel()
        self.gauges.highlightToggled.connect(self.set_highlight)
        self.speed_check = SpeedCheckView(
            self.worker, self.store, lambda: self.settings.generation(has_draft=self.status.has_draft)
        )
        self.gauges.add_below(self.speed_check)
        self.speed_check.button.clicked.connect(self.update_actions)
        self.speed_check.finished.connect(lambda _: self.update_actions())
        self.side_tabs.addTab(self.gauges, "Gauges")
        self.side_tabs.setMinimumWidth(270)
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
        self.stop_action = self._action(chat_menu, "&Stop", self.stop, "Esc")
        self.regen_action = self._action(chat_menu, "&Regenerate last reply", self.regenerate, "Ctrl+R")
        self.edit_action = self._action(chat_menu, "&Edit last message", self.edit_last, "Ctrl+E")
        self._action(chat_menu, "Re&name chat…", self.rename_conversation, "F2")
        self._action(chat_menu, "&Delete chat", self.delete_conversation)
        view_menu = menu.addMenu("&View")
        self.highlight_action = self._action(view_menu, "&Highlight drafted tokens", None, "Ctrl+H")
        self.highlight_action.setCheckable(True)
        self.highlight_action.toggled.connect(self.set_highlight)
        self.panels_menu = view_menu
        help_menu = menu.addMenu("&Help")
        self.about_action = self._action(help_menu, "&About Tandem", self.show_about)

        # status bar
        self.status = StatusBar(self.client)
        self.setStatusBar(self.status)

    def _action(self, menu: QMenu, text: str, slot: Any, shortcut: Any = None) -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut) if isinstance(shortcut, str) else shortcut)
        if slot is not None:
            act.triggered.connect(lambda _checked=False: slot())
        menu.addAction(act)
        return act

    def _connect_worker(self) -> None:
        w = self.worker
        w.loadStarted.connect(self._on_load_started)
        w.loadProgress.connect(self.status.load_progress)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.started.connect(self.reply.on_started)
        w.steps.connect(self.reply.on_steps)
        w.finished.connect(self.reply.on_finished)
        w.failed.connect(self.reply.on_failed)
        w.calibrated.connect(self.reply.on_calibrated)
        w.calibrated.connect(self._on_calibrated)

    # -- state held by the views --------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo | RemoteInfo | None:
        """The engine's description of the loaded models, or the remote server the chat uses instead."""
        return self.status.remote or self.status.info

    @property
    def conversation(self) -> Conversation | None:
        """The conversation shown in the chat view."""
        return self.conversations.conversation

    @property
    def meter(self) -> ReplyMeter | None:
        """The figures of the latest reply."""
        return self.reply.meter

    @property
    def render_count(self) -> int:
        """Re-renders of the latest reply while it streamed (tests, benchmark)."""
        return self.reply.render_count

    # -- public API for other panels ----------------------------------------------------------------
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

    @Slot(str, str)
    def load_pair(self, target: str, draft: str | None = None) -> None:
        """Load a target (and optional draft) GGUF with the current load settings."""
        if self.generating:
            self.stop()
        self.settings = replace(self.settings, last_target=str(target), last_draft=str(draft or ""))
        self.settings.write(self.data)
        self.loading = True  # at once: a message sent before the worker reports waits for the pair
        self._update_model_state()
        try:
            self.worker.load(self.settings.load(str(target), str(draft) if draft else None))
        except Exception as e:  # bad settings
            self._on_load_failed(str(e))

    # -- models -------------------------------------------------------------------------------------
    def choose_model_files(self) -> None:
        start = str(Path(self.settings.last_target).parent) if self.settings.last_target else str(Path.home())
        target, _ = QFileDialog.getOpenFileName(self, "Choose the target model", start, GGUF_FILTER)
        if not target:
            return
        draft, _ = QFileDialog.getOpenFileName(
            self, "Choose a draft model (optional: Cancel for none)", str(Path(target).parent), GGUF_FILTER
        )
        self.load_pair(target, draft or None)

    def _on_load_started(self, settings: LoadSettings) -> None:
        self.loading = True
        self.status.load_started(settings)
        self._update_model_state()

    def _on_loaded(self, info: EngineInfo) -> None:
        if self.shut_down:  # a late event after the window closed
            return
        self.loading = False
        self.status.loaded(info)
        self.reply.plain_cost = PlainCost()
        self._update_model_state()
        self.status.update_memory()
        self.calibrating = True
        self.worker.calibrate()
        self.modelLoaded.emit(info)
        if self.waiting is not None:
            self._send_waiting()

    def _on_calibrated(self, _steps: object) -> None:
        self.calibrating = False

    def _on_load_failed(self, message: str) -> None:
        if self.shut_down:  # a late event after the window closed
            return
        self.loading = False
        self.status.load_failed()
        if self.waiting is not None:
            widget = self._waiting_widget()
            if widget is not None:
                widget.set_info("not sent: the model did not load (Edit to send it again)")
            self.waiting = None
        self._update_model_state()
        self.status.show_failure(message)
        if not self.chat.messages:
            self.chat.set_placeholder(
                f"<b>Could not load the model</b><br>{escape_lines(message)}<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.add_message("error", f"Could not load the model: {message}")
        self.loadFailed.emit(message)

    def _update_model_state(self) -> None:
        self.status.show_model(self.loading)
        if self.info:
            self.chat.set_placeholder("<b>Ready.</b><br>Type a message below to start.")
        elif not self.loading:
            self.chat.set_placeholder(
                "<b>No model loaded — choose one.</b><br><br>"
                "Pick a target GGUF and, optionally, a smaller draft model that shares its tokenizer.<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.set_placeholder("<b>Loading the model…</b>")
        self.update_actions()

    def _placeholder_link(self, link: str) -> None:
        if link == "load":
            self.choose_model_files()

    # -- settings -----------------------------------------------------------------------------------
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
        old, self.settings = self.settings, new
        new.write(self.data)
        if old.needs_reload(new) and self.client.settings is not None and new.last_target:
            self.load_pair(new.last_target, new.last_draft or None)

    # -- conversations ------------------------------------------------------------------------------
    def open_conversation(self, conversation_id: int) -> None:
        self.conversations.open_conversation(conversation_id)

    def new_conversation(self) -> None:
        """Start a new chat (reuses the current one if it is still empty)."""
        self.conversations.new_conversation()

    def rename_conversation(self, conversation_id: int | None = None) -> None:
        self.conversations.rename_conversation(conversation_id)

    def delete_conversation(self, conversation_id: int | None = None, confirm: bool = True) -> None:
        self.conversations.delete_conversation(conversation_id, confirm)

    # -- chatting -----------------------------------------------------------------------------------
    def _send_or_stop(self) -> None:
        if self.generating:
            self.stop()
        else:
            self.send()

    def send(self) -> None:
        """Send the composer's text as a user message and stream the reply."""
        text = self.composer.toPlainText().strip()
        if not text:
            return
        if self.generating:
            self.statusBar().showMessage("A reply is still being written: Stop it first (Esc).", 4000)
            return
        if not self.info and not self.loading:
            self.statusBar().showMessage("Load a model first (File › Load model files…).", 5000)
            return
        self.composer.clear()
        waiting = self._waiting_widget()
        if waiting is not None:  # a second message while the first waits: both go as one
            waiting.set_text(f"{waiting.text}\n\n{text}")
            self.store.update_message(waiting.message_id, waiting.text)
            return
        if self.conversations.conversation is None:
            self.conversations.conversation = self.store.create()
        conv = self.conversations.conversation
        if conv.title == NEW_TITLE:
            self.conversations.set_title(" ".join(text.split())[:48])
        msg = self.store.add_message(conv.id, "user", text)
        widget = self.chat.add_message("user", text, message_id=msg.id)
        self.wire_message(widget)
        self.conversations.refresh()
        if self.loading:  # sent as soon as the pair is loaded
            self.waiting = (conv.id, msg.id)
            widget.set_info("waiting: the model is loading, this message is sent once it is ready")
            self.update_actions()
            return
        self.reply.start()

    def _send_waiting(self) -> None:
        """Send the message that waited for the pair to load (if it is still the chat's last)."""
        waiting, self.waiting = self.waiting, None
        if waiting is None or self.generating:
            return
        conversation_id, message_id = waiting
        msgs = self.store.messages(conversation_id)
        if not msgs or msgs[-1].id != message_id:
            return  # edited or deleted meanwhile
        if self.conversation is None or self.conversation.id != conversation_id:
            self.open_conversation(conversation_id)
        widget = self.chat.messages[-1] if self.chat.messages else None
        if widget is not None:
            widget.set_info("")
        self.reply.start()

    def _waiting_widget(self) -> MessageWidget | None:
        """The chat's message that waits for the pair to load, if it is shown."""
        if self.waiting is None or self.conversation is None or self.conversation.id != self.waiting[0]:
            return None
        return next((m for m in self.chat.messages if m.message_id == self.waiting[1]), None)

    def stop(self) -> None:
        """Stop the reply being written (takes effect within one round)."""
        if self.generating:
            self.worker.cancel()
            self.statusBar().showMessage("Stopping…", 2000)

    def regenerate(self) -> None:
        """Drop the last reply (or error) and generate it again."""
        if self.generating or not self.info or self.conversation is None:
            return
        msgs = self.store.messages(self.conversation.id)
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if last_user is None:
            return
        if last_user + 1 < len(msgs):
            self.store.delete_messages_from(self.conversation.id, msgs[last_user + 1].id)
            self.chat.remove_from(last_user + 1)
        self.reply.start()

    def edit_last(self) -> None:
        """Put the last user message back in the composer and remove it (and its reply) from the chat."""
        if self.generating or self.conversation is None:
            return
        msgs = self.store.messages(self.conversation.id)
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if last_user is None:
            return
        self.store.delete_messages_from(self.conversation.id, msgs[last_user].id)
        self.chat.remove_from(last_user)
        self.composer.setPlainText(msgs[last_user].content)
        self.composer.setFocus()
        cursor = self.composer.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.composer.setTextCursor(cursor)
        self.update_actions()

    def wire_message(self, w: MessageWidget) -> None:
        """Connect a chat message's Regenerate and Edit buttons."""
        w.regenerateRequested.connect(self.regenerate)
        w.editRequested.connect(self.edit_last)

    def set_generating(self, on: bool) -> None:
        """A reply is being written (Send becomes Stop) or not."""
        self.generating = on
        self.send_button.setText("Stop" if on else "Send")
        self.send_button.setStyleSheet(STOP_STYLE if on else "")
        self.update_actions()

    def update_actions(self) -> None:
        """Enable the actions and the messages' buttons that apply now."""
        ready = bool(self.info) and not self.loading and not self.speed_check.running
        self.speed_check.set_ready(ready and not self.generating and self.status.remote is None)
        # a message sent while a pair loads waits for it
        self.send_button.setEnabled(self.generating or ready or self.loading)
        self.stop_action.setEnabled(self.generating)
        self.regen_action.setEnabled(ready and not self.generating)
        self.edit_action.setEnabled(not self.generating)
        msgs = self.chat.messages
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        for i, m in enumerate(msgs):
            idle = not self.generating
            m.set_actions(
                edit=idle and i == last_user,
                regenerate=idle and ready and i == len(msgs) - 1 and m.role in ("assistant", "error"),
            )

    # -- view ---------------------------------------------------------------------------------------
    def set_highlight(self, on: bool) -> None:
        """Tint the text of accepted draft tokens (replies shown as plain text while on)."""
        for src in (self.highlight_action, self.gauges.highlight):
            if src.isChecked() != on:
                src.blockSignals(True)
                src.setChecked(on)
                src.blockSignals(False)
        for w in self.chat.messages:
            if w.role != "assistant":
                continue
            if w is self.reply.widget and self.reply.meter is not None:
                w.set_highlight(list(self.reply.meter.draft_spans) if on else None)
            else:
                w.set_highlight(draft_spans(w.stats) if on else None)

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
        self.shut_down = True
        self.status.stop()
        self.reply.stop_rendering()
        self.conversations.save_system_prompt()
        self.store.set_meta("window_geometry", bytes(self.saveGeometry().toBase64().data()).decode())
        self.store.set_meta("splitter_sizes", ",".join(str(s) for s in self.splitter.sizes()))
        self.local_server.shutdown()
        self.worker.shutdown()
        self.store.close()
        self._gc.stop()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # e.g. a frozen app without dist-info
        return "(version unknown)"
