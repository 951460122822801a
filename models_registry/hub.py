"""Resumable, verified downloads of single Hub files into the standard Hugging Face cache.

`huggingface_hub` does the URL, endpoint, auth and error-classification work (`hf_hub_url`,
`get_hf_file_metadata`, `build_hf_headers`, its shared HTTP session, `hf_raise_for_status`); this module
does the byte transfer itself because `hf_hub_download` (2.x) can neither be cancelled, nor resume across
processes (it writes to a process-unique temp file that it deletes on failure), nor verify a hash before
the file is published. The result uses the real cache layout::

    <cache>/models--owner--name/blobs/<sha256>             finished, verified file
    <cache>/models--owner--name/blobs/<sha256>.incomplete  partial download (kept for resume)
    <cache>/models--owner--name/snapshots/<commit>/<file>  relative symlink to the blob
    <cache>/models--owner--name/refs/<revision>            commit hash of a branch or tag

so `huggingface_hub.try_to_load_from_cache` and `scan_cache_dir` (and other tools) find it.

Environment, read at call time: ``HF_HUB_CACHE`` / ``HF_HOME`` (cache location), ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, ``HF_TOKEN``.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from filelock import Timeout as LockTimeout
from huggingface_hub import constants, get_hf_file_metadata, get_token, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError as HfGatedRepoError,
)
from huggingface_hub.errors import (
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import WeakFileLock, build_hf_headers, get_session, hf_raise_for_status

from .catalog import CatalogError, validate_filename, validate_repo_id

__all__ = [
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
    "cached_path",
    "download",
    "hub_cache_dir",
    "hub_endpoint",
    "is_offline",
    "partial_path",
    "resolve_file",
    "storage_folder",
]

log = logging.getLogger(__name__)

#: ``progress(bytes_done, bytes_total, speed_bps, eta_s)``; ``eta_s`` is None while the speed is unknown.
ProgressCallback = Callable[[int, int, float, "float | None"], None]

#: Free space kept on top of what the download still needs.
DISK_MARGIN = 256 * 1024 * 1024
#: Bytes asked from the HTTP stream per iteration.
CHUNK_SIZE = 1024 * 1024
#: Progress callbacks are spaced at least this far apart (the final one always comes).
PROGRESS_INTERVAL = 0.1
#: Window over which the reported speed is averaged.
SPEED_WINDOW = 3.0
LIBRARY_NAME = "tandem"
#: How long to wait for another download of the same blob to release the cache lock.
LOCK_TIMEOUT = 2.0

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------------------------------------- errors


class HubError(Exception):
    """Base of every error `download` raises; the message is meant for the user."""


class OfflineError(HubError):
    """The Hub cannot be reached (no network, refused connection, DNS, or ``HF_HUB_OFFLINE``)."""


class GatedRepoError(HubError):
    """The repository needs an accepted licence and/or a token (HTTP 401/403)."""


class NotFoundError(HubError):
    """Repository, revision or file does not exist (HTTP 404)."""


class DiskSpaceError(HubError):
    """Not enough free disk space, before starting or while writing (ENOSPC)."""


class IntegrityError(HubError):
    """The downloaded bytes do not match the Hub's size or hash; the partial file was deleted."""


class DownloadCancelled(HubError):
    """The cancel event was set; the partial file is kept so a later call resumes."""


class TransferError(HubError):
    """The transfer kept failing (dropped connections, stalls, server errors) after all retries."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one `download` call tries before giving up (the partial file is kept either way)."""

    #: consecutive failed attempts (without any new byte) before giving up
    max_retries: int = 8
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    #: no byte for this long while streaming counts as a stall (read timeout)
    stall_timeout: float = 30.0
    connect_timeout: float = 15.0
    #: timeout and retries of the HEAD request that resolves the file's metadata
    metadata_timeout: float = 15.0
    metadata_retries: int = 3

    def delay(self, failures: int) -> float:
        """Backoff before attempt number ``failures + 1``."""
        return min(self.backoff_max, self.backoff_base * (2 ** max(0, failures - 1)))


# ------------------------------------------------------------------------------------------ environment


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


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


def hub_endpoint() -> str:
    """``HF_ENDPOINT`` (read now, not at import), else huggingface_hub's endpoint."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (now, or when huggingface_hub was imported)."""
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or constants.is_offline_mode()


def storage_folder(repo_id: str, cache_dir: Path | None = None) -> Path:
    """``<cache>/models--owner--name`` for a model repo."""
    return (cache_dir or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def partial_path(repo_id: str, etag: str, cache_dir: Path | None = None) -> Path:
    """Where the partial download of blob `etag` lives (huggingface_hub's ``<etag>.incomplete``)."""
    return storage_folder(repo_id, cache_dir) / "blobs" / f"{etag}.incomplete"


def cached_path(
    repo_id: str, filename: str, *, revision: str | None = None, cache_dir: Path | None = None
) -> Path | None:
    """The finished file in the cache, or None (no network access)."""
    found = try_to_load_from_cache(
        repo_id, filename, cache_dir=str(cache_dir or hub_cache_dir()), revision=revision or "main"
    )
    return Path(found) if isinstance(found, str) else None


def _validate(repo_id: str, filename: str) -> None:
    try:
        validate_repo_id(repo_id)
        validate_filename(filename, allow_subfolder=True)
    except CatalogError as e:
        raise NotFoundError(str(e)) from None


# ------------------------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class RemoteFileInfo:
    """What the Hub says about one file (from the HEAD on its resolve URL)."""

    repo_id: str
    filename: str
    revision: str
    url: str  # the resolve URL
    location: str  # where to GET the bytes (CDN URL after a redirect, or the resolve URL)
    size: int
    etag: str  # sha256 for LFS files, git blob sha1 otherwise
    commit_hash: str
    headers: dict[str, str]  # headers for GETs at `location` (no auth if it leaves the Hub)


def _explain(e: BaseException, repo_id: str, filename: str, revision: str, *, has_token: bool) -> HubError:
    """Turn a huggingface_hub / httpx2 error into one of ours with a message for the user."""
    endpoint = hub_endpoint()
    if isinstance(e, HubError):
        return e
    if isinstance(e, OfflineModeIsEnabled):
        return OfflineError(
            f"offline mode is on (HF_HUB_OFFLINE) and {repo_id}/{filename} is not in the cache; "
            "unset HF_HUB_OFFLINE to download it"
        )
    if isinstance(e, HfGatedRepoError):
        if has_token:
            return GatedRepoError(
                f"{repo_id} is gated and the account of your HF_TOKEN has no access yet: accept the "
                f"licence on {endpoint}/{repo_id} with that account (approval can take a while), then retry"
            )
        return GatedRepoError(
            f"{repo_id} is gated: accept the licence on the Hub ({endpoint}/{repo_id}) and set HF_TOKEN "
            "to an access token of that account (https://huggingface.co/settings/tokens)"
        )
    if isinstance(e, RevisionNotFoundError):
        return NotFoundError(f"revision {revision!r} not found in repository {repo_id} on {endpoint}")
    if isinstance(e, RemoteEntryNotFoundError):
        return NotFoundError(f"file {filename!r} not found in repository {repo_id} (revision {revision!r})")
    if isinstance(e, RepositoryNotFoundError):
        hint = "" if has_token else "; if it is private or gated, set HF_TOKEN"
        return NotFoundError(f"repository {repo_id!r} not found on {endpoint}{hint}")
    if isinstance(e, HfHubHTTPError):
        status = e.response.status_code if e.response is not None else None
        if status in (401, 403):
            what = "your HF_TOKEN is not allowed to read it" if has_token else "set HF_TOKEN"
            return GatedRepoError(f"access to {repo_id}/{filename} was denied (HTTP {status}): {what}")
        if status == 404:
            return NotFoundError(f"{repo_id}/{filename} (revision {revision!r}) not found on {endpoint}")
        return TransferError(f"the Hub answered HTTP {status} for {repo_id}/{filename}: {_first_line(e)}")
    if isinstance(e, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.NetworkError)):
        return OfflineError(
            f"cannot reach {endpoint} ({_first_line(e)}): check the network connection, proxy and HF_ENDPOINT"
        )
    if isinstance(e, httpx2.TimeoutException):
        return OfflineError(f"{endpoint} did not answer in time ({type(e).__name__}): check the network")
    if isinstance(e, httpx2.TransportError):
        return TransferError(f"network error talking to {endpoint}: {_first_line(e)}")
    return HubError(f"{type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _has_token(token: str | bool | None) -> bool:
    if isinstance(token, str):
        return bool(token)
    if token is False:
        return False
    return bool(get_token())


def resolve_file(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    policy: RetryPolicy | None = None,
    cancel: threading.Event | None = None,
) -> RemoteFileInfo:
    """HEAD the file's resolve URL through huggingface_hub (retrying transient failures) and describe it."""
    _validate(repo_id, filename)
    policy = policy or RetryPolicy()
    revision = revision or constants.DEFAULT_REVISION
    has_token = _has_token(token)
    if is_offline():
        raise _explain(OfflineModeIsEnabled(), repo_id, filename, revision, has_token=has_token)
    endpoint = hub_endpoint()
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    headers = build_hf_headers(token=token, library_name=LIBRARY_NAME)
    failures = 0
    while True:
        try:
            meta = get_hf_file_metadata(
                url, token=token, timeout=policy.metadata_timeout, endpoint=endpoint,
                library_name=LIBRARY_NAME,
            )  # fmt: skip
            break
        except (httpx2.TransportError, HfHubHTTPError) as e:
            transient = isinstance(e, httpx2.TransportError) or (
                isinstance(e, HfHubHTTPError)
                and e.response is not None
                and e.response.status_code in (408, 429, 500, 502, 503, 504)
            )
            failures += 1
            if not transient or failures > policy.metadata_retries:
                raise _explain(e, repo_id, filename, revision, has_token=has_token) from None
            log.info("metadata request for %s/%s failed (%s), retrying", repo_id, filename, _first_line(e))
            if cancel is not None and cancel.wait(policy.delay(failures)):
                raise DownloadCancelled(f"download of {repo_id}/{filename} cancelled") from None
            if cancel is None:
                time.sleep(policy.delay(failures))
        except OfflineModeIsEnabled as e:
            raise _explain(e, repo_id, filename, revision, has_token=has_token) from None
    if not meta.commit_hash:
        raise HubError(
            f"{endpoint} did not answer like a Hugging Face Hub (no X-Repo-Commit header): check HF_ENDPOINT"
        )
    if not meta.etag:
        raise HubError(f"the Hub gave no ETag for {repo_id}/{filename}: cannot verify the download")
    if meta.size is None:
        raise HubError(f"the Hub gave no size for {repo_id}/{filename}")
    location = meta.location or url
    get_headers = dict(headers)
    get_headers["Accept-Encoding"] = "identity"
    if _origin(location) != _origin(url):
        # signed CDN URL: never send the token off the Hub (huggingface_hub does the same)
        get_headers = {k: v for k, v in get_headers.items() if k.lower() != "authorization"}
    return RemoteFileInfo(
        repo_id=repo_id, filename=filename, revision=revision, url=url, location=location, size=meta.size,
        etag=meta.etag, commit_hash=meta.commit_hash, headers=get_headers,
    )  # fmt: skip


def _origin(url: str) -> tuple[str, str, int | None]:
    u = httpx2.URL(url)
    return (u.scheme, u.host, u.port)


# ------------------------------------------------------------------------------------------- progress


class _Progress:
    """Rate-limited, monotonic progress reports with a sliding-window speed."""

    def __init__(self, callback: ProgressCallback | None, total: int, clock: Callable[[], float]) -> None:
        self._cb = callback
        self._total = total
        self._clock = clock
        self._last_t: float | None = None
        self._last_done = -1
        self._samples: deque[tuple[float, int]] = deque()
        self._transferred = 0  # bytes received by this call (the speed ignores resumed bytes)

    def received(self, n: int) -> None:
        self._transferred += n

    def report(self, done: int, *, force: bool = False) -> None:
        if self._cb is None:
            return
        now = self._clock()
        self._samples.append((now, self._transferred))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW:
            self._samples.popleft()
        if done < self._last_done:
            return  # never go backwards (only a server ignoring Range could cause it)
        if not force and self._last_t is not None and now - self._last_t < PROGRESS_INTERVAL:
            return
        if force and done == self._last_done and self._last_t is not None and done != self._total:
            return
        t0, b0 = self._samples[0]
        speed = (self._transferred - b0) / (now - t0) if now > t0 else 0.0
        eta = (self._total - done) / speed if speed > 0 else (0.0 if done >= self._total else None)
        self._last_t, self._last_done = now, done
        self._cb(done, self._total, speed, eta)


# ------------------------------------------------------------------------------------------- verifying


class _Verifier:
    """Incremental hash of the file as it grows: sha256 (LFS etag) or git blob sha1 (non-LFS etag)."""

    def __init__(self, etag: str, size: int) -> None:
        self.etag = etag
        self.size = size
        self.kind = "sha256" if _SHA256.match(etag) else "git-sha1" if _GIT_SHA1.match(etag) else None
        self.reset()

    def reset(self) -> None:
        if self.kind == "git-sha1":
            self._h: Any = hashlib.sha1(usedforsecurity=False)
            self._h.update(b"blob %d\0" % self.size)
        else:
            self._h = hashlib.sha256()

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def matches(self) -> bool:
        return self.kind is not None and self._h.hexdigest() == self.etag


def _hash_existing(path: Path, verifier: _Verifier, cancel: threading.Event | None) -> None:
    with path.open("rb") as f:
        while block := f.read(8 * 1024 * 1024):
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled("download cancelled while re-reading the partial file")
            verifier.update(block)


# ------------------------------------------------------------------------------------------- download


def _check_space(directory: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_MARGIN:
        raise DiskSpaceError(
            f"not enough disk space for {what}: {_gib(needed)} still to download plus a {_gib(DISK_MARGIN)} "
            f"margin, but only {_gib(free)} free in {directory}"
        )


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def _is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))


def _link_into_snapshot(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        # no symlinks (e.g. Windows without developer mode): huggingface_hub moves the blob instead
        shutil.move(str(blob), str(pointer))


def _write_ref(folder: Path, revision: str, commit_hash: str) -> None:
    if revision == commit_hash:
        return
    ref = folder / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit_hash:
        ref.write_text(commit_hash)


def download(
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
    """Download one Hub file into the HF cache and return its snapshot path (what loaders open).

    Already cached -> returned at once. Otherwise: resolves the file (size, sha256, commit) through
    huggingface_hub, checks free space for what is still missing, then appends to
    ``blobs/<sha256>.incomplete`` with Range requests, retrying with backoff on dropped connections and
    stalls, and hashes as it goes. Only a file whose size and hash match the Hub's is moved to
    ``blobs/<sha256>`` and linked from ``snapshots/<commit>/<filename>``; a mismatch deletes the partial.
    `progress(bytes_done, bytes_total, speed_bps, eta_s)` is called at most every 0.1 s (plus once at
    the end); setting `cancel` stops the transfer with `DownloadCancelled` and keeps the partial for a
    later call to resume. Raises a `HubError` subclass with a message for the user.
    """
    _validate(repo_id, filename)
    policy = policy or RetryPolicy()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    rev = revision or constants.DEFAULT_REVISION

    if is_offline():
        hit = cached_path(repo_id, filename, revision=rev, cache_dir=cache)
        if hit is not None:
            return hit
    try:
        info = resolve_file(repo_id, filename, revision=rev, token=token, policy=policy, cancel=cancel)
    except OfflineError:
        hit = cached_path(repo_id, filename, revision=rev, cache_dir=cache)
        if hit is not None:
            log.info("Hub unreachable, using the cached %s/%s", repo_id, filename)
            return hit
        raise

    folder = storage_folder(repo_id, cache)
    blob = folder / "blobs" / info.etag
    pointer = folder / "snapshots" / info.commit_hash / Path(*filename.split("/"))
    if pointer.exists():
        _write_ref(folder, rev, info.commit_hash)
        return pointer

    verifier = _Verifier(info.etag, info.size)
    if verifier.kind is None:
        raise IntegrityError(
            f"the Hub's ETag for {repo_id}/{filename} ({info.etag!r}) is neither a sha256 nor a git hash: "
            "refusing a download that cannot be verified"
        )
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock_path = cache / ".locks" / folder.name / f"{info.etag}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with WeakFileLock(lock_path, timeout=LOCK_TIMEOUT):
            if not blob.exists():
                _fetch_blob(info, blob, verifier, progress=progress, cancel=cancel, policy=policy)
            _write_ref(folder, rev, info.commit_hash)
            _link_into_snapshot(blob, pointer)
    except LockTimeout:
        raise HubError(
            f"{repo_id}/{filename} is already being downloaded by another process or thread"
        ) from None
    return pointer


def _fetch_blob(
    info: RemoteFileInfo,
    blob: Path,
    verifier: _Verifier,
    *,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> None:
    part = blob.with_name(blob.name + ".incomplete")
    name = f"{info.repo_id}/{info.filename}"
    total = info.size
    done = part.stat().st_size if part.exists() else 0
    if done > total:
        log.warning("partial %s is larger than the file (%d > %d): starting over", part, done, total)
        part.unlink()
        done = 0
    _check_space(blob.parent, total - done, name)
    reporter = _Progress(progress, total, time.monotonic)
    if done:
        _hash_existing(part, verifier, cancel)
    reporter.report(done, force=True)

    location, headers = info.location, dict(info.headers)
    session = get_session()
    timeout = httpx2.Timeout(policy.stall_timeout, connect=policy.connect_timeout)
    failures = 0
    refreshed = False
    while done < total:
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled(f"download of {name} cancelled at {done}/{total} bytes (partial kept)")
        request_headers = {**headers, "Range": f"bytes={done}-"}
        progressed = False
        try:
            with session.stream(
                "GET", location, headers=request_headers, timeout=timeout, follow_redirects=True
            ) as r:
                if r.status_code == 416:
                    # our Range starts at/after the end: the partial is complete or inconsistent
                    if done == total:
                        break
                    raise _restart(part, verifier, "server rejected the resume range")
                if r.status_code in (401, 403, 404, 410) and not refreshed:
                    # signed CDN URLs expire: resolve the file again once
                    r.read()
                    fresh = resolve_file(info.repo_id, info.filename, revision=info.revision, policy=policy)
                    if fresh.etag != info.etag:
                        raise IntegrityError(f"{name} changed on the Hub during the download; start again")
                    location, headers, refreshed = fresh.location, dict(fresh.headers), True
                    continue
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                if r.status_code == 200 and done:
                    log.warning("server ignored the Range request for %s: restarting from byte 0", name)
                    part.unlink(missing_ok=True)
                    verifier.reset()
                    done = 0
                elif r.status_code == 206:
                    start = _content_range_start(r.headers.get("Content-Range"))
                    if start != done:
                        raise TransferError(f"server answered range starting at {start}, asked for {done}")
                with part.open("ab") as f:
                    for chunk in r.iter_bytes():
                        if cancel is not None and cancel.is_set():
                            raise DownloadCancelled(
                                f"download of {name} cancelled at {done}/{total} bytes (partial kept)"
                            )
                        if done + len(chunk) > total:
                            raise _restart(part, verifier, "server sent more bytes than the file has")
                        f.write(chunk)
                        verifier.update(chunk)
                        done += len(chunk)
                        progressed = True
                        reporter.received(len(chunk))
                        reporter.report(min(done, total - 1))  # "complete" only once verified
            if done < total:
                raise httpx2.RemoteProtocolError(f"connection closed at {done}/{total} bytes")
        except (httpx2.TransportError, _Restart, HfHubHTTPError) as e:
            if isinstance(e, HfHubHTTPError):
                status = e.response.status_code if e.response is not None else 0
                if status not in (408, 429, 500, 502, 503, 504):
                    err = _explain(e, info.repo_id, info.filename, info.revision, has_token=_has_token(None))
                    raise err from None
            if progressed:
                failures = 0
            failures += 1
            if failures > policy.max_retries:
                raise TransferError(
                    f"download of {name} failed after {policy.max_retries} retries ({_first_line(e)}); "
                    f"{done}/{total} bytes are kept and the next attempt resumes from there"
                ) from None
            wait = policy.delay(failures)
            log.warning("download of %s interrupted at %d/%d (%s); retrying in %.1fs",
                        name, done, total, _first_line(e), wait)  # fmt: skip
            if cancel is not None:
                if cancel.wait(wait):
                    raise DownloadCancelled(
                        f"download of {name} cancelled at {done}/{total} bytes (partial kept)"
                    ) from None
            else:
                time.sleep(wait)
            done = part.stat().st_size if part.exists() else 0
        except OSError as e:
            if _is_disk_full(e):
                raise DiskSpaceError(
                    f"disk full while writing {part}: free some space and retry; the {_gib(done)} already "
                    "downloaded are kept and the download will resume"
                ) from None
            raise

    if not verifier.matches():
        part.unlink(missing_ok=True)
        raise IntegrityError(
            f"{name} is corrupt: its {verifier.kind} does not match the Hub's ({info.etag[:12]}…); "
            "the partial download was deleted, run the download again"
        )
    os.chmod(part, 0o644)
    os.replace(part, blob)
    reporter.report(total, force=True)


class _Restart(Exception):
    """The partial file was discarded; the loop starts again from byte 0."""


def _restart(part: Path, verifier: _Verifier, why: str) -> _Restart:
    log.warning("%s: discarding %s", why, part)
    part.unlink(missing_ok=True)
    verifier.reset()
    return _Restart(why)


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"^\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*$", value or "")
    return int(m.group(1)) if m else None
