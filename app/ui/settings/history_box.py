"""Settings › Drafting history: how much the history drafter has learned from the user's chats, whether
it learns, and "Forget drafting history". Nothing of it leaves the machine."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QGroupBox, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

from app.engine import HistoryInfo
from app.ui.core.workers import EngineWorker
from models_registry.units import format_bytes


class HistoryBox(QGroupBox):
    """The size of the drafting history of the loaded pair's tokenizer family, and its controls."""

    def __init__(self, worker: EngineWorker, learn: bool, parent: QWidget | None = None):
        super().__init__("Drafting history", parent)
        self.worker = worker
        lay = QVBoxLayout(self)
        self.learn = QCheckBox("Draft from my earlier conversations")
        self.learn.setChecked(learn)
        self.learn.setToolTip(
            "Tandem keeps the tokens of your chats on this computer and drafts from them: a revision of\n"
            "code or text you already have is then drafted in long, right stretches. Stays on this machine."
        )
        self.size = QLabel("…")
        self.size.setObjectName("gaugeNote")
        self.forget = QPushButton("Forget drafting history")
        self.forget.clicked.connect(self._forget)
        for w in (self.learn, self.size, self.forget):
            lay.addWidget(w)
        worker.historyInfo.connect(self.show_info)
        worker.history("info")

    def show_info(self, info: HistoryInfo) -> None:
        if not info.enabled:
            self.size.setText("Off for the loaded models (or none loaded).")
        elif not info.ready:
            self.size.setText("Loading…")
        else:
            self.size.setText(
                f"{format_bytes(info.size_bytes)} on disk: {info.tokens:,} tokens "
                f"from {info.documents} conversation{'s' if info.documents != 1 else ''}."
            )
        self.forget.setEnabled(info.enabled and info.tokens > 0)

    def _forget(self) -> None:
        if (
            QMessageBox.question(self, "Forget drafting history", "Forget everything drafting learned?")
            == QMessageBox.StandardButton.Yes
        ):
            self.worker.history("forget")
