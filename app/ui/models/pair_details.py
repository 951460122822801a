"""The selected catalog pair: its files, quantization pickers, licence, fit, suggested settings, actions."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QBoxLayout,
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.models.catalog_rows import PairRow, fit_badge
from app.ui.shared.richtext import escape
from models_registry.catalog_drafts import draft_words, mtp_words
from models_registry.drafting import pair_drafting
from models_registry.units import format_bytes

__all__ = ["PairDetails"]


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

    def set_compact(self, compact: bool) -> None:
        """Stack each file line above its quantization picker (a narrow pane), or put them side by side."""
        self.compact = compact
        d = QBoxLayout.Direction
        for box in self._file_boxes:
            box.setDirection(d.TopToBottom if compact else d.LeftToRight)

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
        kind = f"({draft_words(row.draft).partition(' ')[2]})" if row.draft.draft_kind else "(draft)"
        self.title.setText(f"{star}{row.target.name}  +  {row.draft.name} {kind}")
        for lbl, m, q, path in ((self.target_file, row.target, row.target_quant, row.target_path),
                                (self.draft_file, row.draft, row.draft_quant, row.draft_path)):  # fmt: skip
            qf = m.file(q)
            here = " · <span style='color:#116329'>on disk</span>" if path else ""
            lbl.setText(
                f"{m.repo}/<b>{qf.file}</b> ({'~' if qf.size_approx else ''}{format_bytes(qf.size)}){here}"
            )
            lbl.setToolTip(str(path) if path else "")
        for combo, m, q in ((self.target_quant, row.target, row.target_quant),
                            (self.draft_quant, row.draft, row.draft_quant)):  # fmt: skip
            combo.blockSignals(True)
            combo.clear()
            for quant, qf in m.files.items():
                combo.addItem(f"{quant}  ({format_bytes(qf.size)})", quant)
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
            f"{format_bytes(row.fit.need.total)} at {row.fit.need.target.n_ctx:,} tokens of context"
        )
        status = f"<br><span style='color:#a40e26'>{escape(row.error)}</span>" if row.error else ""
        drafting = f"<br><b>Drafting:</b> {escape(pair_drafting(row.target, row.draft).words)}"
        t, d = row.target, row.draft
        if t.mtp_layers:  # it can also run alone: Custom pair, with no draft file
            drafting += f"<br>{escape(t.name)} {escape(mtp_words(t.mtp_layers))}: it can also run alone"
        if d.draft_kind:
            drafting += f"<br>{escape(d.name)} is {draft_words(d)} trained for this target only"
        self.info.setText(
            f"<b>Good for:</b> {escape(row.pair.good_for)}<br><b>Fit:</b> {fit}<br>"
            f"<b>Total download:</b> {row.size_text} · <b>Licence:</b> {escape(row.licence_text)}<br>"
            f"<b>Suggested drafting:</b> up to {row.pair.n_max} tokens per round, p_min {row.pair.p_min:g}"
            f"{drafting}{gated}{status}"
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
