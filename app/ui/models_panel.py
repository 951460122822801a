"""The Models panel: curated catalog with fit badges, download queue, installed models, custom pairs.

Tabs:

* **Catalog**: every curated pair with target, draft, size, quantization, licence (gated marked), what it
  is good for, a coloured fit badge for this machine (`models_registry.fit`) and its download status;
  the recommended pair comes first. The detail pane below picks other quantizations and offers
  Download / Load / Delete.
* **Downloads**: the queue (`app.ui.downloads`).
* **Installed**: GGUF files in the Hugging Face cache and in the user's folders, with delete and
  *Add folder…*.
* **Custom pair**: any two GGUFs, local or on the Hub, vetted before loading (`app.ui.pair_chooser`).

On a machine without models a banner recommends a pair. `install_models_panel(window)` adds the panel
to the main window and routes Load to ``window.load_pair``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QCoreApplication,
    QModelIndex,
    QPersistentModelIndex,
    QRectF,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QBoxLayout,
    QComboBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.ui.downloads import DONE, DOWNLOADING, FAILED, QUEUED, DownloadManager, DownloadsView, fmt_size
from app.ui.gc_guard import MainThreadGC
from app.ui.pair_chooser import PairChooser
from models_registry import library
from models_registry.catalog import Catalog, CatalogModel, Pair, default_catalog
from models_registry.fit import Machine, PairFit, detect_machine, estimate_pair, fit_pair, recommend
from models_registry.hub import RetryPolicy, hub_cache_dir

log = logging.getLogger("tandem.ui")

__all__ = [
    "CatalogTableModel",
    "ModelsPanel",
    "PairRow",
    "fit_badge",
    "install_models_panel",
    "should_show_first_run",
]

# --------------------------------------------------------------------------------------------- badges

GREEN = ("#116329", "#dafbe1")
AMBER = ("#7d4e00", "#fff1c2")
BLUE = ("#0550ae", "#ddf4ff")
RED = ("#a40e26", "#ffebe9")
GREY = ("#57606a", "#eaeef2")

Badge = tuple[str, str, str]  # text, foreground, background


def fit_badge(fit: PairFit) -> Badge:
    """Short coloured label for a fit verdict."""
    tight = "" if fit.comfortable or fit.verdict == "none" else " (tight)"
    if fit.verdict == "gpu":
        return ("GPU" + tight, *GREEN)
    if fit.verdict == "partial":
        return (f"Partly on GPU: {fit.gpu_layers}/{fit.need.target.n_layers} layers{tight}", *AMBER)
    if fit.verdict == "cpu":
        return ("CPU only" + tight, *BLUE)
    return ("Does not fit", *RED)


_RANK = {"gpu": 3, "partial": 2, "cpu": 1, "none": 0}


# ---------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class PairRow:
    """One catalog pair as the table shows it (quantizations as chosen in the detail pane)."""

    pair: Pair
    target: CatalogModel
    draft: CatalogModel
    target_quant: str
    draft_quant: str
    fit: PairFit
    recommended: bool = False
    status: str = "missing"  # installed | partial | downloading | queued | failed | missing
    progress: float = 0.0  # of the pair's download, while downloading
    error: str = ""
    target_path: Path | None = None
    draft_path: Path | None = None

    @property
    def size(self) -> int:
        return self.target.file(self.target_quant).size + self.draft.file(self.draft_quant).size

    @property
    def size_approx(self) -> bool:
        return (
            self.target.file(self.target_quant).size_approx or self.draft.file(self.draft_quant).size_approx
        )

    @property
    def size_text(self) -> str:
        return ("~" if self.size_approx else "") + fmt_size(self.size)

    @property
    def gated(self) -> bool:
        return self.target.gated or self.draft.gated

    @property
    def licence_text(self) -> str:
        lic = self.target.license if self.target.license == self.draft.license else (
            f"{self.target.license} / {self.draft.license}")  # fmt: skip
        return lic + (" · gated" if self.gated else "")

    @property
    def installed(self) -> bool:
        return self.target_path is not None and self.draft_path is not None

    def status_badge(self) -> Badge | None:
        if self.status == "installed":
            return ("Installed", *GREEN)
        if self.status == "downloading":
            return (f"Downloading {self.progress:.0%}", *BLUE)
        if self.status == "queued":
            return ("Queued", *GREY)
        if self.status == "partial":
            return ("Partly downloaded", *AMBER)
        if self.status == "failed":
            return ("Download failed", *RED)
        return None


BadgeRole = Qt.ItemDataRole.UserRole + 1
RowRole = Qt.ItemDataRole.UserRole + 2
LinesRole = Qt.ItemDataRole.UserRole + 3  # (first line, second line, bold first line)


class CatalogTableModel(QAbstractTableModel):
    """Table model over `PairRow`s."""

    PAIR, SIZE, QUANT, LICENCE, GOOD_FOR, FIT, STATUS = range(7)
    TARGET = PAIR  # the pair column shows the target, and the draft below it
    HEADERS = ("Target + draft", "Size", "Quantization", "Licence", "Good for", "Fit", "Status")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[PairRow] = []

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
        if role == Qt.ItemDataRole.TextAlignmentRole and c == self.SIZE:
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
        if c == self.STATUS:
            b = r.status_badge()
            return b[0] if b else "Not downloaded"
        return ""

    def _tooltip(self, r: PairRow, c: int) -> str:
        if c == self.FIT:
            return (f"{r.fit.summary}; needs about {fmt_size(r.fit.need.total)} at "
                    f"{r.fit.need.target.n_ctx} tokens of context")  # fmt: skip
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

    NARROW = 760
    VERY_NARROW = 520

    def resizeEvent(self, event: Any) -> None:
        super().resizeEvent(event)
        width = self.viewport().width()
        m = CatalogTableModel
        for col in (m.QUANT, m.LICENCE, m.GOOD_FOR):
            self.setColumnHidden(col, width < self.NARROW)
        self.setColumnHidden(m.SIZE, width < self.VERY_NARROW)


# ------------------------------------------------------------------------------------------ details


_STYLE = """
#recommendBanner { background: #eef3fc; border: 1px solid #b6ccf5; border-radius: 10px; }
#recommendTitle { color: #0b2e6f; font-size: 14px; }
#recommendText { color: #24292f; }
#primaryButton { background: #2f6fde; color: white; border: none; border-radius: 6px; padding: 6px 14px;
                 font-weight: 600; }
#primaryButton:hover { background: #2a63c7; }
#primaryButton:disabled { background: #b8c7e6; }
#pairDetails { background: #fafbfc; border: 1px solid #e1e4e8; border-radius: 8px; }
#detailTitle { font-size: 14px; font-weight: 600; color: #24292f; }
#detailKey { color: #57606a; }
#machineLine, #panelMessage { color: #57606a; }
#panelMessage[level="error"] { color: #a40e26; }
#panelMessage[level="ok"] { color: #116329; }
QTableView { border: 1px solid #e1e4e8; border-radius: 6px; gridline-color: #f0f1f3;
             selection-background-color: #dfe7f7; selection-color: #0b2e6f; }
QTableView::item { padding: 2px 6px; }
QHeaderView::section { background: #f6f8fa; border: none; border-bottom: 1px solid #e1e4e8;
                       padding: 5px 6px; color: #57606a; font-weight: 600; }
"""


class PairDetails(QFrame):
    """The selected pair: files, quantization pickers, licence, fit, suggested settings and actions."""

    quantChanged = Signal(str, str, str)  # pair id, target quant, draft quant

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pairDetails")
        self.row: PairRow | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 10, 12, 10)
        lay.setSpacing(6)
        self.title = QLabel("Select a pair")
        self.title.setObjectName("detailTitle")
        self.title.setWordWrap(True)
        lay.addWidget(self.title)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(4)
        self.compact = False
        self._file_boxes: list[QBoxLayout] = []
        self.target_file = QLabel()
        self.draft_file = QLabel()
        self.target_quant = QComboBox()
        self.draft_quant = QComboBox()
        self.info = QLabel()
        for lbl in (self.target_file, self.draft_file, self.info):
            lbl.setWordWrap(True)
            lbl.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for r, (key, lbl, combo) in enumerate(
            (("Target", self.target_file, self.target_quant), ("Draft", self.draft_file, self.draft_quant))
        ):
            k = QLabel(key)
            k.setObjectName("detailKey")
            box = QBoxLayout(QBoxLayout.Direction.LeftToRight)
            box.setSpacing(6)
            box.addWidget(lbl, 1)
            box.addWidget(combo, 0, Qt.AlignmentFlag.AlignTop)
            self._file_boxes.append(box)
            grid.addWidget(k, r, 0, Qt.AlignmentFlag.AlignTop)
            grid.addLayout(box, r, 1)
            combo.setToolTip("Quantization: larger files are slightly more accurate, smaller ones faster")
            combo.currentIndexChanged.connect(self._quant_changed)
        grid.setColumnStretch(1, 1)
        lay.addLayout(grid)
        lay.addWidget(self.info)
        lay.addStretch(1)
        buttons = QHBoxLayout()
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("primaryButton")
        self.cancel_button = QPushButton("Cancel download")
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("primaryButton")
        self.delete_button = QPushButton("Delete…")
        buttons.addStretch(1)
        for b in (self.cancel_button, self.delete_button, self.download_button, self.load_button):
            buttons.addWidget(b)
        lay.addLayout(buttons)
        self.show_row(None)

    def show_row(self, row: PairRow | None) -> None:
        self.row = row
        has = row is not None
        for w in (self.target_quant, self.draft_quant, self.download_button, self.load_button,
                  self.delete_button, self.cancel_button):  # fmt: skip
            w.setEnabled(has)
        if row is None:
            self.title.setText("Select a pair to see its details")
            self.target_file.clear()
            self.draft_file.clear()
            self.info.clear()
            self.cancel_button.setVisible(False)
            return
        star = "★ Recommended for this machine: " if row.recommended else ""
        self.title.setText(f"{star}{row.target.name}  +  {row.draft.name} (draft)")
        for lbl, m, q, path in ((self.target_file, row.target, row.target_quant, row.target_path),
                                (self.draft_file, row.draft, row.draft_quant, row.draft_path)):  # fmt: skip
            qf = m.file(q)
            here = " · <span style='color:#116329'>on disk</span>" if path else ""
            lbl.setText(
                f"{m.repo}/<b>{qf.file}</b> ({'~' if qf.size_approx else ''}{fmt_size(qf.size)}){here}"
            )
            lbl.setToolTip(str(path) if path else "")
        for combo, m, q in ((self.target_quant, row.target, row.target_quant),
                            (self.draft_quant, row.draft, row.draft_quant)):  # fmt: skip
            combo.blockSignals(True)
            combo.clear()
            for quant, qf in m.files.items():
                combo.addItem(f"{quant}  ({fmt_size(qf.size)})", quant)
            combo.setCurrentIndex(max(0, combo.findData(q)))
            combo.setEnabled(len(m.files) > 1)
            combo.blockSignals(False)
        gated = (
            "<br><span style='color:#9a6700'><b>Gated:</b> accept the licence on the Hub page of "
            f"{', '.join(m.repo for m in (row.target, row.draft) if m.gated)} and set HF_TOKEN.</span>"
            if row.gated else ""
        )  # fmt: skip
        badge = fit_badge(row.fit)
        fit = (
            f"<span style='color:{badge[1]}'><b>{badge[0]}</b></span> – {row.fit.summary}, needs about "
            f"{fmt_size(row.fit.need.total)} at {row.fit.need.target.n_ctx:,} tokens of context"
        )
        status = f"<br><span style='color:#a40e26'>{_esc(row.error)}</span>" if row.error else ""
        self.info.setText(
            f"<b>Good for:</b> {_esc(row.pair.good_for)}<br><b>Fit:</b> {fit}<br>"
            f"<b>Total download:</b> {row.size_text} · <b>Licence:</b> {_esc(row.licence_text)}<br>"
            f"<b>Suggested drafting:</b> up to {row.pair.n_max} tokens per round, p_min {row.pair.p_min:g}"
            f"{gated}{status}"
        )
        active = row.status in ("downloading", "queued")
        self.download_button.setVisible(not row.installed)
        self.download_button.setEnabled(not active)
        self.download_button.setText(
            "Downloading…" if active else "Resume download" if row.status in ("partial", "failed")
            else "Download" if self.compact else f"Download ({row.size_text})"
        )  # fmt: skip
        self.cancel_button.setVisible(active)
        self.load_button.setEnabled(row.installed)
        self.load_button.setToolTip("" if row.installed else "Download the pair first")
        self.delete_button.setEnabled(row.target_path is not None or row.draft_path is not None)

    def _quant_changed(self) -> None:
        if self.row is None:
            return
        tq, dq = self.target_quant.currentData(), self.draft_quant.currentData()
        if tq and dq:
            self.quantChanged.emit(self.row.pair.id, tq, dq)


# --------------------------------------------------------------------------------------- installed


class InstalledView(QWidget):
    """GGUF files on disk, grouped by location, with delete and folder management."""

    useAsTarget = Signal(str)
    useAsDraft = Signal(str)
    deleteRequested = Signal(object)  # LocalModel
    addFolderRequested = Signal()
    removeFolderRequested = Signal(str)
    refreshRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Model file", "Size", "Catalog entry", "Revision"])
        self.tree.setRootIsDecorated(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.itemSelectionChanged.connect(self._selection)
        head = self.tree.header()
        head.setStretchLastSection(False)
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2, 3):
            head.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        lay.addWidget(self.tree, 1)
        row = QHBoxLayout()
        self.target_button = QPushButton("Use as target")
        self.draft_button = QPushButton("Use as draft")
        self.delete_button = QPushButton("Delete…")
        self.add_button = QPushButton("Add folder…")
        self.remove_folder_button = QPushButton("Remove folder")
        self.refresh_button = QPushButton("Refresh")
        self.target_button.setToolTip("Put this file in the Custom pair tab as the target")
        self.draft_button.setToolTip("Put this file in the Custom pair tab as the draft")
        self.remove_folder_button.setToolTip("Stop listing this folder (its files are not touched)")
        self.target_button.clicked.connect(lambda: self._emit_path(self.useAsTarget))
        self.draft_button.clicked.connect(lambda: self._emit_path(self.useAsDraft))
        self.delete_button.clicked.connect(self._delete)
        self.add_button.clicked.connect(self.addFolderRequested)
        self.remove_folder_button.clicked.connect(self._remove_folder)
        self.refresh_button.clicked.connect(self.refreshRequested)
        for b in (self.target_button, self.draft_button, self.delete_button):
            row.addWidget(b)
        row.addStretch(1)
        row2 = QHBoxLayout()  # two short rows keep the panel usable in a narrow side pane
        for b in (self.add_button, self.remove_folder_button, self.refresh_button):
            row2.addWidget(b)
        row2.addStretch(1)
        lay.addLayout(row)
        lay.addLayout(row2)
        self._selection()

    def populate(
        self,
        models: list[library.LocalModel],
        folders: list[Path],
        partials: list[library.PartialDownload],
        cache: Path,
    ) -> None:
        selected = self.selected_model()
        self.tree.clear()
        groups: dict[str, QTreeWidgetItem] = {}

        def group(key: str, title: str, folder: str | None = None) -> QTreeWidgetItem:
            if key not in groups:
                g = QTreeWidgetItem([title])
                f = g.font(0)
                f.setBold(True)
                g.setFont(0, f)
                g.setData(0, Qt.ItemDataRole.UserRole + 1, folder)
                g.setFirstColumnSpanned(True)
                self.tree.addTopLevelItem(g)
                groups[key] = g
            return groups[key]

        group("cache", f"Hugging Face cache — {cache}")
        for f in folders:
            group(f"folder:{f}", f"Folder — {f}", str(f))
        for m in models:
            g = (
                group("cache", "")
                if m.source == "hf-cache"
                else group(f"folder:{m.path.parent}", f"Folder — {m.path.parent}", str(m.path.parent))
            )
            name = m.display_name if m.source == "hf-cache" else m.path.name
            cat = f"{m.catalog_id} ({m.quant})" if m.catalog_id else "—"
            rev = (", ".join(m.refs) or (m.commit or "")[:8]) if m.source == "hf-cache" else ""
            it = QTreeWidgetItem([name, fmt_size(m.size), cat, rev])
            it.setData(0, Qt.ItemDataRole.UserRole, m)
            it.setToolTip(0, str(m.path))
            it.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            g.addChild(it)
            if selected is not None and m.path == selected.path:
                it.setSelected(True)
        if partials:
            g = group("partials", "Interrupted downloads (resume from the Catalog or Downloads tab)")
            for p in partials:
                it = QTreeWidgetItem([f"{p.repo_id or '?'} (partial)", fmt_size(p.size), "", ""])
                it.setToolTip(0, str(p.path))
                g.addChild(it)
        for g in groups.values():
            if g.childCount() == 0 and g.data(0, Qt.ItemDataRole.UserRole + 1) is None:
                g.addChild(QTreeWidgetItem(["(no GGUF files)"]))
        self.tree.expandAll()
        self._selection()

    def model_items(self) -> list[QTreeWidgetItem]:
        out = []
        for i in range(self.tree.topLevelItemCount()):
            g = self.tree.topLevelItem(i)
            for j in range(g.childCount()):
                if g.child(j).data(0, Qt.ItemDataRole.UserRole) is not None:
                    out.append(g.child(j))
        return out

    def selected_model(self) -> library.LocalModel | None:
        items = self.tree.selectedItems()
        return items[0].data(0, Qt.ItemDataRole.UserRole) if items else None

    def selected_folder(self) -> str | None:
        items = self.tree.selectedItems()
        if not items:
            return None
        it = items[0]
        return it.data(0, Qt.ItemDataRole.UserRole + 1) if it.parent() is None else None

    def _selection(self) -> None:
        m = self.selected_model()
        for b in (self.target_button, self.draft_button, self.delete_button):
            b.setEnabled(m is not None)
        self.remove_folder_button.setEnabled(self.selected_folder() is not None)

    def _emit_path(self, signal: Any) -> None:
        m = self.selected_model()
        if m is not None:
            signal.emit(str(m.path))

    def _delete(self) -> None:
        m = self.selected_model()
        if m is not None:
            self.deleteRequested.emit(m)

    def _remove_folder(self) -> None:
        f = self.selected_folder()
        if f is not None:
            self.removeFolderRequested.emit(f)


# ------------------------------------------------------------------------------------------- panel


def should_show_first_run(
    *, cache_dir: str | Path | None = None, folders: list[Path] | None = None, catalog: Catalog | None = None
) -> bool:
    """True when no GGUF model is on disk (HF cache or user folders): open the Models panel at start."""
    try:
        return not library.list_local(cache_dir=cache_dir, folders=folders, catalog=catalog)
    except OSError:
        return True


class ModelsPanel(QWidget):
    """Catalog, downloads, installed models and the custom pair chooser, in tabs."""

    COMPACT = 560

    loadRequested = Signal(str, str)  # target path, draft path
    pairLoadRequested = Signal(str, str, object)  # target path, draft path, catalog Pair (or None)
    firstRunChanged = Signal(bool)

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        catalog: Catalog | None = None,
        machine: Machine | None = None,
        n_ctx: int = 4096,
        cache_dir: str | Path | None = None,
        folders_path: str | Path | None = None,
        downloads: DownloadManager | None = None,
        policy: RetryPolicy | None = None,
        check_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(parent)
        self._gc = MainThreadGC(self)  # worker threads must never collect Qt objects
        self.catalog = catalog or default_catalog()
        self.machine = machine or detect_machine()
        self.n_ctx = n_ctx
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.folders_path = Path(folders_path) if folders_path is not None else None
        self.downloads = downloads or DownloadManager(self, cache_dir=cache_dir, policy=policy)
        self.quants: dict[str, tuple[str, str]] = {}
        self.local: list[library.LocalModel] = []
        self.partials: list[library.PartialDownload] = []
        self.recommended: PairFit | None = None
        self.confirm: Callable[[str, str], bool] = self._ask
        self._closed = False
        self.setObjectName("modelsPanel")
        self.setStyleSheet(_STYLE)
        self._build(check_kwargs)
        self.downloads.changed.connect(self._download_changed)
        self.downloads.fileFinished.connect(lambda _k, _p: self.refresh())
        self.downloads.added.connect(lambda _k: self._update_tab_titles())
        self.downloads.removed.connect(lambda _k: self._update_tab_titles())
        self.refresh()
        if self.model.rows:
            self.table.selectRow(0)

    # -- construction -------------------------------------------------------------------------------
    def _build(self, check_kwargs: dict[str, Any] | None) -> None:
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 6)
        lay.setSpacing(8)

        self.banner = QFrame()
        self.banner.setObjectName("recommendBanner")
        bl = QBoxLayout(QBoxLayout.Direction.LeftToRight, self.banner)
        self._banner_layout = bl
        bl.setContentsMargins(14, 10, 14, 10)
        self.banner_text = QLabel()
        self.banner_text.setObjectName("recommendText")
        self.banner_text.setWordWrap(True)
        self.banner_button = QPushButton("Download")
        self.banner_button.setObjectName("primaryButton")
        self.banner_button.clicked.connect(self._download_recommended)
        bl.addWidget(self.banner_text, 1)
        bl.addWidget(self.banner_button, 0, Qt.AlignmentFlag.AlignVCenter)
        lay.addWidget(self.banner)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        lay.addWidget(self.tabs, 1)

        # catalog
        cat = QWidget()
        cl = QVBoxLayout(cat)
        cl.setContentsMargins(0, 6, 0, 0)
        self.machine_line = QLabel()
        self.machine_line.setObjectName("machineLine")
        self.machine_line.setWordWrap(True)
        cl.addWidget(self.machine_line)
        self.model = CatalogTableModel(self)
        self.table = CatalogTable()
        self.table.setModel(self.model)
        self.table.setItemDelegate(BadgeDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(False)
        self.table.setWordWrap(True)  # "Good for" wraps instead of being cut off
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        vhead = self.table.verticalHeader()
        vhead.setVisible(False)
        vhead.setMinimumSectionSize(30)
        vhead.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._row_menu)
        self.table.doubleClicked.connect(self._double_clicked)
        head = self.table.horizontalHeader()
        head.setHighlightSections(False)
        head.setStretchLastSection(False)
        m = CatalogTableModel
        for c in range(len(m.HEADERS)):
            head.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        head.setSectionResizeMode(m.GOOD_FOR, QHeaderView.ResizeMode.Stretch)
        head.sectionResized.connect(lambda *_: self.table.resizeRowsToContents())  # wrapped "Good for"
        head.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.selectionModel().currentRowChanged.connect(lambda *_: self._show_selected())
        self.details = PairDetails()
        self.details.quantChanged.connect(self.set_quants)
        self.details.download_button.clicked.connect(lambda: self._on_selected(self.download_pair))
        self.details.load_button.clicked.connect(lambda: self._on_selected(self.load_catalog_pair))
        self.details.delete_button.clicked.connect(lambda: self._on_selected(self.delete_pair))
        self.details.cancel_button.clicked.connect(lambda: self._on_selected(self.cancel_pair))
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        split.addWidget(self.table)
        details_scroll = QScrollArea()  # squeezed by a short window, the details scroll instead of clipping
        details_scroll.setWidgetResizable(True)
        details_scroll.setFrameShape(QFrame.Shape.NoFrame)
        details_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        details_scroll.setWidget(self.details)
        split.addWidget(details_scroll)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 0)
        split.setSizes([620, 250])
        cl.addWidget(split, 1)
        self.tabs.addTab(cat, "Catalog")

        self.downloads_view = DownloadsView(self.downloads)
        self.tabs.addTab(self.downloads_view, "Downloads")

        self.installed = InstalledView()
        self.installed.deleteRequested.connect(self.delete_local)
        self.installed.addFolderRequested.connect(self.choose_folder)
        self.installed.removeFolderRequested.connect(self.remove_folder)
        self.installed.refreshRequested.connect(self.refresh)
        self.tabs.addTab(self.installed, "Installed")

        self.chooser = PairChooser(self.downloads, check_kwargs=check_kwargs)
        self.chooser.loadRequested.connect(lambda t, d: self._request_load(t, d, None))
        self.installed.useAsTarget.connect(lambda p: self._to_chooser(self.chooser.set_target, p))
        self.installed.useAsDraft.connect(lambda p: self._to_chooser(self.chooser.set_draft, p))
        self.tabs.addTab(self.chooser, "Custom pair")

        self.message = QLabel()
        self.message.setObjectName("panelMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.message)

    def resizeEvent(self, event: Any) -> None:
        """Below ~560 px (the main window's side pane) stack the banner and the detail rows."""
        super().resizeEvent(event)
        compact = self.width() < self.COMPACT
        if compact != self.details.compact:
            self.details.compact = compact
            v, h = QBoxLayout.Direction.TopToBottom, QBoxLayout.Direction.LeftToRight
            self._banner_layout.setDirection(v if compact else h)
            for box in self.details._file_boxes:
                box.setDirection(v if compact else h)
            self._show_selected()
            self._update_banner()

    # -- data ---------------------------------------------------------------------------------------
    def folders(self) -> list[Path]:
        return library.load_folders(self.folders_path)

    def refresh(self) -> None:
        """Re-read the disk (HF cache, folders, partials) and rebuild every view."""
        if self._closed:
            return
        folders = self.folders()
        try:
            self.local = library.list_local(cache_dir=self.cache_dir, folders=folders, catalog=self.catalog)
            self.partials = library.list_partials(self.cache_dir)
        except OSError as e:
            self.local, self.partials = [], []
            self.show_message(f"Cannot read the model folders: {e}", "error")
        self.recommended = recommend(self.machine, catalog=self.catalog, n_ctx=self.n_ctx)
        selected = self.selected_pair_id()
        rows = [self._make_row(p) for p in self.catalog.pairs]
        rows.sort(key=lambda r: (not r.recommended, -_RANK[r.fit.verdict], not r.fit.comfortable))
        self.model.set_rows(rows)
        if selected is not None:
            self.select_pair(selected)
        self._show_selected()
        self.installed.populate(self.local, folders, self.partials, self.cache_dir or hub_cache_dir())
        self._update_machine_line()
        self._update_banner()
        self._update_tab_titles()

    def _make_row(self, p: Pair) -> PairRow:
        t, d = self.catalog.model(p.target), self.catalog.model(p.draft)
        tq, dq = self.quants.get(p.id, (t.default_quant, d.default_quant))
        need = estimate_pair(t, d, n_ctx=self.n_ctx, target_quant=tq, draft_quant=dq)
        fit = fit_pair(need, self.machine, pair=p)
        rec = (
            self.recommended is not None
            and self.recommended.pair is not None
            and self.recommended.pair.id == p.id
        )
        tpath, dpath = self._local_path(t, tq), self._local_path(d, dq)
        items = [self.downloads.find(m.repo, m.file(q).file) for m, q in ((t, tq), (d, dq))]
        live = [it for it in items if it is not None]
        status, progress, error = "missing", 0.0, ""
        if tpath and dpath:
            status = "installed"
        elif any(it.state == DOWNLOADING for it in live) or (
            any(it.state == QUEUED for it in live) and any(it.state == DONE for it in live)
        ):
            status = "downloading"
            done = sum(it.done for it in live) + sum(
                m.file(q).size for m, q, path in ((t, tq, tpath), (d, dq, dpath))
                if path is not None and not any(it.filename == m.file(q).file for it in live)
            )  # fmt: skip
            progress = min(1.0, done / max(1, t.file(tq).size + d.file(dq).size))
            if all(it.total for it in live) and len(live) == 2:
                progress = min(1.0, sum(it.done for it in live) / max(1, sum(it.total for it in live)))
        elif any(it.state == QUEUED for it in live):
            status = "queued"
        elif any(it.state == FAILED for it in live):
            status = "failed"
            error = next(it.error for it in live if it.state == FAILED)
        elif tpath or dpath or any(it.done for it in live) or self._has_partial(t) or self._has_partial(d):
            status = "partial"
        return PairRow(p, t, d, tq, dq, fit, rec, status, progress, error, tpath, dpath)

    def _local_path(self, m: CatalogModel, quant: str) -> Path | None:
        fname = m.file(quant).file
        best = None
        for lm in self.local:
            if (
                lm.source == "hf-cache"
                and (lm.repo_id or "").lower() == m.repo.lower()
                and lm.filename == fname
            ):
                if "main" in lm.refs:
                    return lm.path
                best = best or lm.path
            elif lm.source == "folder" and lm.catalog_id == m.id and lm.quant == quant:
                best = best or lm.path
        return best

    def _has_partial(self, m: CatalogModel) -> bool:
        return any((p.repo_id or "").lower() == m.repo.lower() for p in self.partials)

    def rows(self) -> list[PairRow]:
        return list(self.model.rows)

    def row(self, pair_id: str) -> PairRow:
        i = self.model.row_of(pair_id)
        if i < 0:
            raise KeyError(pair_id)
        return self.model.rows[i]

    def selected_pair_id(self) -> str | None:
        idx = self.table.currentIndex()
        return (
            self.model.rows[idx.row()].pair.id if idx.isValid() and idx.row() < len(self.model.rows) else None
        )

    def select_pair(self, pair_id: str) -> None:
        i = self.model.row_of(pair_id)
        if i >= 0:
            self.table.selectRow(i)
            self.table.setCurrentIndex(self.model.index(i, 0))

    def set_quants(self, pair_id: str, target_quant: str, draft_quant: str) -> None:
        """Choose the quantizations of a pair (size, fit and status follow)."""
        self.quants[pair_id] = (target_quant, draft_quant)
        self._update_pair(pair_id)

    def set_n_ctx(self, n_ctx: int) -> None:
        """The context size the fit badges assume (the app's load setting)."""
        if n_ctx > 0 and n_ctx != self.n_ctx:
            self.n_ctx = n_ctx
            self.refresh()

    def _update_pair(self, pair_id: str) -> None:
        i = self.model.row_of(pair_id)
        if i < 0:
            return
        self.model.update_row(i, self._make_row(self.model.rows[i].pair))
        if self.selected_pair_id() == pair_id:
            self._show_selected()
        if (
            self.recommended is not None
            and self.recommended.pair is not None
            and self.recommended.pair.id == pair_id
        ):
            self._update_banner()

    def _show_selected(self) -> None:
        pid = self.selected_pair_id()
        self.details.show_row(self.row(pid) if pid is not None else None)

    def _on_selected(self, action: Callable[[str], Any]) -> None:
        pid = self.selected_pair_id()
        if pid is not None:
            action(pid)

    # -- actions ------------------------------------------------------------------------------------
    def download_pair(self, pair_id: str) -> list[int]:
        """Queue both files of a pair (those not on disk yet); returns the download keys."""
        r = self.row(pair_id)
        keys = []
        for role, m, q, path in (("target", r.target, r.target_quant, r.target_path),
                                 ("draft", r.draft, r.draft_quant, r.draft_path)):  # fmt: skip
            if path is not None:
                continue
            qf = m.file(q)
            keys.append(self.downloads.enqueue(
                m.repo, qf.file, group=pair_id, label=f"{m.name} {q} ({role})", expected_size=qf.size,
            ))  # fmt: skip
        if keys:
            self.show_message(f"Downloading {r.target.name} + {r.draft.name} ({r.size_text}): "
                              "progress in the Downloads tab.")  # fmt: skip
        self._update_pair(pair_id)
        return keys

    def cancel_pair(self, pair_id: str) -> None:
        r = self.row(pair_id)
        for m, q in ((r.target, r.target_quant), (r.draft, r.draft_quant)):
            it = self.downloads.find(m.repo, m.file(q).file)
            if it is not None:
                self.downloads.cancel(it.key)

    def load_catalog_pair(self, pair_id: str) -> bool:
        """Ask the window to load an installed pair (with its suggested draft settings)."""
        r = self.row(pair_id)
        if not r.installed:
            self.show_message(f"{r.target.name} + {r.draft.name} is not downloaded yet.", "error")
            return False
        self._request_load(str(r.target_path), str(r.draft_path), r.pair)
        return True

    def _request_load(self, target: str, draft: str, pair: Pair | None) -> None:
        self.loadRequested.emit(target, draft)
        self.pairLoadRequested.emit(target, draft, pair)
        self.show_message(f"Loading {Path(target).name} with draft {Path(draft).name}…", "ok")

    def delete_pair(self, pair_id: str) -> bool:
        """Delete the downloaded files of a pair from the HF cache (after confirmation)."""
        r = self.row(pair_id)
        paths = {p for p in (r.target_path, r.draft_path) if p is not None}
        victims = [lm for lm in self.local if lm.path in paths and lm.source == "hf-cache"]
        in_folders = [p for p in paths if not any(lm.path == p for lm in victims)]
        if not victims:
            note = " (delete files of your own folders in the Installed tab)." if in_folders else "."
            self.show_message("Nothing of this pair is in the Hugging Face cache" + note, "error")
            return False
        revs = {(lm.repo_id, lm.commit) for lm in victims}
        return self._delete_revisions(revs, extra_note=self._shared_note(r))

    def _shared_note(self, r: PairRow) -> str:
        others = [p.id for p in self.catalog.pairs if p.id != r.pair.id and p.draft == r.draft.id
                  and self._local_path(self.catalog.model(p.target),
                                       self.row(p.id).target_quant)]  # fmt: skip
        if others:
            return f"\n\nThe draft {r.draft.name} is also used by: {', '.join(others)}."
        return ""

    def delete_local(self, lm: library.LocalModel) -> bool:
        """Delete one file of the Installed list (a whole cache revision, or a file of a user folder)."""
        if lm.source == "hf-cache":
            return self._delete_revisions({(lm.repo_id, lm.commit)})
        if not self.confirm("Delete model file", f"Delete {lm.path} ({fmt_size(lm.size)}) from disk?\n\n"
                            "This cannot be undone."):  # fmt: skip
            return False
        try:
            freed = library.delete_user_file(lm.path, folders=self.folders())
        except (library.LibraryError, OSError) as e:
            self.show_message(str(e), "error")
            return False
        self.show_message(f"Deleted {lm.path.name}, {fmt_size(freed)} freed.", "ok")
        self.refresh()
        return True

    def _delete_revisions(self, revs: set[tuple[str | None, str | None]], extra_note: str = "") -> bool:
        files = [lm for lm in self.local if lm.source == "hf-cache" and (lm.repo_id, lm.commit) in revs]
        listing = "\n".join(f"  • {lm.display_name} ({fmt_size(lm.size)})" for lm in files)
        total = sum(lm.size for lm in files)
        if not self.confirm(
            "Delete downloaded models",
            f"Delete these files from the Hugging Face cache ({fmt_size(total)})?\n\n"
            f"{listing}{extra_note}\n\n"
            "You can download them again later.",
        ):
            return False
        freed = 0
        errors = []
        for repo, commit in sorted(revs, key=str):
            if repo is None or commit is None:
                continue
            try:
                freed += library.delete_cached_revision(repo, commit, cache_dir=self.cache_dir)
            except (library.LibraryError, OSError) as e:
                errors.append(str(e))
        for lm in files:  # forget finished download items so the rows show "Not downloaded"
            it = self.downloads.find(lm.repo_id or "", lm.filename or "")
            if it is not None and it.state == DONE:
                self.downloads.remove(it.key)
        self.refresh()
        if errors:
            self.show_message("; ".join(errors), "error")
            return False
        self.show_message(f"Deleted {len(files)} file(s), {fmt_size(freed)} freed.", "ok")
        return True

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of GGUF models", str(Path.home()))
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str | Path) -> bool:
        try:
            library.add_folder(folder, self.folders_path)
        except (library.LibraryError, OSError) as e:
            self.show_message(str(e), "error")
            return False
        self.refresh()
        n = sum(1 for lm in self.local if lm.source == "folder" and lm.path.parent == Path(folder).resolve())
        self.show_message(f"Added {folder}: {n} GGUF file(s).", "ok")
        return True

    def remove_folder(self, folder: str | Path) -> None:
        try:
            library.remove_folder(folder, self.folders_path)
        except OSError as e:
            self.show_message(str(e), "error")
            return
        self.refresh()
        self.show_message(f"No longer listing {folder} (its files were not touched).")

    def should_show_first_run(self) -> bool:
        """True while no model is on disk: the window should open this panel at start."""
        return not self.local

    def show_message(self, text: str, level: str = "info") -> None:
        self.message.setText(text)
        if self.message.property("level") != level:
            self.message.setProperty("level", level)
            self.message.style().unpolish(self.message)
            self.message.style().polish(self.message)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel downloads (partials are kept), stop the check thread; call before closing the app."""
        if self._closed:
            return
        self._closed = True
        self.downloads.shutdown(timeout)
        self.chooser.shutdown(timeout)
        self._gc.stop()

    # -- internals ----------------------------------------------------------------------------------
    def _download_changed(self, key: int) -> None:
        if self._closed:
            return
        item = self.downloads.items.get(key)
        if item is None:
            return
        for r in self.model.rows:
            if any((m.repo.lower(), m.file(q).file) == (item.repo_id.lower(), item.filename)
                   for m, q in ((r.target, r.target_quant), (r.draft, r.draft_quant))):  # fmt: skip
                self._update_pair(r.pair.id)
        if item.state == FAILED:
            self.show_message(f"{item.name}: {item.error}", "error")
        self._update_tab_titles()

    def _download_recommended(self) -> None:
        if self.recommended is not None and self.recommended.pair is not None:
            self.select_pair(self.recommended.pair.id)
            self.download_pair(self.recommended.pair.id)
            self.tabs.setCurrentWidget(self.downloads_view)

    def _update_banner(self) -> None:
        first = self.should_show_first_run()
        rec = self.recommended
        self.banner.setVisible(first)
        self.firstRunChanged.emit(first)
        if not first:
            return
        if rec is None or rec.pair is None:
            self.banner_text.setText(
                "<span id='recommendTitle'><b>No curated pair fits this machine's memory</b></span><br>"
                "Try a smaller context size in Settings, or add your own GGUF files "
                "(Installed → Add folder…)."
            )
            self.banner_button.setVisible(False)
            return
        r = self.row(rec.pair.id)
        badge = fit_badge(r.fit)
        self.banner_text.setText(
            f"<b style='font-size:14px; color:#0b2e6f'>Recommended for this machine: {r.target.name} + "
            f"{r.draft.name}</b><br>{r.size_text} download · <span style='color:{badge[1]}'><b>{badge[0]}"
            f"</b></span> ({r.fit.summary}) · {_esc(r.pair.good_for)}"
        )
        active = r.status in ("downloading", "queued")
        self.banner_button.setVisible(True)
        self.banner_button.setEnabled(not active)
        self.banner_button.setText(
            f"Downloading… {r.progress:.0%}" if active else "Download" if self.details.compact
            else f"Download ({r.size_text})"
        )  # fmt: skip

    def _update_machine_line(self) -> None:
        m = self.machine
        gpus = ", ".join(f"{g.name} ({fmt_size(g.total)}{', unified' if g.unified else ''})" for g in m.gpus)
        self.machine_line.setText(
            f"This machine: {fmt_size(m.total_ram)} RAM ({fmt_size(m.available_ram)} free), "
            f"{m.physical_cores} cores, GPU: {gpus or 'none'} · fit at {self.n_ctx:,} tokens of context"
        )

    def _update_tab_titles(self) -> None:
        active = sum(it.active for it in self.downloads.items.values())
        self.tabs.setTabText(1, f"Downloads ({active})" if active else "Downloads")
        n = len(self.local)
        self.tabs.setTabText(2, f"Installed ({n})" if n else "Installed")

    def _to_chooser(self, setter: Callable[[str], None], path: str) -> None:
        setter(path)
        self.tabs.setCurrentWidget(self.chooser)

    def _row_menu(self, pos: Any) -> None:
        idx = self.table.indexAt(pos)
        if not idx.isValid():
            return
        r = self.model.rows[idx.row()]
        menu = QMenu(self)
        if r.installed:
            menu.addAction("Load", lambda: self.load_catalog_pair(r.pair.id))
        elif r.status in ("downloading", "queued"):
            menu.addAction("Cancel download", lambda: self.cancel_pair(r.pair.id))
        else:
            menu.addAction(f"Download ({r.size_text})", lambda: self.download_pair(r.pair.id))
        if r.target_path or r.draft_path:
            menu.addAction("Delete…", lambda: self.delete_pair(r.pair.id))
        menu.popup(self.table.viewport().mapToGlobal(pos))

    def _double_clicked(self, idx: QModelIndex) -> None:
        r = self.model.rows[idx.row()]
        if r.installed:
            self.load_catalog_pair(r.pair.id)

    def _ask(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(
            self, title, text, QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )  # fmt: skip
        return answer == QMessageBox.StandardButton.Yes


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ------------------------------------------------------------------------------------------ wiring


def install_models_panel(window: Any, **kwargs: Any) -> ModelsPanel:
    """Create the Models panel, add it with ``window.add_panel("Models", panel)`` and route Load to
    ``window.load_pair(target, draft)``, applying the catalog pair's suggested draft settings (n_max,
    p_min) through ``window.apply_settings`` when the window has one. Keyword arguments go to
    `ModelsPanel`; ``n_ctx`` defaults to ``window.settings.n_ctx``. The panel's ``shutdown()`` runs when
    the application quits (call it earlier from the window's own shutdown if you like)."""
    settings = getattr(window, "settings", None)
    if "n_ctx" not in kwargs and isinstance(getattr(settings, "n_ctx", None), int):
        kwargs["n_ctx"] = settings.n_ctx  # type: ignore[union-attr]
    panel = ModelsPanel(**kwargs)
    window.add_panel("Models", panel)

    def load(target: str, draft: str, pair: Pair | None) -> None:
        current = getattr(window, "settings", None)
        apply = getattr(window, "apply_settings", None)
        if pair is not None and current is not None and callable(apply) and dataclasses.is_dataclass(current):
            names = {f.name for f in dataclasses.fields(current)}
            if {"n_max", "p_min"} <= names and (current.n_max, current.p_min) != (pair.n_max, pair.p_min):
                apply(dataclasses.replace(current, n_max=pair.n_max, p_min=pair.p_min))
        window.load_pair(target, draft)

    panel.pairLoadRequested.connect(load)
    app = QCoreApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(panel.shutdown)
    return panel
