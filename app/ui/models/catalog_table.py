"""The catalog table: a Qt model over `PairRow`s (fit, expected speed, status), a delegate painting fit and
status badges, and the view."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QCoreApplication,
    QModelIndex,
    QPersistentModelIndex,
    QRectF,
    QSize,
    Qt,
)
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
)

from app.ui.models.catalog_rows import PairRow, fit_badge, speed_label, speed_tooltip
from models_registry.fit import MIN_SPEED
from models_registry.units import format_bytes

__all__ = ["BadgeDelegate", "BadgeRole", "CatalogTable", "CatalogTableModel", "LinesRole", "RowRole"]

BadgeRole = Qt.ItemDataRole.UserRole + 1
RowRole = Qt.ItemDataRole.UserRole + 2
LinesRole = Qt.ItemDataRole.UserRole + 3  # (first line, second line, bold first line)


class CatalogTableModel(QAbstractTableModel):
    """Table model over `PairRow`s."""

    PAIR, SIZE, QUANT, LICENCE, GOOD_FOR, FIT, SPEED, STATUS = range(8)
    TARGET = PAIR  # the pair column shows the target, and the draft below it
    HEADERS = ("Target + draft", "Size", "Quantization", "Licence", "Good for", "Fit", "Speed", "Status")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[PairRow] = []
        self.min_speed = MIN_SPEED  # speeds below it show in amber

    def set_rows(self, rows: list[PairRow]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def update_row(self, i: int, row: PairRow) -> None:
        self.rows[i] = row
        self.dataChanged.emit(self.index(i, 0), self.index(i, len(self.HEADERS) - 1))

    def row_of(self, pair_id: str) -> int:
        for i, r in enumerate(self.rows):
            if r.pair.id == pair_id:
                return i
        return -1

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.HEADERS[section]
        return None

    def data(
        self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if not index.isValid():
            return None
        r = self.rows[index.row()]
        c = index.column()
        if role == RowRole:
            return r
        if role == LinesRole:
            if c == self.PAIR:
                return (("★ " if r.recommended else "") + r.target.name, f"+ {r.draft.name}", r.recommended)
            return None
        if role == BadgeRole:
            if c == self.FIT:
                return fit_badge(r.fit)
            if c == self.STATUS:
                return r.status_badge()
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(r, c)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(r, c)
        if role == Qt.ItemDataRole.FontRole and c == self.TARGET and r.recommended:
            f = QFont()
            f.setBold(True)
            return f
        if role == Qt.ItemDataRole.ForegroundRole:
            if c == self.LICENCE and r.gated:
                return QBrush(QColor("#9a6700"))
            if c in (self.GOOD_FOR, self.QUANT):
                return QBrush(QColor("#57606a"))
            if c == self.SPEED and r.speed is not None and r.speed.best < self.min_speed:
                return QBrush(QColor("#9a6700"))
        if role == Qt.ItemDataRole.TextAlignmentRole and c in (self.SIZE, self.SPEED):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def _text(self, r: PairRow, c: int) -> str:
        if c == self.PAIR:
            return ("★ " if r.recommended else "") + f"{r.target.name}\n+ {r.draft.name}"
        if c == self.SIZE:
            return r.size_text
        if c == self.QUANT:
            return f"{r.target_quant} + {r.draft_quant}"
        if c == self.LICENCE:
            return r.licence_text
        if c == self.GOOD_FOR:
            return r.pair.good_for
        if c == self.FIT:
            return fit_badge(r.fit)[0]
        if c == self.SPEED:
            return speed_label(r.speed) if r.speed is not None else ""
        if c == self.STATUS:
            b = r.status_badge()
            return b[0] if b else "Not downloaded"
        return ""

    def _tooltip(self, r: PairRow, c: int) -> str:
        if c == self.FIT:
            return (f"{r.fit.summary}; needs about {format_bytes(r.fit.need.total)} at "
                    f"{r.fit.need.target.n_ctx} tokens of context")  # fmt: skip
        if c == self.SPEED and r.speed is not None:
            slow = r.speed.best < self.min_speed
            return speed_tooltip(r.speed) + (
                f"\nBelow the usable speed set in Settings ({self.min_speed:g} tokens/s)" if slow else ""
            )
        if c == self.LICENCE and r.gated:
            return "Gated on the Hub: accept the licence on the model page and set HF_TOKEN to download"
        if c == self.STATUS and r.error:
            return r.error
        if c == self.PAIR:
            rec = "Recommended for this machine\n" if r.recommended else ""
            return (f"{rec}Target: {r.target.name} — {r.target.repo}/{r.target.file(r.target_quant).file}\n"
                    f"Draft: {r.draft.name} — {r.draft.repo}/{r.draft.file(r.draft_quant).file}")  # fmt: skip
        if c == self.GOOD_FOR:
            return r.pair.good_for
        return ""


class BadgeDelegate(QStyledItemDelegate):
    """Paints `BadgeRole` values as rounded coloured pills (fit and status columns)."""

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        lines = index.data(LinesRole)
        if lines:
            self._paint_lines(painter, option, index, lines)
            return
        badge = index.data(BadgeRole)
        if not badge:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else QCoreApplication.instance().style()  # type: ignore[union-attr]
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        text, fg, bg = badge
        fm = option.fontMetrics
        w = min(option.rect.width() - 8, fm.horizontalAdvance(text) + 16)
        h = fm.height() + 6
        rect = QRectF(option.rect.x() + 4, option.rect.center().y() - h / 2 + 1, w, h)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(QColor(fg).lighter(170), 1))
        painter.setBrush(QColor(bg))
        painter.drawRoundedRect(rect, h / 2, h / 2)
        painter.setPen(QColor(fg))
        elided = fm.elidedText(text, Qt.TextElideMode.ElideRight, int(w - 12))
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignCenter), elided)
        painter.restore()

    def _paint_lines(
        self, painter: QPainter, option: QStyleOptionViewItem, index: Any, lines: tuple[str, str, bool]
    ) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else QCoreApplication.instance().style()  # type: ignore[union-attr]
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        first, second, bold = lines
        fm = option.fontMetrics
        r = option.rect.adjusted(8, 0, -6, 0)
        top = r.center().y() - fm.height()
        painter.save()
        f = QFont(option.font)
        f.setBold(bold)
        painter.setFont(f)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        painter.setPen(QColor("#0b2e6f" if selected else "#24292f"))
        painter.drawText(r.x(), top, r.width(), fm.height(), int(Qt.AlignmentFlag.AlignLeft), first)
        painter.setFont(option.font)
        painter.setPen(QColor("#57606a"))
        painter.drawText(
            r.x(), top + fm.height(), r.width(), fm.height(), int(Qt.AlignmentFlag.AlignLeft), second
        )
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        lines = index.data(LinesRole)
        if lines:
            fm = option.fontMetrics
            bold = QFont(option.font)
            bold.setBold(True)
            w = max(QFontMetrics(bold).horizontalAdvance(lines[0]), fm.horizontalAdvance(lines[1]))
            return QSize(w + 18, 2 * fm.height() + 12)
        badge = index.data(BadgeRole)
        size = super().sizeHint(option, index)
        if badge:
            fm = option.fontMetrics
            size.setWidth(fm.horizontalAdvance(badge[0]) + 28)
            size.setHeight(max(size.height(), fm.height() + 12))
        return size


class CatalogTable(QTableView):
    """The catalog view; hides the secondary columns when narrow (the detail pane shows them)."""

    """The catalog view; hides the secondary columns when narrow (the detail pane shows them)."""

    NARROW = 760
    VERY_NARROW = 520

    def __init__(self, model: CatalogTableModel) -> None:
        super().__init__()
        self.setModel(model)
        self.setItemDelegate(BadgeDelegate(self))
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setShowGrid(False)
        self.setAlternatingRowColors(False)
        self.setWordWrap(True)  # "Good for" wraps instead of being cut off
        self.setTextElideMode(Qt.TextElideMode.ElideNone)
        vhead = self.verticalHeader()
        vhead.setVisible(False)
        vhead.setMinimumSectionSize(30)
        vhead.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        head = self.horizontalHeader()
        head.setHighlightSections(False)
        head.setStretchLastSection(False)
        m = CatalogTableModel
        for c in range(len(m.HEADERS)):
            head.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        head.setSectionResizeMode(m.GOOD_FOR, QHeaderView.ResizeMode.Stretch)
        head.sectionResized.connect(lambda *_: self.resizeRowsToContents())  # wrapped "Good for"
        head.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)

    def resizeEvent(self, event: Any) -> None:
        super().resizeEvent(event)
        width = self.viewport().width()
        m = CatalogTableModel
        for col in (m.QUANT, m.LICENCE, m.GOOD_FOR):
            self.setColumnHidden(col, width < self.NARROW)
        self.setColumnHidden(m.SIZE, width < self.VERY_NARROW)
