""" "Does speculation pay here?": a button under the gauges that measures plain decoding against the
current mode on the user's own recent prompts (see :mod:`app.speedcheck`), and shows the result."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.speedcheck import CheckResult, describe, recent_prompts
from app.ui.core.session import Session

PROMPTS = 4  # of the user's own, when there are that many


class SpeedCheckView(QWidget):
    """The button, a progress bar while it runs, and the last result. While it runs the session is busy
    (no reply starts); it is enabled while the session's local pair is ready and nothing generates."""

    finished = Signal(object)  # CheckResult or None

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.worker, self.store = session.worker, session.store
        self.running = False
        self.result: CheckResult | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.button = QPushButton("Does speculation pay here?")
        self.button.setToolTip(
            "Runs plain decoding and the current mode on a few of your recent prompts (or built-in ones),\n"
            "interleaved, greedy, on the loaded models; shows the speedup, its spread and the acceptance."
        )
        self.button.clicked.connect(self.start)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(6)
        self.progress.setVisible(False)
        self.label = QLabel("")
        self.label.setObjectName("gaugeNote")
        self.label.setWordWrap(True)
        for w in (self.button, self.progress, self.label):
            lay.addWidget(w)
        self.worker.checkProgress.connect(self._on_progress)
        self.worker.checked.connect(self._on_checked)
        session.stateChanged.connect(self._follow)
        self._follow()

    def _follow(self) -> None:
        """Enabled when the local pair is loaded and nothing is generating."""
        s = self.session
        self.button.setEnabled(s.ready and not s.generating and s.remote is None and not self.running)

    def start(self) -> None:
        if self.running:
            return
        prompts = recent_prompts(self.store.recent_user_messages(40), PROMPTS)
        self.running = True
        self.session.set_busy_elsewhere(True)
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self.label.setText("Measuring plain decoding and the current mode…")
        self.worker.check(prompts, self.session.generation())

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def _on_checked(self, result: CheckResult | None) -> None:
        self.running = False
        self.progress.setVisible(False)
        self.session.set_busy_elsewhere(False)
        self.result = result
        self.label.setText(describe(result) if result is not None else "The check was stopped.")
        self.finished.emit(result)
