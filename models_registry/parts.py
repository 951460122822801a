"""A model's files on the Hub: one GGUF, or the parts of a split GGUF (``name-00001-of-00003.gguf``).

`download_model` fetches every part of a model through `transfer.download` (each part resumable and
verified on its own) and reports one progress for the whole model, bytes summed over the parts. The
parts land in one snapshot of the cache, side by side, where llama.cpp finds them from the first part.
`cached_model` says whether a whole model is in the cache; `part_paths` names a model's parts.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import threading
from pathlib import Path

from huggingface_hub import constants

from app.gguf.split import model_bytes, part_names

from .hf_cache import (
    blob_path,
    cached_path,
    hub_cache_dir,
    partial_path,
    snapshot_path,
    storage_folder,
    write_ref,
)
from .hub_errors import DiskSpaceError, HubError, OfflineError
from .hub_settings import is_offline
from .progress import ProgressCallback
from .resolve import RemoteFileInfo, resolve_file, validate_hub_path
from .retry import RetryPolicy
from .transfer import DISK_MARGIN, download

__all__ = ["cached_model", "download_model", "first_part_path", "model_bytes", "part_paths", "resolve_parts"]


def part_paths(filename: str) -> list[str]:
    """The repository paths of every part of the model `filename` names (any part of it); ``[filename]``
    for a single file. A subfolder (``Q8_0/name-00001-of-00002.gguf``) is kept."""
    folder, name = posixpath.split(filename)
    return [posixpath.join(folder, n) for n in part_names(name)]


def first_part_path(filename: str) -> str:
    """The repository path of the file llama.cpp opens: the first part of a split model, or `filename`."""
    return part_paths(filename)[0]


def cached_model(
    repo_id: str, filename: str, *, revision: str | None = None, cache_dir: Path | None = None
) -> Path | None:
    """The first part of the model `filename` names when every part is in the cache, in one snapshot;
    else None (no network access). For a single file, the file."""
    paths = [cached_path(repo_id, p, revision=revision, cache_dir=cache_dir) for p in part_paths(filename)]
    if any(p is None for p in paths):
        return None
    first = paths[0]
    assert first is not None
    if any(p is None or p.parent != first.parent for p in paths):
        return None  # parts cached at different commits: llama.cpp would not find them side by side
    return first


def resolve_parts(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    policy: RetryPolicy | None = None,
    cancel: threading.Event | None = None,
) -> list[RemoteFileInfo]:
    """What the Hub says about every part of the model `filename` names (one HEAD per part)."""
    return [
        resolve_file(repo_id, p, revision=revision, token=token, policy=policy, cancel=cancel)
        for p in part_paths(filename)
    ]


def download_model(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    policy: RetryPolicy | None = None,
) -> Path:
    """Download a model into the HF cache and return the path llama.cpp opens (the first part).

    `filename` is a single GGUF or any part of a split one; a split model is fetched whole, every part
    from the same commit. Each part is a `transfer.download`: resumable across calls, verified against
    the Hub's hash, published only once whole. `progress(bytes_done, bytes_total, speed_bps, eta_s)`
    covers the whole model (bytes summed over the parts, parts already cached counted as done). Setting
    `cancel` stops with `DownloadCancelled` and keeps what was fetched. Raises a `HubError` subclass.
    """
    validate_hub_path(repo_id, filename)
    names = part_paths(filename)
    if len(names) == 1:
        return download(
            repo_id, filename, revision=revision, progress=progress, cancel=cancel, token=token,
            cache_dir=cache_dir, policy=policy,
        )  # fmt: skip
    policy = policy or RetryPolicy()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    rev = revision or constants.DEFAULT_REVISION
    if is_offline():
        hit = cached_model(repo_id, filename, revision=rev, cache_dir=cache)
        if hit is not None:
            return hit
    try:
        infos = resolve_parts(repo_id, filename, revision=rev, token=token, policy=policy, cancel=cancel)
    except OfflineError:
        hit = cached_model(repo_id, filename, revision=rev, cache_dir=cache)
        if hit is not None:
            return hit
        raise
    commits = {i.commit_hash for i in infos}
    if len(commits) != 1:
        raise HubError(
            f"the parts of {repo_id}/{names[0]} changed on the Hub while resolving them; try again"
        )
    commit = commits.pop()
    sizes = [i.size for i in infos]
    _check_space(repo_id, infos, commit, cache)
    write_ref(storage_folder(repo_id, cache), rev, commit)

    whole = _WholeProgress(progress, sum(sizes))
    paths: list[Path] = []
    for i, name in enumerate(names):
        before = sum(sizes[:i])
        paths.append(
            download(
                repo_id, name, revision=commit, cancel=cancel, token=token, cache_dir=cache, policy=policy,
                progress=lambda d, t, s, e, before=before: whole.report(before + d, s),
            )
        )  # fmt: skip
        whole.report(before + sizes[i], 0.0)
    whole.done()
    return paths[0]


def _check_space(repo_id: str, infos: list[RemoteFileInfo], commit: str, cache: Path) -> None:
    """Refuse before the first byte when the disk cannot hold what the parts still need."""
    needed = 0
    for info in infos:
        if snapshot_path(repo_id, commit, info.filename, cache).exists():
            continue
        if blob_path(repo_id, info.etag, cache).exists():
            continue
        partial = partial_path(repo_id, info.etag, cache)
        needed += info.size - (partial.stat().st_size if partial.exists() else 0)
    if not needed:
        return
    folder = storage_folder(repo_id, cache)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed + DISK_MARGIN:
        gib = 1024**3
        raise DiskSpaceError(
            f"not enough disk space for {repo_id}/{infos[0].filename} ({len(infos)} parts): "
            f"{needed / gib:.2f} GiB still to download plus a {DISK_MARGIN / gib:.2f} GiB margin, but only "
            f"{free / gib:.2f} GiB free in {folder}"
        )


class _WholeProgress:
    """One progress for the whole model: each part's reports offset by the bytes of the parts before it,
    never going backwards; the speed is the part's own (network bytes only), the ETA for what is left."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self._cb = callback
        self._total = total
        self._last = -1
        self._speed = 0.0

    def report(self, done: int, speed: float) -> None:
        if self._cb is None:
            return
        done = min(done, self._total - 1)  # "complete" only once every part is verified
        self._speed = speed or self._speed
        if done < self._last:
            return
        self._last = done
        eta = (self._total - done) / self._speed if self._speed > 0 else None
        self._cb(done, self._total, self._speed, eta)

    def done(self) -> None:
        if self._cb is not None:
            self._cb(self._total, self._total, self._speed, 0.0)
