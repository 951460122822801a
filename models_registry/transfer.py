"""The download of one Hub file into the Hugging Face cache: resumable, cancellable and verified.

huggingface_hub resolves the file (`resolve.resolve_file`) and classifies errors; the byte transfer is
done here because `hf_hub_download` can neither be cancelled, nor resume across processes (it writes
to a process-unique temp file that it deletes on failure), nor verify a hash before the file is
published. Bytes go to ``blobs/<sha256>.incomplete`` (see `hf_cache`) and only a verified file is
published.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

from filelock import Timeout as LockTimeout
from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import WeakFileLock, get_session, hf_raise_for_status, httpx

from .hf_cache import (
    blob_path,
    cached_path,
    hub_cache_dir,
    link_into_snapshot,
    lock_path,
    snapshot_path,
    storage_folder,
    write_ref,
)
from .hub_errors import (
    DiskSpaceError,
    DownloadCancelled,
    HubError,
    IntegrityError,
    OfflineError,
    TransferError,
    explain_error,
    first_line,
)
from .hub_settings import has_token, is_offline
from .progress import ProgressCallback, ProgressReporter
from .resolve import RemoteFileInfo, resolve_file, validate_hub_path
from .retry import RetryPolicy, is_transient
from .verify import Verifier, hash_existing

__all__ = ["CHUNK_SIZE", "DISK_MARGIN", "LOCK_TIMEOUT", "download"]

log = logging.getLogger(__name__)

#: Free space kept on top of what the download still needs.
DISK_MARGIN = 256 * 1024 * 1024
#: Bytes asked from the HTTP stream per iteration.
CHUNK_SIZE = 1024 * 1024
#: How long to wait for another download of the same blob to release the cache lock.
LOCK_TIMEOUT = 2.0


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
    validate_hub_path(repo_id, filename)
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
    blob = blob_path(repo_id, info.etag, cache)
    pointer = snapshot_path(repo_id, info.commit_hash, filename, cache)
    if pointer.exists():
        write_ref(folder, rev, info.commit_hash)
        return pointer

    verifier = Verifier(info.etag, info.size)
    if verifier.kind is None:
        raise IntegrityError(
            f"the Hub's ETag for {repo_id}/{filename} ({info.etag!r}) is neither a sha256 nor a git hash: "
            "refusing a download that cannot be verified"
        )
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path(repo_id, info.etag, cache)
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with WeakFileLock(lock, timeout=LOCK_TIMEOUT):
            if not blob.exists():
                _fetch_blob(info, blob, verifier, progress=progress, cancel=cancel, policy=policy)
            write_ref(folder, rev, info.commit_hash)
            link_into_snapshot(blob, pointer)
    except LockTimeout:
        raise HubError(
            f"{repo_id}/{filename} is already being downloaded by another process or thread"
        ) from None
    return pointer


def _fetch_blob(
    info: RemoteFileInfo,
    blob: Path,
    verifier: Verifier,
    *,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> None:
    """Append to ``<blob>.incomplete`` until it is whole, verify it, then move it to `blob`."""
    part = blob.with_name(blob.name + ".incomplete")
    name = f"{info.repo_id}/{info.filename}"
    total = info.size
    done = part.stat().st_size if part.exists() else 0
    if done > total:
        log.warning("partial %s is larger than the file (%d > %d): starting over", part, done, total)
        part.unlink()
        done = 0
    _check_space(blob.parent, total - done, name)
    reporter = ProgressReporter(progress, total, time.monotonic)
    if done:
        hash_existing(part, verifier, cancel)
    reporter.report(done, force=True)

    location, headers = info.location, dict(info.headers)
    session = get_session()
    timeout = policy.timeout()
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
                raise httpx.RemoteProtocolError(f"connection closed at {done}/{total} bytes")
        except (httpx.TransportError, _Restart, HfHubHTTPError) as e:
            if isinstance(e, HfHubHTTPError) and not is_transient(e):
                raise explain_error(
                    e, info.repo_id, info.filename, info.revision, has_token=has_token(None)
                ) from None
            if progressed:
                failures = 0
            failures += 1
            if failures > policy.max_retries:
                raise TransferError(
                    f"download of {name} failed after {policy.max_retries} retries ({first_line(e)}); "
                    f"{done}/{total} bytes are kept and the next attempt resumes from there"
                ) from None
            wait = policy.delay(failures)
            log.warning("download of %s interrupted at %d/%d (%s); retrying in %.1fs",
                        name, done, total, first_line(e), wait)  # fmt: skip
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


class _Restart(Exception):
    """The partial file was discarded; the loop starts again from byte 0."""


def _restart(part: Path, verifier: Verifier, why: str) -> _Restart:
    log.warning("%s: discarding %s", why, part)
    part.unlink(missing_ok=True)
    verifier.reset()
    return _Restart(why)


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"^\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*$", value or "")
    return int(m.group(1)) if m else None
