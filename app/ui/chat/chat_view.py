"""The message view: a scrolling column of messages, rendered Markdown, code blocks with Copy buttons."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.shared.markdown import (
    Segment,
    draft_html,
    plain_text_html,
    render_code,
    render_prose,
    split_segments,
)
from app.ui.shared.saved import SavedReply
from app.ui.shared.wording import MODE_NAMES, REASON_NAMES

COLUMN_WIDTH = 860
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "error": "Error"}


def _flash(button: QToolButton | QPushButton, text: str = "Copied") -> None:
    old = button.text()
    button.setText(text)
    QTimer.singleShot(1200, lambda: button.setText(old))


class CachedLabel(QLabel):
    """A rich-text label that remembers its size for each width until its text changes.

    A word-wrapped rich-text QLabel lays out its whole document on every size query, and a layout pass
    asks every label of the conversation several times: without the cache, each streaming update
    would re-layout the entire chat.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._sizes: dict[object, object] = {}

    def setText(self, text: str) -> None:
        if text == self.text():
            return
        self._sizes.clear()
        super().setText(text)

    def heightForWidth(self, width: int) -> int:
        h = self._sizes.get(width)
        if h is None:
            h = self._sizes[width] = super().heightForWidth(width)
        return h  # type: ignore[return-value]

    def sizeHint(self) -> QSize:
        h = self._sizes.get("hint")
        if h is None:
            h = self._sizes["hint"] = super().sizeHint()
        return h  # type: ignore[return-value]

    def minimumSizeHint(self) -> QSize:
        h = self._sizes.get("min")
        if h is None:
            h = self._sizes["min"] = super().minimumSizeHint()
        return h  # type: ignore[return-value]

    def changeEvent(self, e: QEvent) -> None:
        if e.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange, QEvent.Type.ContentsRectChange):
            self._sizes.clear()
        super().changeEvent(e)


class ProseBlock(CachedLabel):
    """A chunk of rendered Markdown."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setOpenExternalLinks(True)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self.setObjectName("prose")


class CodeBlock(QFrame):
    """A fenced code block: language, Copy button, syntax-highlighted code."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.code = ""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        header = QFrame()
        header.setObjectName("codeHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(10, 3, 4, 3)
        self.lang = QLabel()
        self.lang.setObjectName("codeLang")
        self.copy = QToolButton()
        self.copy.setText("Copy")
        self.copy.setObjectName("copyCode")
        self.copy.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy.clicked.connect(self._copy)
        hl.addWidget(self.lang)
        hl.addStretch(1)
        hl.addWidget(self.copy)
        self.body = CachedLabel()
        self.body.setObjectName("codeBody")
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.body.setContentsMargins(10, 8, 10, 8)
        layout.addWidget(header)
        layout.addWidget(self.body)

    def set_code(self, code: str, lang: str) -> None:
        self.code = code
        self.lang.setText(lang or "code")
        self.body.setText(render_code(code, lang))

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        _flash(self.copy)


class MessageWidget(QFrame):
    """One message. Assistant text is Markdown, re-rendered incrementally as it streams."""

    copyRequested = Signal()
    regenerateRequested = Signal()
    editRequested = Signal()

    def __init__(self, role: str, text: str = "", saved: SavedReply | None = None, message_id: int = 0):
        super().__init__()
        self.role = role
        self.message_id = message_id
        self.text = ""
        self.saved = saved
        self._segments: list[Segment] = []
        self._blocks: list[QWidget] = []
        self._highlight: Sequence[tuple[int, int]] | None = None
        self.setObjectName(f"message_{role}")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 8)
        layout.setSpacing(6)
        self.who = QLabel(ROLE_NAMES.get(role, role))
        self.who.setObjectName("who")
        layout.addWidget(self.who)
        self.body = QVBoxLayout()
        self.body.setSpacing(8)
        layout.addLayout(self.body)
        footer = QHBoxLayout()
        footer.setSpacing(4)
        self.info = QLabel("")
        self.info.setObjectName("messageInfo")
        footer.addWidget(self.info, 1)
        self.edit_button = self._button("Edit", "Edit this message and send it again", self.editRequested)
        self.regen_button = self._button("Regenerate", "Generate this reply again", self.regenerateRequested)
        self.copy_button = self._button("Copy", "Copy the whole message", self.copyRequested)
        self.copyRequested.connect(self._copy)
        for b in (self.edit_button, self.regen_button, self.copy_button):
            footer.addWidget(b)
        layout.addLayout(footer)
        self.set_actions(edit=False, regenerate=False)
        self.set_text(text)
        self.set_saved(saved)

    def _button(self, text: str, tip: str, signal: Signal) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setObjectName("messageAction")
        b.setCursor(Qt.CursorShape.PointingHandCursor)
        b.clicked.connect(signal)
        return b

    # -- content ------------------------------------------------------------------------------------
    def set_text(self, text: str) -> None:
        self.text = text
        self._render()

    def set_highlight(self, spans: Sequence[tuple[int, int]] | None) -> None:
        """Show drafted character ranges (plain text view), or None for rendered Markdown."""
        if spans is None and self._highlight is None:
            return
        self._highlight = spans
        self._clear_blocks()
        self._render()

    def _clear_blocks(self) -> None:
        for w in self._blocks:
            self.body.removeWidget(w)
            w.deleteLater()
        self._blocks, self._segments = [], []

    def _render(self) -> None:
        if self.role != "assistant" or self._highlight is not None:
            html = (
                draft_html(self.text, self._highlight)
                if self._highlight is not None
                else plain_text_html(self.text)
            )
            segments = [Segment("plain", html)]
        else:
            segments = split_segments(self.text)
        # keep the widgets of unchanged leading segments; re-render from the first difference
        same = 0
        while same < min(len(segments), len(self._segments)) and segments[same] == self._segments[same]:
            same += 1
        for i in range(same, len(segments)):
            seg = segments[i]
            old = self._blocks[i] if i < len(self._blocks) else None
            want = CodeBlock if seg.kind == "code" else ProseBlock
            if not isinstance(old, want):
                new = want()
                if old is None:
                    self.body.addWidget(new)
                    self._blocks.append(new)
                else:
                    self.body.replaceWidget(old, new)
                    old.deleteLater()
                    self._blocks[i] = new
                old = new
            if seg.kind == "code":
                old.set_code(seg.text, seg.lang)  # type: ignore[union-attr]
            elif seg.kind == "plain":
                old.setText(seg.text)  # type: ignore[union-attr]
            else:
                old.setText(render_prose(seg.text))  # type: ignore[union-attr]
        for w in self._blocks[len(segments) :]:
            self.body.removeWidget(w)
            w.deleteLater()
        del self._blocks[len(segments) :]
        self._segments = segments

    def set_saved(self, saved: SavedReply | None) -> None:
        """Show the reply's record (its figures) in the footer."""
        self.saved = saved
        self.info.setText(describe_stats(saved) if self.role == "assistant" else "")

    def set_info(self, text: str) -> None:
        self.info.setText(text)

    def set_actions(self, *, edit: bool, regenerate: bool) -> None:
        self.edit_button.setVisible(edit)
        self.regen_button.setVisible(regenerate)
        self.copy_button.setVisible(self.role != "error")

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        _flash(self.copy_button)


def describe_stats(saved: SavedReply | None) -> str:
    """A one-line summary of a reply's record for the message footer."""
    s = saved.stats if saved is not None else None
    if s is None:
        return ""
    parts = [f"{s.n_generated} tokens", f"{s.decode_tokens_per_second:.1f} tok/s"]
    if s.n_drafted:
        parts.append(f"{s.acceptance_rate * 100:.0f}% accepted")
    parts.append(MODE_NAMES.get(s.mode, str(s.mode)))
    if saved is not None and saved.reason is not None:
        parts.append(REASON_NAMES.get(saved.reason, ""))
    return " · ".join(p for p in parts if p)


class ChatView(QScrollArea):
    """The conversation: messages in a centred column; follows the bottom while it is scrolled there.
    A message's Regenerate and Edit buttons come out as the view's own signals."""

    regenerateRequested = Signal()
    editRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.NoFrame)
        inner = QWidget()
        inner.setObjectName("chatInner")
        row = QHBoxLayout(inner)
        row.setContentsMargins(16, 16, 16, 16)
        self.column = QWidget()
        self.column.setMaximumWidth(COLUMN_WIDTH)
        self.column_layout = QVBoxLayout(self.column)
        self.column_layout.setContentsMargins(0, 0, 0, 0)
        self.column_layout.setSpacing(12)
        self.placeholder = QLabel()
        self.placeholder.setObjectName("placeholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.column_layout.addWidget(self.placeholder)
        self.column_layout.addStretch(1)
        row.addStretch(0)
        row.addWidget(self.column, 1)
        row.addStretch(0)
        self.setWidget(inner)
        self.messages: list[MessageWidget] = []
        self._follow = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range)
        bar.valueChanged.connect(self._on_scroll)
        big = QFont(self.font())
        big.setPointSizeF(big.pointSizeF() * 1.15)
        self.placeholder.setFont(big)

    def set_placeholder(self, html: str) -> None:
        """Text shown while the conversation is empty."""
        self.placeholder.setText(html)
        self.placeholder.setVisible(not self.messages and bool(html))

    def clear(self) -> None:
        for m in self.messages:
            self.column_layout.removeWidget(m)
            m.deleteLater()
        self.messages = []
        self.placeholder.setVisible(bool(self.placeholder.text()))

    def add_message(
        self, role: str, text: str = "", saved: SavedReply | None = None, message_id: int = 0
    ) -> MessageWidget:
        w = MessageWidget(role, text, saved, message_id)
        w.regenerateRequested.connect(self.regenerateRequested)
        w.editRequested.connect(self.editRequested)
        self.column_layout.insertWidget(self.column_layout.count() - 1, w)
        self.messages.append(w)
        self.placeholder.setVisible(False)
        self._follow = True
        return w

    def remove_from(self, index: int) -> None:
        """Remove messages ``index`` and after."""
        for m in self.messages[index:]:
            self.column_layout.removeWidget(m)
            m.deleteLater()
        del self.messages[index:]
        self.placeholder.setVisible(not self.messages and bool(self.placeholder.text()))

    def scroll_to_bottom(self) -> None:
        self._follow = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    def _on_scroll(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 24
