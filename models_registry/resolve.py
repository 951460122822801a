"""What the Hub says about one file before any byte is fetched: size, hash, commit and where to GET it.

`resolve_file` HEADs the file's resolve URL through huggingface_hub (`hf_hub_url`,
`get_hf_file_metadata`, `build_hf_headers`), retrying transient failures, and describes the file in a
`RemoteFileInfo` that the download and the remote GGUF reader both start from.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers, httpx

from .catalog import CatalogError, validate_filename, validate_repo_id
from .hub_errors import DownloadCancelled, HubError, NotFoundError, explain_error, first_line
from .hub_settings import LIBRARY_NAME, has_token, hub_endpoint, is_offline
from .retry import RetryPolicy, is_transient

__all__ = ["RemoteFileInfo", "resolve_file", "validate_hub_path"]

log = logging.getLogger(__name__)


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


def validate_hub_path(repo_id: str, filename: str) -> None:
    """Refuse a malformed repository id or file path with `NotFoundError` (before any request)."""
    try:
        validate_repo_id(repo_id)
        validate_filename(filename, allow_subfolder=True)
    except CatalogError as e:
        raise NotFoundError(str(e)) from None


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
    validate_hub_path(repo_id, filename)
    policy = policy or RetryPolicy()
    revision = revision or constants.DEFAULT_REVISION
    token_set = has_token(token)
    if is_offline():
        raise explain_error(OfflineModeIsEnabled(), repo_id, filename, revision, has_token=token_set)
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
        except (httpx.TransportError, HfHubHTTPError) as e:
            failures += 1
            if not is_transient(e) or failures > policy.metadata_retries:
                raise explain_error(e, repo_id, filename, revision, has_token=token_set) from None
            log.info("metadata request for %s/%s failed (%s), retrying", repo_id, filename, first_line(e))
            if cancel is not None and cancel.wait(policy.delay(failures)):
                raise DownloadCancelled(f"download of {repo_id}/{filename} cancelled") from None
            if cancel is None:
                time.sleep(policy.delay(failures))
        except OfflineModeIsEnabled as e:
            raise explain_error(e, repo_id, filename, revision, has_token=token_set) from None
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
    u = httpx.URL(url)
    return (u.scheme, u.host, u.port)
