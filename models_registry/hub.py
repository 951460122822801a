"""Resumable, verified downloads of Hub files into the standard Hugging Face cache: single files, and
models published as split GGUFs (every part under one progress).

The public face of the Hub client; the work is done in modules that each own one part:

- `hub_settings`: endpoint, offline mode and token, read from the environment at call time
- `hub_errors`: `HubError` and its subclasses, with messages for the user
- `retry`: `RetryPolicy` and which failures are transient
- `hf_cache`: the cache location and layout (``blobs/``, ``snapshots/``, ``refs/``)
- `resolve`: `resolve_file`, what the Hub says about a file (size, hash, commit, location)
- `transfer`: `download`, the resumable, cancellable, verified transfer of one file
- `parts`: a model's files (one GGUF or the parts of a split one): `download_model`, `cached_model`
- `progress`, `verify`: progress reports and hashing used by `transfer`

Environment, read at call time: ``HF_HUB_CACHE`` / ``HF_HOME`` (cache location), ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, ``HF_TOKEN``.
"""

from __future__ import annotations

from .hf_cache import cached_path, hub_cache_dir, partial_path, storage_folder
from .hub_errors import (
    DiskSpaceError,
    DownloadCancelled,
    GatedRepoError,
    HubError,
    IntegrityError,
    NotFoundError,
    OfflineError,
    TransferError,
)
from .hub_settings import LIBRARY_NAME, hub_endpoint, is_offline
from .parts import cached_model, download_model, first_part_path, model_bytes, part_paths
from .progress import PROGRESS_INTERVAL, SPEED_WINDOW, ProgressCallback
from .resolve import RemoteFileInfo, resolve_file
from .retry import RetryPolicy
from .transfer import CHUNK_SIZE, DISK_MARGIN, LOCK_TIMEOUT, download

__all__ = [
    "CHUNK_SIZE",
    "DISK_MARGIN",
    "LIBRARY_NAME",
    "LOCK_TIMEOUT",
    "PROGRESS_INTERVAL",
    "SPEED_WINDOW",
    "DiskSpaceError",
    "DownloadCancelled",
    "GatedRepoError",
    "HubError",
    "IntegrityError",
    "NotFoundError",
    "OfflineError",
    "ProgressCallback",
    "RemoteFileInfo",
    "RetryPolicy",
    "TransferError",
    "cached_model",
    "cached_path",
    "download",
    "download_model",
    "first_part_path",
    "hub_cache_dir",
    "hub_endpoint",
    "is_offline",
    "model_bytes",
    "part_paths",
    "partial_path",
    "resolve_file",
    "storage_folder",
]
