"""The local model library: GGUF files in the Hugging Face cache and in user-added folders.

Listing never touches the network. Deleting is explicit and narrow: one cache revision (through
huggingface_hub's own delete strategy, so shared blobs stay intact) or one ``*.gguf`` file inside a
user folder. Asking the user for confirmation is the caller's job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import platformdirs
from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from .catalog import Catalog, default_catalog
from .hf_cache import hub_cache_dir

__all__ = [
    "LibraryError",
    "LocalModel",
    "PartialDownload",
    "add_folder",
    "delete_cached_revision",
    "delete_user_file",
    "folders_file",
    "list_local",
    "list_partials",
    "load_folders",
    "remove_folder",
    "save_folders",
]


class LibraryError(Exception):
    """A library operation was refused or failed (message for the user)."""


@dataclass(frozen=True)
class LocalModel:
    """One GGUF file on disk."""

    path: Path
    size: int
    source: Literal["hf-cache", "folder"]
    repo_id: str | None = None  # hf-cache only
    filename: str | None = None  # path inside the repo (hf-cache) or the file name
    commit: str | None = None  # hf-cache only
    refs: tuple[str, ...] = ()  # branches/tags pointing at that commit
    catalog_id: str | None = None
    quant: str | None = None

    @property
    def display_name(self) -> str:
        return f"{self.repo_id}/{self.filename}" if self.repo_id else str(self.path)


@dataclass(frozen=True)
class PartialDownload:
    """An interrupted download (``blobs/<sha256>.incomplete``) that a new download will resume."""

    path: Path
    size: int
    repo_id: str | None


# -------------------------------------------------------------------------------------------- folders


def folders_file() -> Path:
    """Where the user-added folders are remembered (``<user config dir>/Tandem/library.json``)."""
    return Path(platformdirs.user_config_dir("Tandem", appauthor=False)) / "library.json"


def load_folders(path: Path | None = None) -> list[Path]:
    """User-added model folders (empty if none saved or the file is unreadable)."""
    p = path or folders_file()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    folders = data.get("folders", []) if isinstance(data, dict) else []
    return [Path(f) for f in folders if isinstance(f, str)]


def save_folders(folders: Iterable[Path], path: Path | None = None) -> None:
    """Persist the folder list (deduplicated, order kept), atomically."""
    p = path or folders_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    unique = list(dict.fromkeys(str(Path(f).expanduser().resolve()) for f in folders))
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"folders": unique}, indent=2), encoding="utf-8")
    os.replace(tmp, p)


def add_folder(folder: str | os.PathLike[str], path: Path | None = None) -> list[Path]:
    """Remember `folder` (must be an existing directory); returns the new list."""
    f = Path(folder).expanduser()
    if not f.is_dir():
        raise LibraryError(f"{f} is not a folder")
    folders = [*load_folders(path), f.resolve()]
    save_folders(folders, path)
    return load_folders(path)


def remove_folder(folder: str | os.PathLike[str], path: Path | None = None) -> list[Path]:
    """Forget `folder` (its files are left alone); returns the new list."""
    target = Path(folder).expanduser().resolve()
    save_folders([f for f in load_folders(path) if f.resolve() != target], path)
    return load_folders(path)


# ------------------------------------------------------------------------------------------- listing


def _scan(cache_dir: Path):  # -> HFCacheInfo | None
    try:
        return scan_cache_dir(cache_dir)
    except CacheNotFound:
        return None


def list_local(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    folders: Sequence[str | os.PathLike[str]] | None = None,
    catalog: Catalog | None = None,
) -> list[LocalModel]:
    """GGUF files in the HF cache (every cached revision) and directly inside `folders`
    (default: the saved user folders), each matched to a catalog entry when it is one."""
    cat = catalog or default_catalog()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    out: list[LocalModel] = []
    info = _scan(cache)
    if info is not None:
        for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
            if repo.repo_type != "model":
                continue
            for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
                for f in sorted(rev.files, key=lambda f: f.file_name):
                    rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                    if not rel.lower().endswith(".gguf"):
                        continue
                    match = cat.find_file(repo.repo_id, rel)
                    out.append(LocalModel(
                        path=f.file_path, size=f.size_on_disk, source="hf-cache", repo_id=repo.repo_id,
                        filename=rel, commit=rev.commit_hash, refs=tuple(sorted(rev.refs)),
                        catalog_id=match[0].id if match else None, quant=match[1].quant if match else None,
                    ))  # fmt: skip
    for folder in folders if folders is not None else load_folders():
        d = Path(folder).expanduser()
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix.lower() != ".gguf" or not p.is_file():
                continue
            match = cat.find_filename(p.name)
            out.append(LocalModel(
                path=p, size=p.stat().st_size, source="folder", filename=p.name,
                catalog_id=match[0].id if match else None, quant=match[1].quant if match else None,
            ))  # fmt: skip
    return out


def list_partials(cache_dir: str | os.PathLike[str] | None = None) -> list[PartialDownload]:
    """Interrupted downloads in the HF cache (resumable by downloading the same file again)."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    info = _scan(cache)
    if info is None:
        return []
    out = []
    for f in sorted(info.incomplete_files, key=lambda f: str(f.file_path)):
        folder = f.file_path.parent.parent.name  # models--owner--name
        repo = folder.split("--", 1)[1].replace("--", "/") if folder.startswith("models--") else None
        out.append(PartialDownload(path=f.file_path, size=f.size_on_disk, repo_id=repo))
    return out


# ------------------------------------------------------------------------------------------ deleting


def delete_cached_revision(
    repo_id: str, commit: str, *, cache_dir: str | os.PathLike[str] | None = None
) -> int:
    """Delete one cached revision of `repo_id` (its snapshot, refs and blobs no other revision uses).

    Returns the bytes freed. Raises `LibraryError` if that revision is not in the cache.
    """
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    info = _scan(cache)
    revs = [
        r
        for repo in (info.repos if info is not None else ())
        if repo.repo_id == repo_id and repo.repo_type == "model"
        for r in repo.revisions
        if r.commit_hash == commit
    ]
    if not revs:
        raise LibraryError(f"revision {commit[:12]} of {repo_id} is not in the cache {cache}")
    assert info is not None
    strategy = info.delete_revisions(commit)
    strategy.execute()
    return strategy.expected_freed_size


def delete_user_file(
    path: str | os.PathLike[str], *, folders: Sequence[str | os.PathLike[str]] | None = None
) -> int:
    """Delete a ``*.gguf`` file that sits directly inside one of the user folders; returns bytes freed.

    Refuses anything else (other extensions, symlinks, files outside the folders) with `LibraryError`.
    """
    p = Path(path).expanduser()
    if p.suffix.lower() != ".gguf":
        raise LibraryError(f"refusing to delete {p}: not a .gguf file")
    if p.is_symlink() or not p.is_file():
        raise LibraryError(f"refusing to delete {p}: not a regular file")
    roots = [Path(f).expanduser().resolve() for f in (folders if folders is not None else load_folders())]
    if p.resolve().parent not in roots:
        raise LibraryError(f"refusing to delete {p}: it is not inside one of your model folders")
    size = p.stat().st_size
    p.unlink()
    return size
