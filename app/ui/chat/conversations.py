"""The conversations: the sidebar listing the chats in the store (opened, started, renamed, deleted) and
the header above the chat with the open conversation's title and system prompt, saved as it is typed."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.chat.chat_view import ChatView
from app.ui.chat.reply_stream import draft_spans, history_doc
from app.ui.core.session import Session
from app.ui.core.store import Conversation

__all__ = ["NEW_TITLE", "ConversationsView"]

NEW_TITLE = "New chat"
PROMPT_SAVE_DELAY_MS = 400  # the system prompt is saved this long after the last keystroke


class ConversationsView(QFrame):
    """The sidebar: New chat and the list of the session's conversations; the open one (the session's
    ``conversation``) is shown in ``chat`` under ``header`` (its title and system prompt)."""

    def __init__(self, session: Session, chat: ChatView, composer: QWidget) -> None:
        super().__init__()
        self.session, self.chat, self.composer = session, chat, composer
        self.store = session.store
        self.setObjectName("sidebar")
        self.setMinimumWidth(190)
        sl = QVBoxLayout(self)
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
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(PROMPT_SAVE_DELAY_MS)
        self._prompt_timer.timeout.connect(self.save_system_prompt)
        self.header = self._build_header()

    def _build_header(self) -> QWidget:
        box = QWidget()
        cl = QVBoxLayout(box)
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
        return box

    @property
    def conversation(self) -> Conversation | None:
        """The open conversation (the session's)."""
        return self.session.conversation

    def refresh(self) -> None:
        """List the store's conversations, the open one selected."""
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
        s, chat = self.session, self.chat
        if self.conversation and self.conversation.id == conversation_id and chat.messages:
            return
        if s.generating:
            s.stop()
        self.save_system_prompt()
        conv = self.store.get(conversation_id)
        if conv is None:
            return
        self.title_label.setText(conv.title or NEW_TITLE)
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(conv.system_prompt)
        self.system_prompt.blockSignals(False)
        self.system_toggle.setChecked(bool(conv.system_prompt))
        chat.clear()
        for msg in self.store.messages(conv.id):
            w = chat.add_message(msg.role, msg.content, msg.saved, msg.id)
            if s.highlight and msg.role == "assistant":
                w.set_highlight(draft_spans(msg.saved))
        chat.scroll_to_bottom()
        s.set_conversation(conv)
        self.refresh()

    def new_conversation(self) -> None:
        """Start a new chat (reuses the current one if it is still empty)."""
        if self.conversation and not self.chat.messages and not self.session.generating:
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
        title, ok = QInputDialog.getText(self.window(), "Rename chat", "Title:", text=conv.title)
        if ok and title.strip():
            self.store.rename(conv.id, title.strip())
            if self.conversation and self.conversation.id == conv.id:
                self.conversation.title = title.strip()
                self.title_label.setText(title.strip())
            self.refresh()

    def delete_conversation(self, conversation_id: int | None = None, confirm: bool = True) -> None:
        s = self.session
        cid = conversation_id or (self.conversation.id if self.conversation else None)
        conv = self.store.get(cid) if cid else None
        if conv is None:
            return
        if (
            confirm
            and QMessageBox.question(self.window(), "Delete chat", f"Delete “{conv.title}”?")
            != QMessageBox.StandardButton.Yes
        ):
            return
        if s.generating and s.streaming_conversation == conv.id:
            s.stop()
        self.store.delete(conv.id)
        s.worker.history("remove", [history_doc(conv.id)])  # its tokens leave the drafting history
        if self.conversation and self.conversation.id == conv.id:
            s.set_conversation(None)
            rest = self.store.conversations()
            self.open_conversation((rest[0] if rest else self.store.create()).id)
        self.refresh()

    def _conversation_menu(self, pos: Any) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self.window())
        menu.addAction("Rename…", lambda: self.rename_conversation(cid))
        menu.addAction("Delete", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    # -- the open chat's title and system prompt ----------------------------------------------------
    def set_title(self, title: str) -> None:
        """Rename the open conversation (its first message names it)."""
        assert self.conversation is not None
        self.store.rename(self.conversation.id, title)
        self.conversation.title = title
        self.title_label.setText(title)

    def _show_system_prompt(self, shown: bool) -> None:
        self.system_box.setVisible(shown)

    def _prompt_timer_start(self) -> None:
        self._prompt_timer.start()

    def save_system_prompt(self) -> None:
        self._prompt_timer.stop()
        if self.conversation is None:
            return
        text = self.system_prompt.toPlainText()
        if text != self.conversation.system_prompt:
            self.store.set_system_prompt(self.conversation.id, text)
            self.conversation.system_prompt = text

    def history(self) -> list[dict[str, str]]:
        """The open conversation as chat messages for the engine (system prompt first, errors left out)."""
        assert self.conversation is not None
        self.save_system_prompt()
        out: list[dict[str, str]] = []
        if self.conversation.system_prompt.strip():
            out.append({"role": "system", "content": self.conversation.system_prompt})
        out += [
            {"role": m.role, "content": m.content}
            for m in self.store.messages(self.conversation.id)
            if m.role in ("user", "assistant")
        ]
        return out
