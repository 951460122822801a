"""The local model library: GGUF files in the Hugging Face cache and in user-added folders.

A split GGUF (``name-00001-of-00003.gguf`` and its siblings) is one model, listed once as its first part
with every part's bytes; in the cache a split model with parts still missing is a partial download.
Listing never touches the network. Deleting is explicit and narrow: one cache revision (through
huggingface_hub's own delete strategy, so shared blobs stay intact) or one ``*.gguf`` file inside a
user folder. Asking the user for confirmation is the caller's job.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import platformdirs
from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from app.gguf.split import model_parts, split_info

from .catalog import Catalog, default_catalog
from .hf_cache import hub_cache_dir
from .parts import model_bytes, part_paths

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
    "model_bytes",
    "remove_folder",
    "save_folders",
]


class LibraryError(Exception):
    """A library operation was refused or failed (message for the user)."""


@dataclass(frozen=True)
class LocalModel:
    """One model on disk: a GGUF file, or a split GGUF as its first part (`size` counts every part)."""

    path: Path
    size: int
    source: Literal["hf-cache", "folder"]
    repo_id: str | None = None  # hf-cache only
    filename: str | None = None  # path inside the repo (hf-cache) or the file name
    commit: str | None = None  # hf-cache only
    refs: tuple[str, ...] = ()  # branches/tags pointing at that commit
    catalog_id: str | None = None
    quant: str | None = None
    parts: int = 1  # files of a split model
    missing: tuple[str, ...] = ()  # parts not on disk (user folders only: the cache lists whole models)

    @property
    def display_name(self) -> str:
        return f"{self.repo_id}/{self.filename}" if self.repo_id else str(self.path)

    @property
    def complete(self) -> bool:
        """Every part is on disk (always, for a single file)."""
        return not self.missing


@dataclass(frozen=True)
class PartialDownload:
    """An interrupted download that a new download resumes: a ``blobs/<sha256>.incomplete`` file, or a
    split model some of whose parts are finished (then `path` is its first part in the snapshot,
    `filename` that part's path in the repo, `missing` the parts not finished, and `size` every byte
    downloaded for it, the repository's unfinished blobs included)."""

    path: Path
    size: int
    repo_id: str | None
    filename: str | None = None
    missing: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class _Model:
    """A model among listed files: its first part's path (in the repo or folder) and where it is."""

    name: str
    path: Path
    size: int
    parts: int
    missing: tuple[str, ...]


def _models(files: Iterable[tuple[str, Path, int]]) -> list[_Model]:
    """Group files (path in the repo or folder, path on disk, bytes) into models: a split GGUF's parts
    into one model named by its first part, in the order of the files."""
    groups: dict[str, list[tuple[str, Path, int]]] = {}
    for name, path, size in files:
        groups.setdefault(part_paths(name)[0], []).append((name, path, size))
    out = []
    for first, members in groups.items():
        names = part_paths(first)
        have = {n for n, _, _ in members}
        path = members[0][1].with_name(first.rsplit("/", 1)[-1])
        missing = tuple(n for n in names if n not in have)
        out.append(_Model(first, path, sum(size for _, _, size in members), len(names), missing))
    return out


def _cache_models(info, cat: Catalog | None) -> tuple[list[LocalModel], list[PartialDownload]]:
    """The whole models in the cache `info` (an ``HFCacheInfo``; matched to `cat`, if given), and the
    split models with parts still missing."""
    whole: list[LocalModel] = []
    partial: list[PartialDownload] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            files = [
                (f.file_path.relative_to(rev.snapshot_path).as_posix(), f.file_path, f.size_on_disk)
                for f in sorted(rev.files, key=lambda f: f.file_name)
            ]
            for m in _models((n, p, size) for n, p, size in files if n.lower().endswith(".gguf")):
                if m.missing:
                    partial.append(PartialDownload(m.path, m.size, repo.repo_id, m.name, m.missing))
                    continue
                match = cat.find_file(repo.repo_id, m.name) if cat is not None else None
                whole.append(LocalModel(
                    path=m.path, size=m.size, source="hf-cache", repo_id=repo.repo_id, filename=m.name,
                    commit=rev.commit_hash, refs=tuple(sorted(rev.refs)), parts=m.parts,
                    catalog_id=match[0].id if match else None, quant=match[1].quant if match else None,
                ))  # fmt: skip
    return whole, partial


def list_local(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    folders: Sequence[str | os.PathLike[str]] | None = None,
    catalog: Catalog | None = None,
) -> list[LocalModel]:
    """Models in the HF cache (every cached revision; a split model once all its parts are there) and
    directly inside `folders` (default: the saved user folders; a split model with parts missing is
    listed with them in `missing`), each matched to a catalog entry when it is one, complete."""
    cat = catalog or default_catalog()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    info = _scan(cache)
    out = _cache_models(info, cat)[0] if info is not None else []
    for folder in folders if folders is not None else load_folders():
        d = Path(folder).expanduser()
        if not d.is_dir():
            continue
        files = [(p.name, p, p.stat().st_size) for p in sorted(d.iterdir())
                 if p.suffix.lower() == ".gguf" and p.is_file()]  # fmt: skip
        for m in _models(files):
            match = None if m.missing else cat.find_filename(m.name)
            out.append(LocalModel(
                path=m.path, size=m.size, source="folder", filename=m.name, parts=m.parts, missing=m.missing,
                catalog_id=match[0].id if match else None, quant=match[1].quant if match else None,
            ))  # fmt: skip
    return out


def list_partials(cache_dir: str | os.PathLike[str] | None = None) -> list[PartialDownload]:
    """Interrupted downloads in the HF cache (resumable by downloading the same model again). A split
    model with some parts finished is listed once, with the repository's unfinished blobs counted in
    when it is the only such model of its repository."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    info = _scan(cache)
    if info is None:
        return []
    splits = _cache_models(info, None)[1]
    out: list[PartialDownload] = []
    blobs: dict[str | None, int] = {}
    for f in sorted(info.incomplete_files, key=lambda f: str(f.file_path)):
        folder = f.file_path.parent.parent.name  # models--owner--name
        repo = folder.split("--", 1)[1].replace("--", "/") if folder.startswith("models--") else None
        if sum(p.repo_id == repo for p in splits) == 1:
            blobs[repo] = blobs.get(repo, 0) + f.size_on_disk
        else:
            out.append(PartialDownload(path=f.file_path, size=f.size_on_disk, repo_id=repo))
    folded = [dataclasses.replace(p, size=p.size + blobs.get(p.repo_id, 0)) for p in splits]
    return folded + out


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
    """Delete a ``*.gguf`` model that sits directly inside one of the user folders (every part of a
    split model that is there); returns bytes freed.

    Refuses anything else (other extensions, symlinks, files outside the folders) with `LibraryError`.
    """
    p = Path(path).expanduser()
    if p.suffix.lower() != ".gguf":
        raise LibraryError(f"refusing to delete {p}: not a .gguf file")
    files = [q for q in model_parts(p) if q.exists() or q.is_symlink()] if split_info(p.name) else [p]
    if not files:
        raise LibraryError(f"refusing to delete {p}: no part of it is on disk")
    roots = [Path(f).expanduser().resolve() for f in (folders if folders is not None else load_folders())]
    for q in files:
        if q.is_symlink() or not q.is_file():
            raise LibraryError(f"refusing to delete {q}: not a regular file")
        if q.resolve().parent not in roots:
            raise LibraryError(f"refusing to delete {q}: it is not inside one of your model folders")
    size = 0
    for q in files:
        size += q.stat().st_size
        q.unlink()
    return size
