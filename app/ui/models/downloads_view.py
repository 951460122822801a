"""The Downloads tab: the queue of `app.ui.models.downloads.DownloadManager`, per model a progress bar
(one for every part of a split model), bytes, speed, ETA, Cancel/Resume, and readable error messages (gated
repository, not found, offline, disk full)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.models.downloads import CANCELLED, DONE, DOWNLOADING, FAILED, QUEUED, DownloadManager
from models_registry.units import format_bytes

__all__ = ["DownloadRow", "DownloadsView", "fmt_eta", "fmt_speed"]


def fmt_speed(bps: float) -> str:
    """A download speed (``12.3 MB/s``); a dash while unknown."""
    return f"{format_bytes(bps)}/s" if bps > 0 else "–"


def fmt_eta(seconds: float | None) -> str:
    """Time left (``1 min 15 s``); a dash while unknown."""
    if seconds is None:
        return "–"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


_KIND_TITLE = {
    "gated": "Access needed",
    "not-found": "Not found",
    "offline": "Offline",
    "disk": "Disk full",
    "integrity": "Corrupt download",
    "transfer": "Network error",
    "error": "Failed",
}


_ROW_STYLE = """
#downloadRow { background: #ffffff; border: 1px solid #e1e4e8; border-radius: 8px; }
#downloadName { font-weight: 600; color: #24292f; }
#downloadStatus { color: #57606a; }
#downloadError { color: #a40e26; background: #ffebe9; border-radius: 5px; padding: 4px 6px; }
#downloadRow QProgressBar { border: none; background: #eaecef; border-radius: 3px; max-height: 6px; }
#downloadRow QProgressBar::chunk { background: #2f6fde; border-radius: 3px; }
#downloadRow[state="done"] QProgressBar::chunk { background: #1a7f37; }
#downloadRow[state="failed"] QProgressBar::chunk { background: #cf222e; }
#downloadRow[state="cancelled"] QProgressBar::chunk { background: #8c959f; }
"""


class DownloadRow(QFrame):
    """One item of the queue: name, progress bar, figures, error, and Cancel / Resume / Remove."""

    def __init__(self, manager: DownloadManager, key: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.manager, self.key = manager, key
        self.setObjectName("downloadRow")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(4)
        top = QHBoxLayout()
        self.name = QLabel()
        self.name.setObjectName("downloadName")
        self.name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.name.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.cancel_button = QPushButton("Cancel")
        self.resume_button = QPushButton("Resume")
        self.remove_button = QPushButton("Remove")
        for b in (self.cancel_button, self.resume_button, self.remove_button):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
        self.cancel_button.clicked.connect(lambda: manager.cancel(key))
        self.resume_button.clicked.connect(lambda: manager.resume(key))
        self.remove_button.clicked.connect(lambda: manager.remove(key))
        top.addWidget(self.name, 1)
        top.addWidget(self.cancel_button)
        top.addWidget(self.resume_button)
        top.addWidget(self.remove_button)
        lay.addLayout(top)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        lay.addWidget(self.bar)
        self.status = QLabel()
        self.status.setObjectName("downloadStatus")
        lay.addWidget(self.status)
        self.error = QLabel()
        self.error.setObjectName("downloadError")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setVisible(False)
        lay.addWidget(self.error)
        self.update_from_item()

    def update_from_item(self) -> None:
        item = self.manager.items.get(self.key)
        if item is None:
            return
        parts = item.parts
        self.name.setText(item.name)
        self.name.setToolTip("\n".join(f"{item.repo_id}/{p}" for p in parts))
        self.bar.setValue(int(item.fraction * 1000))
        total = item.total or item.expected_size
        figures = f"{format_bytes(item.done)} of {format_bytes(total)}"
        if len(parts) > 1:
            figures += f" ({len(parts)} parts)"
        if item.state == DOWNLOADING:
            text = f"{figures} · {fmt_speed(item.speed)} · {fmt_eta(item.eta)} left"
        elif item.state == QUEUED:
            text = f"Queued · {format_bytes(total)}" + (
                f" ({format_bytes(item.done)} already here)" if item.done else ""
            )
        elif item.state == DONE:
            text = f"Done · {format_bytes(item.total)}" + (f" ({len(parts)} parts)" if len(parts) > 1 else "")
        elif item.state == CANCELLED:
            text = f"Cancelled at {figures} · the partial file is kept: Resume continues from there"
        else:
            text = f"{_KIND_TITLE.get(item.error_kind, 'Failed')} · {figures}"
        self.status.setText(text)
        self.error.setText(item.error)
        self.error.setVisible(item.state == FAILED and bool(item.error))
        self.cancel_button.setVisible(item.active)
        self.resume_button.setVisible(item.state in (CANCELLED, FAILED))
        self.resume_button.setText("Retry" if item.state == FAILED and not item.done else "Resume")
        self.remove_button.setVisible(not item.active)
        if self.property("state") != item.state:
            self.setProperty("state", item.state)
            self.style().unpolish(self)
            self.style().polish(self)


class DownloadsView(QWidget):
    """The download queue, newest last, with a summary line and "Clear finished"."""

    def __init__(self, manager: DownloadManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.manager = manager
        self.rows: dict[int, DownloadRow] = {}
        self.setStyleSheet(_ROW_STYLE)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        head = QHBoxLayout()
        self.summary = QLabel()
        self.summary.setObjectName("downloadsSummary")
        self.clear_button = QPushButton("Clear finished")
        self.clear_button.clicked.connect(manager.clear_finished)
        head.addWidget(self.summary, 1)
        head.addWidget(self.clear_button)
        lay.addLayout(head)
        self.empty = QLabel(
            "No downloads yet. Pick a pair in the Catalog tab and press Download; downloads resume where "
            "they stopped, even after a restart."
        )
        self.empty.setWordWrap(True)
        self.empty.setObjectName("downloadStatus")
        lay.addWidget(self.empty)
        inner = QWidget()
        self.list_layout = QVBoxLayout(inner)
        self.list_layout.setContentsMargins(0, 0, 0, 0)
        self.list_layout.setSpacing(6)
        self.list_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        lay.addWidget(scroll, 1)
        manager.added.connect(self._add)
        manager.changed.connect(self._changed)
        manager.removed.connect(self._removed)
        for key in manager.items:
            self._add(key)
        self._summarise()

    def _add(self, key: int) -> None:
        if key in self.rows:
            return
        row = DownloadRow(self.manager, key)
        self.rows[key] = row
        self.list_layout.insertWidget(self.list_layout.count() - 1, row)
        self._summarise()

    def _changed(self, key: int) -> None:
        row = self.rows.get(key)
        if row is not None:
            row.update_from_item()
        self._summarise()

    def _removed(self, key: int) -> None:
        row = self.rows.pop(key, None)
        if row is not None:
            row.setParent(None)
            row.deleteLater()
        self._summarise()

    def _summarise(self) -> None:
        items = list(self.manager.items.values())
        running = sum(it.state == DOWNLOADING for it in items)
        queued = sum(it.state == QUEUED for it in items)
        failed = sum(it.state == FAILED for it in items)
        done = sum(it.state == DONE for it in items)
        parts = [f"{running} downloading" if running else "", f"{queued} queued" if queued else "",
                 f"{failed} failed" if failed else "", f"{done} done" if done else ""]  # fmt: skip
        self.summary.setText(", ".join(p for p in parts if p) or "Nothing queued")
        self.empty.setVisible(not items)
        self.clear_button.setEnabled(done > 0)
