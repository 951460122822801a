"""Checking downloaded bytes against the Hub's ETag: sha256 for LFS files, git blob sha1 for the rest."""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

from .hub_errors import DownloadCancelled

__all__ = ["Verifier", "hash_existing"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")


class Verifier:
    """Incremental hash of the file as it grows: sha256 (LFS etag) or git blob sha1 (non-LFS etag).

    ``kind`` is None when the etag is neither, so the file cannot be verified.
    """

    def __init__(self, etag: str, size: int) -> None:
        self.etag = etag
        self.size = size
        self.kind = "sha256" if _SHA256.match(etag) else "git-sha1" if _GIT_SHA1.match(etag) else None
        self.reset()

    def reset(self) -> None:
        """Start over from byte 0."""
        if self.kind == "git-sha1":
            self._h: Any = hashlib.sha1(usedforsecurity=False)
            self._h.update(b"blob %d\0" % self.size)
        else:
            self._h = hashlib.sha256()

    def update(self, data: bytes) -> None:
        """Hash the next bytes of the file."""
        self._h.update(data)

    def matches(self) -> bool:
        """Whether the bytes hashed so far are the file the etag names."""
        return self.kind is not None and self._h.hexdigest() == self.etag


def hash_existing(path: Path, verifier: Verifier, cancel: threading.Event | None) -> None:
    """Feed the bytes already in `path` (a partial download being resumed) to `verifier`."""
    with path.open("rb") as f:
        while block := f.read(8 * 1024 * 1024):
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled("download cancelled while re-reading the partial file")
            verifier.update(block)
