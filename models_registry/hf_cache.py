"""Where files live in the standard Hugging Face cache, and the writes that publish a finished blob::

    <cache>/models--owner--name/blobs/<sha256>             finished, verified file
    <cache>/models--owner--name/blobs/<sha256>.incomplete  partial download (kept for resume)
    <cache>/models--owner--name/snapshots/<commit>/<file>  relative symlink to the blob
    <cache>/models--owner--name/refs/<revision>            commit hash of a branch or tag
    <cache>/.locks/models--owner--name/<sha256>.lock       held while a blob is downloaded

so `huggingface_hub.try_to_load_from_cache` and `scan_cache_dir` (and other tools) find what we write.
The location is read from ``HF_HUB_CACHE`` / ``HF_HOME`` at call time.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache

__all__ = [
    "blob_path",
    "cached_path",
    "hub_cache_dir",
    "link_into_snapshot",
    "lock_path",
    "partial_path",
    "snapshot_path",
    "storage_folder",
    "write_ref",
]


def hub_cache_dir() -> Path:
    """The hub cache: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(os.path.expandvars(os.path.expanduser(env)))
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(os.path.expanduser(xdg)) / "huggingface" / "hub"
    return Path(constants.HF_HUB_CACHE)


def _folder_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def storage_folder(repo_id: str, cache_dir: Path | None = None) -> Path:
    """``<cache>/models--owner--name`` for a model repo."""
    return (cache_dir or hub_cache_dir()) / _folder_name(repo_id)


def blob_path(repo_id: str, etag: str, cache_dir: Path | None = None) -> Path:
    """Where the finished blob `etag` lives."""
    return storage_folder(repo_id, cache_dir) / "blobs" / etag


def partial_path(repo_id: str, etag: str, cache_dir: Path | None = None) -> Path:
    """Where the partial download of blob `etag` lives (huggingface_hub's ``<etag>.incomplete``)."""
    return storage_folder(repo_id, cache_dir) / "blobs" / f"{etag}.incomplete"


def snapshot_path(repo_id: str, commit_hash: str, filename: str, cache_dir: Path | None = None) -> Path:
    """The snapshot entry of `filename` (``/``-separated, may be in a subfolder) at `commit_hash`."""
    return storage_folder(repo_id, cache_dir) / "snapshots" / commit_hash / Path(*filename.split("/"))


def lock_path(repo_id: str, etag: str, cache_dir: Path | None = None) -> Path:
    """The lock file guarding the download of blob `etag` (huggingface_hub's own location)."""
    return (cache_dir or hub_cache_dir()) / ".locks" / _folder_name(repo_id) / f"{etag}.lock"


def cached_path(
    repo_id: str, filename: str, *, revision: str | None = None, cache_dir: Path | None = None
) -> Path | None:
    """The finished file in the cache, or None (no network access)."""
    found = try_to_load_from_cache(
        repo_id, filename, cache_dir=str(cache_dir or hub_cache_dir()), revision=revision or "main"
    )
    return Path(found) if isinstance(found, str) else None


def link_into_snapshot(blob: Path, pointer: Path) -> None:
    """Make `pointer` a relative symlink to `blob` (or, without symlinks, move the blob there)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        # no symlinks (e.g. Windows without developer mode): huggingface_hub moves the blob instead
        shutil.move(str(blob), str(pointer))


def write_ref(folder: Path, revision: str, commit_hash: str) -> None:
    """Record that branch or tag `revision` points at `commit_hash` (nothing to do for a commit)."""
    if revision == commit_hash:
        return
    ref = folder / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit_hash:
        ref.write_text(commit_hash)
