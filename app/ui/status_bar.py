"""The main window's status bar: the loaded pair, its backend, memory use and load progress.

It holds the engine's description of the loaded models (``info``, as `EngineWorker.loaded` gives it), so
everything read from that description is here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine import EngineClient, LoadSettings
from models_registry.units import format_bytes

__all__ = ["StatusBar", "backend_text"]

MEMORY_INTERVAL_MS = 2000


class StatusBar(QStatusBar):
    """Pair names (with their offload as a tooltip), backend and device, models' size and the engine's
    RAM (every 2 s), and a progress bar while a pair loads."""

    def __init__(self, client: EngineClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.info: dict[str, Any] | None = None
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

    def loaded(self, info: dict) -> None:
        self.info = info
        self.progress.setVisible(False)

    def load_failed(self) -> None:
        """Hide the progress; keep ``info`` only while the engine still has a pair loaded."""
        self.progress.setVisible(False)
        self.info = None if not self.client.settings else self.info

    def show_failure(self, message: str) -> None:
        self.pair_label.setText("Loading failed")
        self.showMessage(message, 15000)

    # -- the loaded pair ----------------------------------------------------------------------------
    @property
    def has_draft(self) -> bool:
        """A draft model is loaded."""
        return bool(self.info and self.info.get("draft"))

    def where(self) -> str:
        """Where the models run, for the gauges: "CPU", "GPU" or "" (nothing loaded)."""
        backend = (self.info or {}).get("backend", "")
        return "CPU" if backend == "CPU" else ("GPU" if backend else "")

    def about_backend(self) -> str:
        """The backend line of the About box."""
        return backend_text(self.info) if self.info else "no model loaded"

    def show_model(self, loading: bool) -> None:
        """Name the loaded pair and its backend (left as they are while a pair loads)."""
        info = self.info
        if info:
            names = [Path(info["target"]["path"]).name]
            if info.get("draft"):
                names.append(Path(info["draft"]["path"]).name)
            self.pair_label.setText("  +  ".join(names))
            self.pair_label.setToolTip(
                "\n".join(
                    f"{k}: {info[k]['description']}, {info[k]['offload']}"
                    for k in ("target", "draft")
                    if info.get(k)
                )
            )
            self.backend_label.setText(backend_text(info))
        elif not loading:
            self.pair_label.setText("No model loaded")
            self.backend_label.setText("")

    def update_memory(self) -> None:
        if not self.info:
            self.memory_label.setText("")
            return
        size = sum(self.info[k]["size_bytes"] for k in ("target", "draft") if self.info.get(k))
        text = f"models {format_bytes(size)}"
        pid = self.client.pid
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                text += f" · engine RAM {format_bytes(psutil.Process(pid).memory_info().rss)}"
        self.memory_label.setText(text)

    def stop(self) -> None:
        """Stop measuring memory (the window is closing)."""
        self._memory_timer.stop()


def backend_text(info: dict[str, Any]) -> str:
    """The backend and the device it runs on: ``backend · device (GPU memory)``."""
    backend = info.get("backend", "?")
    devices = info.get("devices") or []
    gpus = [d for d in devices if d.get("kind") != "CPU"]
    dev = gpus[0] if gpus else (devices[0] if devices else None)
    if dev is None:
        return backend
    name = dev.get("description") or dev.get("name") or ""
    mem = dev.get("memory_total")
    extra = f" ({format_bytes(mem)})" if gpus and mem else ""
    return f"{backend} · {name}{extra}"
