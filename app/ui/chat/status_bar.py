"""The main window's status bar: the loaded pair, its backend, memory use and load progress.

It shows the session's loaded pair (an ``EngineInfo``), or the remote server the chat uses instead (a
``RemoteInfo``), and the session's short notes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine import EngineInfo, LoadSettings, Rollback
from app.remote_client import RemoteInfo
from app.ui.core.session import Session
from app.ui.shared.wording import describe_memory
from models_registry.units import format_bytes

__all__ = ["StatusBar", "backend_text"]

MEMORY_INTERVAL_MS = 2000


class StatusBar(QStatusBar):
    """Pair names (with their offload as a tooltip), backend and device, models' size and the engine's
    RAM (every 2 s), and a progress bar while a pair loads; it follows ``session``."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.client = session.client
        self._load_has_draft = False
        self.pair_label = QLabel("No model loaded")
        self.backend_label = QLabel("")
        self.memory_label = QLabel("")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.addWidget(self.pair_label, 1)
        self.addPermanentWidget(self.progress)
        self.addPermanentWidget(self.backend_label)
        self.addPermanentWidget(self.memory_label)
        self._memory_timer = QTimer(self)
        self._memory_timer.setInterval(MEMORY_INTERVAL_MS)
        self._memory_timer.timeout.connect(self.update_memory)
        self._memory_timer.start()
        session.loadStarted.connect(self.load_started)
        session.worker.loadProgress.connect(self.load_progress)
        session.pairLoaded.connect(self.loaded)
        session.loadFailed.connect(self.show_failure)
        session.remoteChanged.connect(lambda _remote: self.show_model())
        session.message.connect(self.showMessage)

    @property
    def info(self) -> EngineInfo | None:
        """The loaded pair's description (the session's)."""
        return self.session.engine_info

    @property
    def remote(self) -> RemoteInfo | None:
        """The remote server the chat uses instead of the engine (the session's)."""
        return self.session.remote

    # -- loading ------------------------------------------------------------------------------------
    def load_started(self, settings: LoadSettings) -> None:
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self._load_has_draft = bool(settings.draft)
        self.pair_label.setText(f"Loading {Path(settings.target).name}…")

    def load_progress(self, stage: str, fraction: float) -> None:
        if self._load_has_draft:
            fraction = fraction / 2 + (0.5 if stage == "draft" else 0.0)
        self.progress.setValue(int(fraction * 1000))

    def loaded(self, info: EngineInfo) -> None:
        self.progress.setVisible(False)
        self.show_model()
        self.update_memory()
        fewer = [m for m in (info.target, info.draft) if m is not None and m.offload.failed_layers]
        if fewer:  # an automatic plan that did not fit: say what was loaded instead of failing
            o = fewer[0].offload
            self.showMessage(
                f"The GPU ran out of memory with {o.failed_layers[0]} layers: loaded with "
                f"{o.layers_offloaded} of {o.layers_total} on the GPU, the rest on the CPU.",
                20000,
            )

    def show_failure(self, message: str) -> None:
        self.progress.setVisible(False)
        self.show_model()
        self.pair_label.setText("Loading failed")
        self.showMessage(message, 15000)

    # -- the loaded pair ----------------------------------------------------------------------------
    def about_backend(self) -> str:
        """The backend line of the About box."""
        if self.remote is not None:
            return f"a remote server, {self.remote.base_url}"
        return backend_text(self.info) if self.info else "no model loaded"

    def show_model(self) -> None:
        """Name the loaded pair and its backend (left as they are while a pair loads)."""
        info = self.info
        if self.remote is not None:
            self.pair_label.setText(self.remote.label)
            self.pair_label.setToolTip(f"{self.remote.model} at {self.remote.base_url}")
            self.backend_label.setText(f"Remote · {self.remote.host}")
            self.backend_label.setToolTip("Replies come from this server; the loaded pair (if any) waits")
        elif info:
            models = [m for m in (info.target, info.draft) if m is not None]
            self.pair_label.setText("  +  ".join(Path(m.path).name for m in models))
            self.pair_label.setToolTip(
                "\n".join(
                    f"{role}: {m.description}, {m.offload.describe()}\n    {describe_memory(m)}"
                    for role, m in (("target", info.target), ("draft", info.draft))
                    if m is not None
                )
            )
            if info.target.rollback is Rollback.NONE:
                self.pair_label.setText(self.pair_label.text() + "  · plain decoding only")
            self.backend_label.setText(backend_text(info))
            self.backend_label.setToolTip(info.placement())
        elif not self.session.loading:
            self.pair_label.setText("No model loaded")
            self.backend_label.setText("")

    def update_memory(self) -> None:
        if not self.info:
            self.memory_label.setText("")
            return
        text = f"models {format_bytes(self.info.size_bytes)}"
        pid = self.client.pid
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                text += f" · engine RAM {format_bytes(psutil.Process(pid).memory_info().rss)}"
        self.memory_label.setText(text)

    def stop(self) -> None:
        """Stop measuring memory (the window is closing)."""
        self._memory_timer.stop()


def backend_text(info: EngineInfo) -> str:
    """Where the models run: ``CUDA · NVIDIA RTX 4060 (8.6 GB)``, ``CPU · AMD EPYC ...``; a pair split
    between the GPU and the CPU says how many target layers are on the GPU."""
    gpus = [d for d in info.devices if d.kind in ("GPU", "IGPU")]
    offload = info.target.offload
    if offload.on_gpu and gpus:
        dev = next((d for d in gpus if d.description == offload.device), gpus[0])  # the one it runs on
        text = f"{offload.backend} · {dev.description or dev.name}"
        if dev.memory_total:
            text += f" ({format_bytes(dev.memory_total)})"
        if offload.layers_offloaded < offload.layers_total:
            text += f" · {offload.layers_offloaded}/{offload.layers_total} target layers"
        return text
    cpu = next((d for d in info.devices if d.kind == "CPU"), None)
    name = (cpu.description or cpu.name) if cpu else ""
    return f"CPU · {name}" if name else "CPU"
