"""The input box: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class Composer(QPlainTextEdit):
    """A growing plain-text box; emits ``submitted`` on Enter (without Shift)."""

    submitted = Signal()
    MAX_LINES = 8

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("composer")
        self.setPlaceholderText("Message  (Enter sends, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self.updateGeometry)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier)
        ):
            e.accept()
            self.submitted.emit()
            return
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):  # Shift+Enter: a plain new line
            self.insertPlainText("\n")
            e.accept()
            return
        super().keyPressEvent(e)

    def sizeHint(self) -> QSize:
        lines = min(max(self.document().blockCount(), 2), self.MAX_LINES)
        h = self.fontMetrics().lineSpacing() * lines + 18
        return QSize(super().sizeHint().width(), h)

    def minimumSizeHint(self) -> QSize:
        return QSize(100, self.fontMetrics().lineSpacing() * 2 + 18)
