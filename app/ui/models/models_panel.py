"""The Models panel, in tabs: **Catalog** (the curated pairs with fit, expected speed and download
status, the recommended pair first; `app.ui.models.catalog_rows`, `catalog_table`, `pair_details`),
**Downloads** (`app.ui.models.downloads`, `downloads_view`), **Installed** (`app.ui.models.installed_view`,
`delete_policy`), **Custom pair** (`app.ui.models.pair_chooser`) and **Servers**
(`app.ui.models.servers_view`); on a machine without models a banner recommends a pair
(`app.ui.models.recommend_banner`). Connected to the session by `app.ui.models.models_install`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QLabel,
    QMenu,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.models.catalog_rows import PairRow, catalog_order, machine_text, make_row
from app.ui.models.catalog_table import CatalogTable, CatalogTableModel
from app.ui.models.delete_policy import DeletePolicy
from app.ui.models.downloads import FAILED, DownloadManager
from app.ui.models.downloads_view import DownloadsView
from app.ui.models.installed_view import InstalledView
from app.ui.models.models_style import STYLE as _STYLE
from app.ui.models.pair_chooser import PairChooser
from app.ui.models.pair_details import PairDetails
from app.ui.models.recommend_banner import RecommendBanner
from app.ui.models.servers_view import ServersView
from app.ui.shared.gc_guard import MainThreadGC
from models_registry import library
from models_registry.bandwidth import cached_cpu_bandwidth, cpu_bandwidth
from models_registry.catalog import Catalog, Pair, default_catalog
from models_registry.fit import MIN_SPEED, Machine, PairFit, detect_machine, gpus_from_devices, recommend
from models_registry.hub import RetryPolicy, hub_cache_dir
from models_registry.measured import SpeedStore

log = logging.getLogger("tandem.ui")

__all__ = ["ModelsPanel", "should_show_first_run"]


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
    machineDetected = Signal(object)  # Machine: the engine's GPUs and the measured bandwidth arrived

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
        min_speed: float = MIN_SPEED,
        measured: SpeedStore | None = None,
    ) -> None:
        super().__init__(parent)
        self._gc = MainThreadGC(self)  # worker threads must never collect Qt objects
        self.catalog = catalog or default_catalog()
        # until `detect_machine_in_background` reports: GPUs guessed, the bandwidth as cached (if it is)
        self.machine = machine or detect_machine(bandwidth=cached_cpu_bandwidth())
        self.n_ctx = n_ctx
        self.min_speed = min_speed
        self.measured = measured if measured is not None else SpeedStore()
        self._detector: threading.Thread | None = None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.folders_path = Path(folders_path) if folders_path is not None else None
        self.downloads = downloads or DownloadManager(self, cache_dir=cache_dir, policy=policy)
        self.quants: dict[str, tuple[str, str]] = {}
        self.local: list[library.LocalModel] = []
        self.partials: list[library.PartialDownload] = []
        self.recommended: PairFit | None = None
        self.confirm: Callable[[str, str], bool] = self._ask
        self.deleter = DeletePolicy(self)
        self._closed = False
        self.setObjectName("modelsPanel")
        self.setStyleSheet(_STYLE)
        self._build(check_kwargs)
        self.downloads.changed.connect(self._download_changed)
        self.downloads.fileFinished.connect(lambda _k, _p: self.refresh())
        self.downloads.added.connect(lambda _k: self._update_tab_titles())
        self.downloads.removed.connect(lambda _k: self._update_tab_titles())
        self.machineDetected.connect(self.set_machine)
        self.refresh()
        if self.model.rows:
            self.table.selectRow(0)

    # -- construction -------------------------------------------------------------------------------
    def _build(self, check_kwargs: dict[str, Any] | None) -> None:
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 6)
        lay.setSpacing(8)

        self.banner = RecommendBanner()
        self.banner.button.clicked.connect(self._download_recommended)
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
        self.table = CatalogTable(self.model)
        self.table.customContextMenuRequested.connect(self._row_menu)
        self.table.doubleClicked.connect(self._double_clicked)
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

        self.chooser = PairChooser(self.downloads, check_kwargs=check_kwargs, catalog=self.catalog)
        self.chooser.loadRequested.connect(lambda t, d: self._request_load(t, d, None))
        self.installed.useAsTarget.connect(lambda p: self._to_chooser(self.chooser.set_target, p))
        self.installed.useAsDraft.connect(lambda p: self._to_chooser(self.chooser.set_draft, p))
        self.tabs.addTab(self.chooser, "Custom pair")
        self.servers = ServersView()  # remote servers (app.ui.models.servers_view.attach_servers routes them)
        self.tabs.addTab(self.servers, "Servers")

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
            self.details.set_compact(compact)
            self.banner.set_compact(compact)
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
        self.recommended = recommend(
            self.machine, catalog=self.catalog, n_ctx=self.n_ctx, min_speed=self.min_speed,
            measured=self.measured,
        )  # fmt: skip
        self.model.min_speed = self.min_speed
        selected = self.selected_pair_id()
        rows = [self._make_row(p) for p in self.catalog.pairs]
        rows.sort(key=catalog_order)
        self.model.set_rows(rows)
        if selected is not None:
            self.select_pair(selected)
        self._show_selected()
        self.installed.populate(self.local, folders, self.partials, self.cache_dir or hub_cache_dir())
        self._update_machine_line()
        self._update_banner()
        self._update_tab_titles()

    def _make_row(self, p: Pair) -> PairRow:
        return make_row(
            p, catalog=self.catalog, machine=self.machine, n_ctx=self.n_ctx, quants=self.quants,
            local=self.local, partials=self.partials, downloads=self.downloads, recommended=self.recommended,
            measured=self.measured,
        )  # fmt: skip

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

    def set_min_speed(self, min_speed: float) -> None:
        """The tokens/s from which a pair counts as usable (the app's setting): the recommendation follows."""
        if min_speed >= 0 and min_speed != self.min_speed:
            self.min_speed = min_speed
            self.refresh()

    def set_machine(self, machine: Machine) -> None:
        """The machine the fits and speeds are for (e.g. once its GPUs and bandwidth are known)."""
        if machine != self.machine and not self._closed:
            self.machine = machine
            self.refresh()

    def set_devices(self, devices: Any, gpu_offload: bool = True) -> None:
        """The GPUs from the engine's device list (``EngineInfo``/``EngineStatus.devices``)."""
        gpus = gpus_from_devices(devices) if gpu_offload else ()
        self.set_machine(dataclasses.replace(self.machine, gpus=gpus, gpu_source="engine"))

    def detect_machine_in_background(self, status: Callable[[], Any] | None = None) -> None:
        """Off the GUI thread: ask `status` (the engine's ``EngineClient.info``) for the GPUs and measure
        the memory bandwidth (the cached figure if there is one); the panel follows when both are in.
        Without `status`, or when the engine does not answer, the GPUs stay guessed."""

        def run() -> None:
            gpus = None
            if status is not None:
                try:
                    st = status()
                    gpus = gpus_from_devices(st.devices) if st.gpu_offload else ()
                except Exception as e:  # the engine did not start: the fit guesses the GPUs
                    log.warning("the engine's devices are not known (%s): the GPUs are guessed", e)
            found = detect_machine(gpus, bandwidth=cpu_bandwidth())
            with contextlib.suppress(RuntimeError):  # the panel is gone
                self.machineDetected.emit(found)

        self._detector = threading.Thread(target=run, name="tandem-ui-machine", daemon=True)
        self._detector.start()

    def _update_pair(self, pair_id: str) -> None:
        i = self.model.row_of(pair_id)
        if i < 0:
            return
        self.model.update_row(i, self._make_row(self.model.rows[i].pair))
        if self.selected_pair_id() == pair_id:
            self._show_selected()
        rec = self.recommended
        if rec is not None and rec.pair is not None and rec.pair.id == pair_id:
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
        how = f"with draft {Path(draft).name}" if draft else "(it drafts with its own MTP layers)"
        self.show_message(f"Loading {Path(target).name} {how}…", "ok")

    def delete_pair(self, pair_id: str) -> bool:
        """Delete the downloaded files of a pair from the HF cache (after confirmation)."""
        return self.deleter.delete_pair(self.row(pair_id))

    def delete_local(self, lm: library.LocalModel) -> bool:
        """Delete one file of the Installed list (a whole cache revision, or a file of a user folder)."""
        return self.deleter.delete_local(lm)

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
        if self._detector is not None:  # a daemon thread: it may wait for an engine that is loading
            self._detector.join(min(timeout, 2.0))
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
        if first:
            row = self.row(rec.pair.id) if rec is not None and rec.pair is not None else None
            self.banner.show_row(row, compact=self.details.compact, min_speed=self.min_speed)

    def _update_machine_line(self) -> None:
        self.machine_line.setText(machine_text(self.machine, self.n_ctx))

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
