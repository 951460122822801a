"""The gauges panel: live figures of speculative decoding beside the chat, and its sparkline plot."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QCheckBox, QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from app.engine import Mode
from app.ui.shared.markdown import DRAFT_TINT
from app.ui.shared.metrics import ReplyMeter, Rolling
from app.ui.shared.wording import status_text

ACCENT = QColor("#2f6fde")
PAUSED_STYLE = "background: #fff4e0; color: #7a4b00;"
MAX_POINTS = 120


class Sparkline(QWidget):
    """A small line plot of ``(x, y)`` points (decode tokens/s over the reply's decode time)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._points: list[tuple[float, float]] = []
        self.setMinimumHeight(54)
        self.setAccessibleName("decode speed over the reply")

    def sizeHint(self) -> QSize:
        return QSize(220, 54)

    def set_points(self, points: Sequence[tuple[float, float]]) -> None:
        if len(points) > MAX_POINTS:  # decimate: keep the shape, bound the painting cost
            stride = len(points) / MAX_POINTS
            points = [points[int(i * stride)] for i in range(MAX_POINTS)] + [points[-1]]
        self._points = list(points)
        self.update()

    def paintEvent(self, event: object) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(1, 4, -1, -2)
        p.setPen(QPen(QColor("#e3e6ea"), 1))
        p.drawLine(rect.bottomLeft(), rect.bottomRight())
        pts = self._points
        if len(pts) < 2:
            p.setPen(QColor("#8c959f"))
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "tokens/s plot")
            return
        x0, x1 = pts[0][0], pts[-1][0]
        ymax = max(y for _, y in pts) * 1.1 or 1.0
        span = (x1 - x0) or 1.0

        def at(x: float, y: float) -> QPointF:
            return QPointF(
                rect.left() + (x - x0) / span * rect.width(), rect.bottom() - y / ymax * rect.height()
            )

        line = QPainterPath(at(*pts[0]))
        for x, y in pts[1:]:
            line.lineTo(at(x, y))
        area = QPainterPath(line)
        area.lineTo(QPointF(rect.right(), rect.bottom()))
        area.lineTo(QPointF(rect.left(), rect.bottom()))
        area.closeSubpath()
        grad = QLinearGradient(rect.topLeft(), rect.bottomLeft())
        top = QColor(ACCENT)
        top.setAlpha(70)
        bottom = QColor(ACCENT)
        bottom.setAlpha(5)
        grad.setColorAt(0, top)
        grad.setColorAt(1, bottom)
        p.fillPath(area, grad)
        p.setPen(QPen(ACCENT, 1.6))
        p.drawPath(line)
        p.setPen(QColor("#57606a"))
        p.drawText(
            rect.adjusted(2, 0, 0, 0),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop,
            f"max {ymax / 1.1:.0f}",
        )


class _Figure(QWidget):
    """A caption, a big value and a small note."""

    def __init__(self, caption: str, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setObjectName("gaugeCaption")
        self.value = QLabel("–")
        self.value.setObjectName("gaugeValue")
        self.note = QLabel("")
        self.note.setObjectName("gaugeNote")
        self.note.setWordWrap(True)
        for w in (self.caption, self.value, self.note):
            layout.addWidget(w)

    def set(self, value: str, note: str = "") -> None:
        self.value.setText(value)
        self.note.setText(note)
        self.note.setVisible(bool(note))


class GaugesPanel(QFrame):
    """Acceptance, speed, accepted tokens per round, time to first token, speedup and drafting status."""

    highlightToggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("gauges")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 12, 14, 12)
        outer.setSpacing(10)
        grid = QGridLayout()
        grid.setHorizontalSpacing(16)
        grid.setVerticalSpacing(12)
        self.acceptance = _Figure("Acceptance")
        self.speedup = _Figure("Speedup (estimated)")
        self.per_round = _Figure("Accepted / round")
        self.ttft = _Figure("First token")
        grid.addWidget(self.acceptance, 0, 0)
        grid.addWidget(self.speedup, 0, 1)
        grid.addWidget(self.per_round, 1, 0)
        grid.addWidget(self.ttft, 1, 1)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 1)
        outer.addLayout(grid)
        self.speed = _Figure("Decode speed")
        outer.addWidget(self.speed)
        self.plot = Sparkline()
        outer.addWidget(self.plot)
        self.status = QLabel("")
        self.status.setObjectName("draftStatus")
        self.status.setWordWrap(True)
        outer.addWidget(self.status)
        self.highlight = QCheckBox("Highlight drafted tokens")
        self.highlight.setToolTip(
            "Tint the text whose tokens the draft proposed and the target accepted.\n"
            "Shows replies as plain text while on. Each round's text is split between its tokens in\n"
            "proportion to their count (an approximation: the engine reports tokens, not their text)."
        )
        self.highlight.toggled.connect(self.highlightToggled)
        legend = QLabel(
            f'<span style="background-color:{DRAFT_TINT};">&nbsp;drafted&nbsp;</span> '
            "= proposed by the draft, accepted by the target"
        )
        legend.setObjectName("gaugeNote")
        legend.setWordWrap(True)
        outer.addWidget(self.highlight)
        outer.addWidget(legend)
        self._below = QVBoxLayout()
        outer.addLayout(self._below)
        outer.addStretch(1)
        self.reset()

    def add_below(self, widget: QWidget) -> None:
        """Add a widget under the figures (the speed check)."""
        self._below.addWidget(widget)

    def reset(self) -> None:
        for fig in (self.acceptance, self.speedup, self.per_round, self.ttft, self.speed):
            fig.set("–")
        self.plot.set_points([])
        self.status.setText("")

    def show_reply(
        self,
        meter: ReplyMeter,
        rolling: Rolling,
        plain_step: float | None,
        backend: str = "",
        mode: Mode | None = None,
    ) -> None:
        """Show ``meter``'s figures (called at most ~30 times a second while a reply streams)."""
        acc = meter.acceptance
        roll = rolling.acceptance(meter if meter.finished is None else None)
        n = rolling.count + (meter.finished is None and meter.n_drafted > 0)
        self.acceptance.set(
            _pct(acc), f"last {n} repl{'y' if n == 1 else 'ies'}: {_pct(roll)}" if roll is not None else ""
        )
        tps = meter.tokens_per_second
        self.speed.set(
            f"{tps:.1f} tok/s" if tps else "–", f"{meter.n_tokens} tokens in {meter.rounds} rounds"
        )
        self.plot.set_points(meter.rates)
        ma, tpr = meter.mean_accepted, meter.tokens_per_round
        self.per_round.set(f"{ma:.2f}" if ma is not None else "–", f"{tpr:.2f} tokens/round" if tpr else "")
        self.ttft.set(_seconds(meter.ttft), f"prompt {meter.n_prompt} tok, {meter.n_prompt_cached} cached")
        sp = meter.speedup(plain_step)
        self.speedup.set(
            f"{sp:.2f}×" if sp else "–", "vs plain decoding" if sp else "plain cost not measured yet"
        )
        self.status.setText(status_text(meter, backend, mode))
        # (a per-widget style sheet: QStyle.polish/unpolish corrupt refcounts in PySide6 6.12)
        self.status.setStyleSheet(PAUSED_STYLE if meter.paused else "")


def _pct(x: float | None) -> str:
    return f"{x * 100:.0f}%" if x is not None else "–"


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"
