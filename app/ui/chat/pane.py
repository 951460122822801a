"""The chat pane: the open conversation's header, its messages, the composer and Send, over the session.

`ChatPane` sends the composer's text (a message sent while a pair loads waits, said so in the chat, and
is sent once the pair is ready), stops, regenerates and edits the last message, and keeps Send, the
messages' buttons and the chat's placeholder in step with the session. It builds the sidebar
(`conversations`, placed by the window) and the reply stream (`reply`) it drives.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.ui.chat.chat_view import ChatView, MessageWidget
from app.ui.chat.composer import Composer
from app.ui.chat.conversations import NEW_TITLE, ConversationsView
from app.ui.chat.gauges import GaugesPanel
from app.ui.chat.reply_stream import ReplyStream, draft_spans
from app.ui.core.session import Session
from app.ui.shared.richtext import escape_lines

__all__ = ["ChatPane"]

STOP_STYLE = "QPushButton { background: #d1453b; } QPushButton:hover { background: #b93a31; }"
LOADING_NOTE = "waiting: the model is loading, this message is sent once it is ready"


class ChatPane(QWidget):
    """Header, messages, composer and Send of the session's open conversation."""

    loadRequested = Signal()  # the placeholder's "Load model files…" link

    def __init__(self, session: Session, gauges: GaugesPanel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.chat = ChatView()
        self.composer = Composer()
        self.conversations = ConversationsView(session, self.chat, self.composer)
        self.reply = ReplyStream(session, self.chat, gauges)
        self.waiting: tuple[int, int] | None = None  # (conversation, message) sent while a pair loads

        cl = QVBoxLayout(self)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.conversations.header)
        self.chat.placeholder.linkActivated.connect(lambda link: link == "load" and self.loadRequested.emit())
        cl.addWidget(self.chat, 1)
        box = QFrame()
        box.setObjectName("composerBox")
        bl = QHBoxLayout(box)
        bl.setContentsMargins(16, 10, 16, 12)
        self.composer.submitted.connect(self.send)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.clicked.connect(self._send_or_stop)
        bl.addWidget(self.composer, 1)
        bl.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        cl.addWidget(box)

        self.chat.regenerateRequested.connect(self.regenerate)
        self.chat.editRequested.connect(self.edit_last)
        self.reply.finished.connect(lambda _reason: self.conversations.refresh())
        self.reply.finished.connect(self.update_actions)
        self.reply.failed.connect(self.update_actions)
        session.stateChanged.connect(self.update_actions)
        session.stateChanged.connect(self.show_placeholder)
        session.conversationChanged.connect(self.update_actions)
        session.generatingChanged.connect(self._show_generating)
        session.highlightChanged.connect(self.set_highlight)
        session.pairLoaded.connect(self._on_loaded)
        session.loadFailed.connect(self._on_load_failed)

    # -- the session's state ------------------------------------------------------------------------
    def _on_loaded(self, _info: object) -> None:
        if self.waiting is not None:
            self._send_waiting()

    def _on_load_failed(self, message: str) -> None:
        if self.waiting is not None:
            widget = self._waiting_widget()
            if widget is not None:
                widget.set_info("not sent: the model did not load (Edit to send it again)")
            self.waiting = None
        if not self.chat.messages:
            self.chat.set_placeholder(
                f"<b>Could not load the model</b><br>{escape_lines(message)}<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.add_message("error", f"Could not load the model: {message}")

    def show_placeholder(self) -> None:
        """What the empty chat says: ready, loading, or that no model is loaded."""
        s = self.session
        if s.info:
            self.chat.set_placeholder("<b>Ready.</b><br>Type a message below to start.")
        elif not s.loading:
            self.chat.set_placeholder(
                "<b>No model loaded — choose one.</b><br><br>"
                "Pick a target GGUF and, optionally, a smaller draft model that shares its tokenizer.<br><br>"
                '<a href="load">Load model files…</a>'
            )
        else:
            self.chat.set_placeholder("<b>Loading the model…</b>")

    def _show_generating(self, on: bool) -> None:
        self.send_button.setText("Stop" if on else "Send")
        self.send_button.setStyleSheet(STOP_STYLE if on else "")

    def update_actions(self, _why: object = None) -> None:
        """Enable Send and the messages' buttons that apply now."""
        s = self.session
        ready, generating = s.ready, s.generating
        # a message sent while a pair loads waits for it
        self.send_button.setEnabled(generating or ready or s.loading)
        msgs = self.chat.messages
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        for i, m in enumerate(msgs):
            idle = not generating
            m.set_actions(
                edit=idle and i == last_user,
                regenerate=idle and ready and i == len(msgs) - 1 and m.role in ("assistant", "error"),
            )

    # -- chatting -----------------------------------------------------------------------------------
    def _send_or_stop(self) -> None:
        if self.session.generating:
            self.session.stop()
        else:
            self.send()

    def send(self) -> None:
        """Send the composer's text as a user message and stream the reply (once a loading pair is
        ready)."""
        s = self.session
        text = self.composer.toPlainText().strip()
        if not text:
            return
        if s.generating:
            s.notify("A reply is still being written: Stop it first (Esc).", 4000)
            return
        if not s.info and not s.loading:
            s.notify("Load a model first (File › Load model files…).", 5000)
            return
        self.composer.clear()
        waiting = self._waiting_widget()
        if waiting is not None:  # a second message while the first waits: both go as one
            waiting.set_text(f"{waiting.text}\n\n{text}")
            s.store.update_message(waiting.message_id, waiting.text)
            return
        if s.conversation is None:
            s.set_conversation(s.store.create())
        conv = s.conversation
        assert conv is not None
        if conv.title == NEW_TITLE:
            self.conversations.set_title(" ".join(text.split())[:48])
        msg = s.store.add_message(conv.id, "user", text)
        widget = self.chat.add_message("user", text, message_id=msg.id)
        self.conversations.refresh()
        if s.loading:  # sent as soon as the pair is loaded
            self.waiting = (conv.id, msg.id)
            widget.set_info(LOADING_NOTE)
            self.update_actions()
            return
        self.reply.start(self.conversations.history())

    def _send_waiting(self) -> None:
        """Send the message that waited for the pair to load (if it is still its chat's last)."""
        waiting, self.waiting = self.waiting, None
        if waiting is None or self.session.generating:
            return
        conversation_id, message_id = waiting
        msgs = self.session.store.messages(conversation_id)
        if not msgs or msgs[-1].id != message_id:
            return  # edited or deleted meanwhile
        conv = self.session.conversation
        if conv is None or conv.id != conversation_id:
            self.conversations.open_conversation(conversation_id)
        if self.chat.messages:
            self.chat.messages[-1].set_info("")
        self.reply.start(self.conversations.history())

    def _waiting_widget(self) -> MessageWidget | None:
        """The chat's message that waits for the pair to load, if it is shown."""
        conv = self.session.conversation
        if self.waiting is None or conv is None or conv.id != self.waiting[0]:
            return None
        return next((m for m in self.chat.messages if m.message_id == self.waiting[1]), None)

    def regenerate(self) -> None:
        """Drop the last reply (or error) and generate it again."""
        s = self.session
        if s.generating or not s.info or s.conversation is None:
            return
        msgs = s.store.messages(s.conversation.id)
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if last_user is None:
            return
        if last_user + 1 < len(msgs):
            s.store.delete_messages_from(s.conversation.id, msgs[last_user + 1].id)
            self.chat.remove_from(last_user + 1)
        self.reply.start(self.conversations.history())

    def edit_last(self) -> None:
        """Put the last user message back in the composer and remove it (and its reply) from the chat."""
        s = self.session
        if s.generating or s.conversation is None:
            return
        msgs = s.store.messages(s.conversation.id)
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if last_user is None:
            return
        s.store.delete_messages_from(s.conversation.id, msgs[last_user].id)
        self.chat.remove_from(last_user)
        self.composer.setPlainText(msgs[last_user].content)
        self.composer.setFocus()
        cursor = self.composer.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.composer.setTextCursor(cursor)
        self.update_actions()

    def set_highlight(self, on: bool) -> None:
        """Tint the text of accepted draft tokens (replies shown as plain text while on)."""
        for w in self.chat.messages:
            if w.role != "assistant":
                continue
            if w is self.reply.widget and self.reply.meter is not None:
                w.set_highlight(list(self.reply.meter.draft_spans) if on else None)
            else:
                w.set_highlight(draft_spans(w.saved) if on else None)
