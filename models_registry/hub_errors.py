"""The errors of Hub access, each with a message meant for the user, and `explain_error`, which turns
huggingface_hub's and the HTTP stack's exceptions into them."""

from __future__ import annotations

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
from huggingface_hub.utils import httpx

from .hub_settings import hub_endpoint

__all__ = [
    "DiskSpaceError",
    "DownloadCancelled",
    "GatedRepoError",
    "HubError",
    "IntegrityError",
    "NotFoundError",
    "OfflineError",
    "TransferError",
    "explain_error",
    "first_line",
]


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


def first_line(e: BaseException) -> str:
    """The first line of `e`'s message, or its class name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def explain_error(
    e: BaseException, repo_id: str, filename: str, revision: str, *, has_token: bool
) -> HubError:
    """Turn a huggingface_hub or HTTP error into a `HubError` with a message for the user."""
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
        return TransferError(f"the Hub answered HTTP {status} for {repo_id}/{filename}: {first_line(e)}")
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.NetworkError)):
        return OfflineError(
            f"cannot reach {endpoint} ({first_line(e)}): check the network connection, proxy and HF_ENDPOINT"
        )
    if isinstance(e, httpx.TimeoutException):
        return OfflineError(f"{endpoint} did not answer in time ({type(e).__name__}): check the network")
    if isinstance(e, httpx.TransportError):
        return TransferError(f"network error talking to {endpoint}: {first_line(e)}")
    return HubError(f"{type(e).__name__}: {first_line(e)}")
