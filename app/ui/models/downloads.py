"""Download queue: one Python thread runs `models_registry.hub.download_model` for one model at a time (a
single GGUF, or every part of a split one under one progress, bytes summed over the parts).

:class:`DownloadManager` is a QObject living in the GUI thread. Its worker thread starts when something
is queued and ends when the queue is empty; what the worker reports crosses back through one queued
signal and is applied to the :class:`DownloadItem` (and re-emitted) in the GUI thread. Progress is
coalesced: the worker keeps only the latest figures and posts at most one wake-up until the GUI has read
them (the hub itself reports at most ~10 times a second). Cancelling sets the download's
``threading.Event``; the hub keeps the partial file, so *Resume* is simply downloading again.

The queue is shown by `app.ui.models.downloads_view`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from models_registry import hub

log = logging.getLogger("tandem.ui")

__all__ = ["DownloadItem", "DownloadManager", "error_kind"]

QUEUED, DOWNLOADING, DONE, CANCELLED, FAILED = "queued", "downloading", "done", "cancelled", "failed"
ACTIVE_STATES = (QUEUED, DOWNLOADING)


# ------------------------------------------------------------------------------------------- errors


def error_kind(e: BaseException) -> str:
    """A short class for an error of `hub.download_model`: gated, not-found, offline, disk, integrity,
    transfer."""
    for cls, kind in (
        (hub.GatedRepoError, "gated"),
        (hub.NotFoundError, "not-found"),
        (hub.OfflineError, "offline"),
        (hub.DiskSpaceError, "disk"),
        (hub.IntegrityError, "integrity"),
        (hub.TransferError, "transfer"),
    ):
        if isinstance(e, cls):
            return kind
    return "error"


# ------------------------------------------------------------------------------------------------ model


@dataclass
class DownloadItem:
    """One model of the queue (a split model's first part names it); changed only in the GUI thread."""

    key: int
    repo_id: str
    filename: str
    revision: str | None = None
    group: str | None = None  # e.g. the catalog pair id both files of a pair share
    label: str = ""
    expected_size: int | None = None  # from the catalog, shown until the Hub reports the real size
    state: str = QUEUED
    done: int = 0
    total: int = 0
    speed: float = 0.0
    eta: float | None = None
    error: str = ""
    error_kind: str = ""
    path: Path | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def fraction(self) -> float:
        total = self.total or self.expected_size or 0
        return min(1.0, self.done / total) if total else 0.0

    @property
    def name(self) -> str:
        return self.label or f"{self.repo_id}/{self.filename}"

    @property
    def parts(self) -> list[str]:
        """The model's files in the repository: every part of a split model, else the one file."""
        return hub.part_paths(self.filename)


class DownloadManager(QObject):
    """Queue of Hub model downloads run one at a time on a worker thread; every signal arrives in the GUI
    thread. Keys are ints; the same model queued twice (by any of its parts) returns the existing item."""

    added = Signal(int)  # key
    changed = Signal(int)  # key: state or figures changed
    progress = Signal(int, int, int)  # key, bytes done, bytes total
    fileFinished = Signal(int, str)  # key, local path
    fileFailed = Signal(int, str)  # key, message
    removed = Signal(int)
    busyChanged = Signal(bool)

    _post = Signal(object)  # worker thread -> GUI thread

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        cache_dir: str | Path | None = None,
        token: str | bool | None = None,
        policy: hub.RetryPolicy | None = None,
    ) -> None:
        super().__init__(parent)
        self.cache_dir = cache_dir
        self.token = token
        self.policy = policy
        self.items: dict[int, DownloadItem] = {}
        self._next_key = 1
        self._lock = threading.Lock()
        self._queue: deque[int] = deque()
        self._specs: dict[int, tuple[str, str, str | None]] = {}  # immutable copies for the worker
        self._active: int | None = None
        self._cancel: threading.Event | None = None
        self._latest: dict[int, tuple[int, int, float, float | None]] = {}
        self._wake_pending = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False
        self._post.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)

    # -- requests (GUI thread) ----------------------------------------------------------------------
    def enqueue(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None = None,
        group: str | None = None,
        label: str = "",
        expected_size: int | None = None,
    ) -> int:
        """Queue a model (or re-queue it if it failed or was cancelled); returns its key. A split model may be
        named by any part: the item is its first part, and every part is fetched."""
        if self._closed:
            raise RuntimeError("the download manager is shut down")
        filename = hub.first_part_path(filename)
        for item in self.items.values():
            if (item.repo_id, item.filename, item.revision) == (repo_id, filename, revision):
                if item.state in (CANCELLED, FAILED):
                    self.resume(item.key)
                elif item.state == DONE and not (item.path and item.path.exists()):
                    self.resume(item.key)  # deleted since: fetch again
                if group and item.group is None:
                    item.group = group
                return item.key
        key = self._next_key
        self._next_key += 1
        item = DownloadItem(key, repo_id, filename, revision, group, label, expected_size)
        self.items[key] = item
        with self._lock:
            self._specs[key] = (repo_id, filename, revision)
        self.added.emit(key)
        self._start(key)
        return key

    def cancel(self, key: int) -> None:
        """Cancel a queued or running download (the partial file is kept for a later resume)."""
        item = self.items.get(key)
        if item is None or not item.active:
            return
        with self._lock:
            if key in self._queue:
                self._queue.remove(key)
                queued = True
            else:
                queued = False
                if self._active == key and self._cancel is not None:
                    self._cancel.set()
        if queued:
            item.state = CANCELLED
            item.speed, item.eta = 0.0, None
            self.changed.emit(key)
            self._update_busy()

    def resume(self, key: int) -> None:
        """Queue a cancelled or failed download again; it continues from the partial file."""
        item = self.items.get(key)
        if item is None or item.active:
            return
        self._start(key)

    def remove(self, key: int) -> None:
        """Forget a finished, failed or cancelled item (an active one is cancelled first)."""
        item = self.items.get(key)
        if item is None:
            return
        if item.active:
            self.cancel(key)
            if item.active:  # running: it leaves the list once the worker reports the cancel
                item.group = "__remove__"
                return
        del self.items[key]
        self.removed.emit(key)

    def clear_finished(self) -> None:
        for key in [k for k, it in self.items.items() if it.state == DONE]:
            self.remove(key)

    def cancel_all(self) -> None:
        for key in list(self.items):
            self.cancel(key)

    def find(self, repo_id: str, filename: str) -> DownloadItem | None:
        """The item of the model `filename` names (any part of a split model), or None."""
        filename = hub.first_part_path(filename)
        for item in self.items.values():
            if item.repo_id.lower() == repo_id.lower() and item.filename == filename:
                return item
        return None

    def group_items(self, group: str) -> list[DownloadItem]:
        return [it for it in self.items.values() if it.group == group]

    @property
    def busy(self) -> bool:
        return self._busy

    def is_running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel everything and join the worker thread (partial files stay for the next start)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._queue.clear()
            if self._cancel is not None:
                self._cancel.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("the download thread did not stop within %.0f s", timeout)

    # -- internals (GUI thread) ---------------------------------------------------------------------
    def _start(self, key: int) -> None:
        item = self.items[key]
        item.state, item.error, item.error_kind = QUEUED, "", ""
        item.speed, item.eta = 0.0, None
        with self._lock:
            self._queue.append(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tandem-download", daemon=True)
                self._thread.start()
        self.changed.emit(key)
        self._update_busy()

    def _update_busy(self) -> None:
        busy = any(it.active for it in self.items.values())
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    @Slot(object)
    def _dispatch(self, msg: tuple[str, int, Any]) -> None:
        kind, key, value = msg
        item = self.items.get(key)
        if kind == "progress":
            with self._lock:
                self._wake_pending = False
                latest = dict(self._latest)
                self._latest.clear()
            for k, (done, total, speed, eta) in latest.items():
                it = self.items.get(k)
                if it is None or it.state != DOWNLOADING:
                    continue
                it.done, it.total, it.speed, it.eta = done, total, speed, eta
                self.progress.emit(k, done, total)
                self.changed.emit(k)
            return
        if item is None:
            return
        if kind == "started":
            item.state = DOWNLOADING
        elif kind == "done":
            item.state, item.path = DONE, Path(value)
            item.done = item.total = hub.model_bytes(item.path) if item.path.exists() else item.total
            item.speed, item.eta = 0.0, 0.0
        elif kind == "cancelled":
            item.state, item.speed, item.eta = CANCELLED, 0.0, None
        elif kind == "failed":
            item.state, item.speed, item.eta = FAILED, 0.0, None
            item.error_kind, item.error = value
        self.changed.emit(key)
        if kind == "done":
            self.fileFinished.emit(key, str(item.path))
        elif kind == "failed":
            self.fileFailed.emit(key, item.error)
        if item.group == "__remove__" and not item.active:
            del self.items[key]
            self.removed.emit(key)
        self._update_busy()

    # -- worker thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._closed:
                    self._thread = None
                    self._active = self._cancel = None
                    return
                key = self._queue.popleft()
                repo_id, filename, revision = self._specs[key]
                self._active, self._cancel = key, threading.Event()
                cancel = self._cancel
            self._post.emit(("started", key, None))
            try:
                path = hub.download_model(
                    repo_id, filename, revision=revision, cancel=cancel, token=self.token,
                    cache_dir=self.cache_dir, policy=self.policy,
                    progress=lambda d, t, s, e, k=key: self._on_progress(k, d, t, s, e),
                )  # fmt: skip
            except hub.DownloadCancelled:
                self._post.emit(("cancelled", key, None))
            except hub.HubError as e:
                self._post.emit(("failed", key, (error_kind(e), str(e))))
            except OSError as e:
                kind = "disk" if getattr(e, "errno", None) in (28, 122) else "error"
                self._post.emit(("failed", key, (kind, f"{e.strerror or e} ({e.filename or repo_id})")))
            except Exception as e:  # a bug: report it on the item, keep the queue going
                log.exception("download of %s/%s failed", repo_id, filename)
                self._post.emit(("failed", key, ("error", f"unexpected error: {type(e).__name__}: {e}")))
            else:
                self._post.emit(("done", key, str(path)))
            finally:
                with self._lock:
                    self._active = self._cancel = None

    def _on_progress(self, key: int, done: int, total: int, speed: float, eta: float | None) -> None:
        with self._lock:
            self._latest[key] = (done, total, speed, eta)
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self._post.emit(("progress", key, None))
