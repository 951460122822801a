"""The Installed tab: GGUF files on disk (the Hugging Face cache and the user's folders), grouped by
location, with interrupted downloads, delete and folder management."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from models_registry import library
from models_registry.units import format_bytes

__all__ = ["InstalledView"]


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
            it = QTreeWidgetItem([name, format_bytes(m.size), cat, rev])
            it.setData(0, Qt.ItemDataRole.UserRole, m)
            it.setToolTip(0, str(m.path))
            it.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            g.addChild(it)
            if selected is not None and m.path == selected.path:
                it.setSelected(True)
        if partials:
            g = group("partials", "Interrupted downloads (resume from the Catalog or Downloads tab)")
            for p in partials:
                what = f"{p.repo_id or '?'}/{p.filename}" if p.filename else p.repo_id or "?"
                gaps = f", {len(p.missing)} part(s) to go" if p.missing else ""
                it = QTreeWidgetItem([f"{what} (partial{gaps})", format_bytes(p.size), "", ""])
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
