"""The banner a machine without models sees: the catalog pair recommended for it (the largest expected to
answer at the usable speed, else the fastest), how fast it should answer, and Download."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QBoxLayout, QFrame, QLabel, QPushButton, QWidget

from app.ui.models.catalog_rows import PairRow, fit_badge
from app.ui.shared.richtext import escape
from models_registry.fit import MIN_SPEED, Choice, why

__all__ = ["RecommendBanner"]


class RecommendBanner(QFrame):
    """The recommended pair (size, fit, what it is good for) with a Download button (``button``)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("recommendBanner")
        self._layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._layout.setContentsMargins(14, 10, 14, 10)
        self.label = QLabel()
        self.label.setObjectName("recommendText")
        self.label.setWordWrap(True)
        self.button = QPushButton("Download")
        self.button.setObjectName("primaryButton")
        self._layout.addWidget(self.label, 1)
        self._layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignVCenter)

    def set_compact(self, compact: bool) -> None:
        """Stack the text above the button (a narrow pane) or put them side by side."""
        d = QBoxLayout.Direction
        self._layout.setDirection(d.TopToBottom if compact else d.LeftToRight)

    def show_row(self, r: PairRow | None, compact: bool = False, min_speed: float = MIN_SPEED) -> None:
        """Recommend ``r`` (picked for `min_speed` tokens/s), or say that no curated pair fits (``None``)."""
        if r is None:
            self.label.setText(
                "<span id='recommendTitle'><b>No curated pair fits this machine's memory</b></span><br>"
                "Try a smaller context size in Settings, or add your own GGUF files "
                "(Installed → Add folder…)."
            )
            self.button.setVisible(False)
            return
        badge = fit_badge(r.fit)
        speed = ""
        if r.speed is not None:
            how = "measured" if r.speed.source == "measured" else "expected"
            reason = why(Choice(r.fit, r.speed, r.target.params), min_speed)
            speed = f"<br>About <b>{r.speed.best:.0f} tokens/s</b> here ({how}): {escape(reason)}"
        self.label.setText(
            f"<b style='font-size:14px; color:#0b2e6f'>Recommended for this machine: {r.target.name} + "
            f"{r.draft.name}</b>{speed}<br>{r.size_text} download · <span style='color:{badge[1]}'><b>"
            f"{badge[0]}</b></span> ({r.fit.summary}) · {escape(r.pair.good_for)}"
        )
        active = r.status in ("downloading", "queued")
        self.button.setVisible(True)
        self.button.setEnabled(not active)
        self.button.setText(
            f"Downloading… {r.progress:.0%}" if active else "Download" if compact
            else f"Download ({r.size_text})"
        )  # fmt: skip
