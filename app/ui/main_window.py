"""The main window: conversations sidebar, chat, composer, gauges, menus and status bar."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from PySide6.QtCore import QByteArray, Qt, QTimer, Signal, Slot, qVersion
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.engine.client import EngineClient
from app.engine.events import Finished, Started, Step
from app.engine.settings import LoadSettings
from app.ui.chat_view import ChatView, MessageWidget
from app.ui.composer import Composer
from app.ui.gauges import GaugesPanel
from app.ui.gc_guard import MainThreadGC
from app.ui.metrics import PlainCost, ReplyMeter, Rolling
from app.ui.paths import data_dir
from app.ui.settings import AppSettings
from app.ui.settings_dialog import SettingsDialog
from app.ui.store import Conversation, Store
from app.ui.workers import EngineWorker

log = logging.getLogger("tandem.ui")

RENDER_INTERVAL_MS = 33  # at most ~30 re-renders a second while a reply streams
NEW_TITLE = "New chat"
STOP_STYLE = "QPushButton { background: #d1453b; } QPushButton:hover { background: #b93a31; }"
GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


class MainWindow(QMainWindow):
    """The chat window. Every engine call goes through :class:`~app.ui.workers.EngineWorker`."""

    replyFinished = Signal(str)  # finish reason ("eog", "length", "cancelled", ...)
    replyFailed = Signal(str)
    modelLoaded = Signal(dict)
    loadFailed = Signal(str)

    def __init__(self, client: EngineClient | None = None, data: Path | None = None):
        super().__init__()
        self._gc = MainThreadGC(self)
        self.data = Path(data) if data else data_dir()
        self.store = Store(self.data / "conversations.db")
        self.settings = AppSettings.read(self.data)
        self.worker = EngineWorker(client)
        self.client = self.worker.client
        self.info: dict[str, Any] | None = None
        self.loading = False
        self.generating = False
        self.conversation: Conversation | None = None
        self.meter: ReplyMeter | None = None
        self.rolling = Rolling()
        self.plain_cost = PlainCost()
        self.render_count = 0  # re-renders of the streaming reply (tests, benchmark)
        self._reply_widget: MessageWidget | None = None
        self._reply_text: list[str] = []
        self._reply_conv = 0
        self._last_render = 0.0
        self._dirty = False
        self.settings_dialog: SettingsDialog | None = None
        self._shut = False

        self.setWindowTitle("Tandem")
        self.resize(1280, 800)
        self._build()
        self._connect_worker()
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.timeout.connect(self._render_reply)
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(400)
        self._prompt_timer.timeout.connect(self._save_system_prompt)
        self._memory_timer = QTimer(self)
        self._memory_timer.setInterval(2000)
        self._memory_timer.timeout.connect(self._update_memory)
        self._memory_timer.start()
        self._restore_geometry()
        self._refresh_conversations()
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
        side = QFrame()
        side.setObjectName("sidebar")
        side.setMinimumWidth(190)
        sl = QVBoxLayout(side)
        sl.setContentsMargins(10, 12, 10, 10)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("newChat")
        self.new_button.clicked.connect(self.new_conversation)
        self.conv_list = QListWidget()
        self.conv_list.setObjectName("conversations")
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conv_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conv_list.customContextMenuRequested.connect(self._conversation_menu)
        self.conv_list.itemClicked.connect(
            lambda item: self.open_conversation(item.data(Qt.ItemDataRole.UserRole))
        )
        self.conv_list.itemDoubleClicked.connect(lambda item: self.rename_conversation())
        sl.addWidget(self.new_button)
        sl.addSpacing(6)
        sl.addWidget(self.conv_list, 1)
        splitter.addWidget(side)

        # centre: header, system prompt, messages, composer
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        header = QFrame()
        header.setObjectName("chatHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(16, 8, 12, 8)
        self.title_label = QLabel(NEW_TITLE)
        self.title_label.setObjectName("chatTitle")
        self.system_toggle = QToolButton()
        self.system_toggle.setObjectName("linkButton")
        self.system_toggle.setText("System prompt")
        self.system_toggle.setCheckable(True)
        self.system_toggle.toggled.connect(self._show_system_prompt)
        hl.addWidget(self.title_label, 1)
        hl.addWidget(self.system_toggle)
        cl.addWidget(header)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt for this conversation (optional)")
        self.system_prompt.setMaximumHeight(90)
        self.system_prompt.textChanged.connect(self._prompt_timer_start)
        sp_box = QWidget()
        spl = QVBoxLayout(sp_box)
        spl.setContentsMargins(16, 8, 16, 8)
        spl.addWidget(self.system_prompt)
        self.system_box = sp_box
        sp_box.setVisible(False)
        cl.addWidget(sp_box)
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
        bar = self.statusBar()
        self.pair_label = QLabel("No model loaded")
        self.backend_label = QLabel("")
        self.memory_label = QLabel("")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        bar.addWidget(self.pair_label, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.backend_label)
        bar.addPermanentWidget(self.memory_label)

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
        w.loadProgress.connect(self._on_load_progress)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.started.connect(self._on_started)
        w.steps.connect(self._on_steps)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.calibrated.connect(self._on_calibrated)

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
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self._load_has_draft = bool(settings.draft)
        self.pair_label.setText(f"Loading {Path(settings.target).name}…")
        self._update_model_state()

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        if self._load_has_draft:
            fraction = fraction / 2 + (0.5 if stage == "draft" else 0.0)
        self.progress.setValue(int(fraction * 1000))

    def _on_loaded(self, info: dict) -> None:
        if self._shut:  # a late event after the window closed
            return
        self.loading = False
        self.info = info
        self.progress.setVisible(False)
        self.plain_cost = PlainCost()
        self._update_model_state()
        self._update_memory()
        self.worker.calibrate()
        self.modelLoaded.emit(info)

    def _on_load_failed(self, message: str) -> None:
        if self._shut:  # a late event after the window closed
            return
        self.loading = False
        self.progress.setVisible(False)
        self.info = None if not self.client.settings else self.info
        self._update_model_state()
        self.pair_label.setText("Loading failed")
        self.statusBar().showMessage(message, 15000)
        if not self.chat.messages:
            self.chat.set_placeholder(
                f"<b>Could not load the model</b><br>{_esc(message)}<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.add_message("error", f"Could not load the model: {message}")
        self.loadFailed.emit(message)

    def _on_calibrated(self, steps: list[Step]) -> None:
        self.plain_cost.observe(steps)

    def _update_model_state(self) -> None:
        info = self.info
        if info:
            names = [Path(info["target"]["path"]).name]
            if info.get("draft"):
                names.append(Path(info["draft"]["path"]).name)
            self.pair_label.setText("  +  ".join(names))
            self.pair_label.setToolTip(
                "\n".join(
                    f"{k}: {info[k]['description']}, {info[k]['offload']}"
                    for k in ("target", "draft")
                    if info.get(k)
                )
            )
            self.backend_label.setText(_backend_text(info))
            self.chat.set_placeholder("<b>Ready.</b><br>Type a message below to start.")
        elif not self.loading:
            self.pair_label.setText("No model loaded")
            self.backend_label.setText("")
            self.chat.set_placeholder(
                "<b>No model loaded — choose one.</b><br><br>"
                "Pick a target GGUF and, optionally, a smaller draft model that shares its tokenizer.<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.set_placeholder("<b>Loading the model…</b>")
        self._update_actions()

    def _update_memory(self) -> None:
        if not self.info:
            self.memory_label.setText("")
            return
        size = sum(self.info[k]["size_bytes"] for k in ("target", "draft") if self.info.get(k))
        text = f"models {_fmt_bytes(size)}"
        pid = self.client.pid
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                text += f" · engine RAM {_fmt_bytes(psutil.Process(pid).memory_info().rss)}"
        self.memory_label.setText(text)

    def _placeholder_link(self, link: str) -> None:
        if link == "load":
            self.choose_model_files()

    # -- settings -----------------------------------------------------------------------------------
    def open_settings(self) -> SettingsDialog:
        """Open the (window-modal, non-blocking) Settings dialog; applies the result on OK."""
        dlg = SettingsDialog(self.settings, self)
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
    def _refresh_conversations(self) -> None:
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for conv in self.store.conversations():
            item = QListWidgetItem(conv.title or NEW_TITLE)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.conv_list.addItem(item)
            if self.conversation and conv.id == self.conversation.id:
                item.setSelected(True)
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def open_conversation(self, conversation_id: int) -> None:
        if self.conversation and self.conversation.id == conversation_id and self.chat.messages:
            return
        if self.generating:
            self.stop()
        self._save_system_prompt()
        conv = self.store.get(conversation_id)
        if conv is None:
            return
        self.conversation = conv
        self.store.set_meta("last_conversation", str(conv.id))
        self.title_label.setText(conv.title or NEW_TITLE)
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(conv.system_prompt)
        self.system_prompt.blockSignals(False)
        self.system_toggle.setChecked(bool(conv.system_prompt))
        self.chat.clear()
        highlight = self.highlight_action.isChecked()
        for msg in self.store.messages(conv.id):
            w = self.chat.add_message(msg.role, msg.content, msg.stats, msg.id)
            self._wire_message(w)
            if highlight and msg.role == "assistant":
                w.set_highlight(_spans(msg.stats))
        self.chat.scroll_to_bottom()
        self._refresh_conversations()
        self._update_actions()

    def new_conversation(self) -> None:
        """Start a new chat (reuses the current one if it is still empty)."""
        if self.conversation and not self.chat.messages and not self.generating:
            self.composer.setFocus()
            return
        conv = self.store.create()
        self.open_conversation(conv.id)
        self.composer.setFocus()

    def rename_conversation(self, conversation_id: int | None = None) -> None:
        cid = conversation_id or (self.conversation.id if self.conversation else None)
        conv = self.store.get(cid) if cid else None
        if conv is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=conv.title)
        if ok and title.strip():
            self.store.rename(conv.id, title.strip())
            if self.conversation and self.conversation.id == conv.id:
                self.conversation.title = title.strip()
                self.title_label.setText(title.strip())
            self._refresh_conversations()

    def delete_conversation(self, conversation_id: int | None = None, confirm: bool = True) -> None:
        cid = conversation_id or (self.conversation.id if self.conversation else None)
        conv = self.store.get(cid) if cid else None
        if conv is None:
            return
        if (
            confirm
            and QMessageBox.question(self, "Delete chat", f"Delete “{conv.title}”?")
            != QMessageBox.StandardButton.Yes
        ):
            return
        if self.generating and self._reply_conv == conv.id:
            self.stop()
        self.store.delete(conv.id)
        if self.conversation and self.conversation.id == conv.id:
            self.conversation = None
            rest = self.store.conversations()
            self.open_conversation((rest[0] if rest else self.store.create()).id)
        self._refresh_conversations()

    def _conversation_menu(self, pos: Any) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_conversation(cid))
        menu.addAction("Delete", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    def _show_system_prompt(self, shown: bool) -> None:
        self.system_box.setVisible(shown)

    def _prompt_timer_start(self) -> None:
        self._prompt_timer.start()

    def _save_system_prompt(self) -> None:
        self._prompt_timer.stop()
        if self.conversation is None:
            return
        text = self.system_prompt.toPlainText()
        if text != self.conversation.system_prompt:
            self.store.set_system_prompt(self.conversation.id, text)
            self.conversation.system_prompt = text

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
        if not self.info:
            self.statusBar().showMessage("Load a model first (File › Load model files…).", 5000)
            return
        if self.conversation is None:
            self.conversation = self.store.create()
        conv = self.conversation
        if conv.title == NEW_TITLE:
            title = " ".join(text.split())[:48]
            self.store.rename(conv.id, title)
            conv.title = title
            self.title_label.setText(title)
        msg = self.store.add_message(conv.id, "user", text)
        self._wire_message(self.chat.add_message("user", text, message_id=msg.id))
        self.composer.clear()
        self._refresh_conversations()
        self._start_reply()

    def _history(self) -> list[dict[str, str]]:
        assert self.conversation is not None
        self._save_system_prompt()
        out: list[dict[str, str]] = []
        if self.conversation.system_prompt.strip():
            out.append({"role": "system", "content": self.conversation.system_prompt})
        out += [
            {"role": m.role, "content": m.content}
            for m in self.store.messages(self.conversation.id)
            if m.role in ("user", "assistant")
        ]
        return out

    def _start_reply(self) -> None:
        assert self.conversation is not None
        history = self._history()
        has_draft = bool(self.info and self.info.get("draft"))
        settings = self.settings.generation(has_draft=has_draft)
        self._reply_conv = self.conversation.id
        self._reply_text = []
        self._reply_widget = self.chat.add_message("assistant")
        self._wire_message(self._reply_widget)
        self._reply_widget.set_info("thinking…")
        if self.highlight_action.isChecked():
            self._reply_widget.set_highlight([])
        self.meter = ReplyMeter(t_sent=time.perf_counter())
        self._mode = settings.mode
        self.gauges.reset()
        self.render_count = 0
        self._set_generating(True)
        self.worker.generate(history, settings)

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
        self._start_reply()

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
        self._update_actions()

    def _wire_message(self, w: MessageWidget) -> None:
        w.regenerateRequested.connect(self.regenerate)
        w.editRequested.connect(self.edit_last)

    def _set_generating(self, on: bool) -> None:
        self.generating = on
        self.send_button.setText("Stop" if on else "Send")
        self.send_button.setStyleSheet(STOP_STYLE if on else "")
        self._update_actions()

    def _update_actions(self) -> None:
        ready = bool(self.info) and not self.loading
        self.send_button.setEnabled(self.generating or ready)
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

    # -- streaming (worker signals) -----------------------------------------------------------------
    def _on_started(self, ev: Started) -> None:
        if self.meter is not None:
            self.meter.started(ev)

    def _on_steps(self, steps: list[Step]) -> None:
        if self._shut:  # a late event after the window closed
            return
        if self.meter is None:
            return
        now = time.perf_counter()
        for s in steps:
            self.meter.add(s, now)
            self._reply_text.append(s.text)
        self.plain_cost.observe(steps)
        self._schedule_render()

    def _schedule_render(self) -> None:
        self._dirty = True
        if self._render_timer.isActive():
            return
        wait = RENDER_INTERVAL_MS - (time.perf_counter() - self._last_render) * 1000
        self._render_timer.start(max(0, int(wait)))

    def _render_reply(self) -> None:
        """Show the streaming reply and the gauges (throttled to ~30 Hz)."""
        self._last_render = time.perf_counter()
        if not self._dirty or self.meter is None:
            return
        self._dirty = False
        self.render_count += 1
        w = self._reply_widget
        if w is not None and self.conversation and self.conversation.id == self._reply_conv:
            if self.highlight_action.isChecked():
                w.text = "".join(self._reply_text)
                w.set_highlight(list(self.meter.draft_spans))
            else:
                w.set_text("".join(self._reply_text))
            w.set_info(f"{self.meter.n_tokens} tokens…")
        self._show_gauges()

    def _show_gauges(self) -> None:
        if self.meter is not None:
            backend = (self.info or {}).get("backend", "")
            where = "CPU" if backend == "CPU" else ("GPU" if backend else "")
            self.gauges.show_reply(self.meter, self.rolling, self.plain_cost.value, where, self._mode)

    def _on_finished(self, fin: Finished | None) -> None:
        if self._shut:  # a late event after the window closed
            return
        self._render_timer.stop()
        meter, w = self.meter, self._reply_widget
        self._set_generating(False)
        if meter is None or w is None:
            return
        if fin is None:  # cancelled before it started
            self._discard_reply()
            self.replyFinished.emit("cancelled")
            return
        meter.finish(fin)
        self.rolling.add(meter)
        stats = meter.to_stats()
        text = fin.text
        if text or fin.reason != "cancelled":
            msg = self.store.add_message(self._reply_conv, "assistant", text, stats)
            w.message_id = msg.id
        visible = self.conversation is not None and self.conversation.id == self._reply_conv
        if visible:
            if text or fin.reason != "cancelled":
                self._dirty = True
                self._render_reply()
                w.text = text
                if self.highlight_action.isChecked():
                    w.set_highlight(_spans(stats))
                else:
                    w.set_text(text)
                w.set_stats(stats)
            else:
                self.chat.remove_from(len(self.chat.messages) - 1)
        self._show_gauges()
        self._reply_widget = None
        self._update_actions()
        self._refresh_conversations()
        self.replyFinished.emit(fin.reason)

    def _on_failed(self, message: str, crashed: bool) -> None:
        if self._shut:  # a late event after the window closed
            return
        if not self.generating:  # e.g. a failure outside a reply
            self.statusBar().showMessage(message, 10000)
            return
        self._render_timer.stop()
        self._set_generating(False)
        partial = "".join(self._reply_text)
        if self._reply_widget is not None:
            if partial:
                stats = self.meter.to_stats() if self.meter else {}
                stats["reason"] = "error"
                msg = self.store.add_message(self._reply_conv, "assistant", partial, stats)
                self._reply_widget.message_id = msg.id
                self._reply_widget.set_text(partial)
                self._reply_widget.set_stats(stats)
                self._reply_widget.set_info("interrupted")
            else:
                self._discard_reply()
        self._reply_widget = None
        if crashed:
            message += " Restarting it with the same models; your conversation is kept."
        err = self.store.add_message(self._reply_conv, "error", message)
        if self.conversation and self.conversation.id == self._reply_conv:
            self._wire_message(self.chat.add_message("error", message, message_id=err.id))
        self._update_actions()
        self.replyFailed.emit(message)

    def _discard_reply(self) -> None:
        if (
            self._reply_widget is not None
            and self.chat.messages
            and self.chat.messages[-1] is self._reply_widget
        ):
            self.chat.remove_from(len(self.chat.messages) - 1)
        self._reply_widget = None
        self._update_actions()

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
            if w is self._reply_widget and self.meter is not None:
                w.set_highlight(list(self.meter.draft_spans) if on else None)
            else:
                w.set_highlight(_spans(w.stats) if on else None)

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
        backend = _backend_text(self.info) if self.info else "no model loaded"
        return (
            f"<h3>Tandem {__version__}</h3>"
            "<p>Local LLMs that answer faster with exactly the same words: lossless speculative "
            "decoding over llama.cpp.</p>"
            f"<p>Engine: llama.cpp through llama-cpp-python {_package_version('llama-cpp-python')}; "
            f"{_esc(backend)}<br>"
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
        if self._shut:
            return
        self._shut = True
        self._memory_timer.stop()
        self._render_timer.stop()
        self._save_system_prompt()
        self.store.set_meta("window_geometry", bytes(self.saveGeometry().toBase64().data()).decode())
        self.store.set_meta("splitter_sizes", ",".join(str(s) for s in self.splitter.sizes()))
        self.worker.shutdown()
        self.store.close()
        self._gc.stop()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # e.g. a frozen app without dist-info
        return "(version unknown)"


def _spans(stats: dict[str, Any]) -> list[tuple[int, int]]:
    return [tuple(s) for s in stats.get("draft_spans") or []]  # type: ignore[misc]


def _esc(text: str) -> str:
    import html

    return html.escape(text).replace("\n", "<br>")


def _backend_text(info: dict[str, Any]) -> str:
    backend = info.get("backend", "?")
    devices = info.get("devices") or []
    gpus = [d for d in devices if d.get("kind") != "CPU"]
    dev = gpus[0] if gpus else (devices[0] if devices else None)
    if dev is None:
        return backend
    name = dev.get("description") or dev.get("name") or ""
    mem = dev.get("memory_total")
    extra = f" ({_fmt_bytes(mem)})" if gpus and mem else ""
    return f"{backend} · {name}{extra}"
