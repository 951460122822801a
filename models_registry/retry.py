"""How hard the Hub client tries before giving up: backoff, timeouts, and which failures are transient."""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import httpx

__all__ = ["TRANSIENT_STATUSES", "RetryPolicy", "is_transient"]

#: HTTP statuses worth retrying: timeouts, rate limits and server errors.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


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

    def timeout(self) -> httpx.Timeout:
        """The streaming timeout: `stall_timeout` between bytes, `connect_timeout` to connect."""
        return httpx.Timeout(self.stall_timeout, connect=self.connect_timeout)


def is_transient(e: BaseException, statuses: frozenset[int] = TRANSIENT_STATUSES) -> bool:
    """Whether `e` is worth retrying: a transport error, or an HTTP error with one of `statuses`."""
    if isinstance(e, httpx.TransportError):
        return True
    return isinstance(e, HfHubHTTPError) and e.response is not None and e.response.status_code in statuses
