"""Read a remote GGUF's header over HTTP Range requests and check pairs before downloading anything big.

`RangeReader` is a file-like object (``read``/``tell``/``seek``) over one Hub file that fetches
1-8 MiB ranges on demand; `app.gguf.meta.read_metadata` parses it as it would a local file and
stops after the key/value section, so only the first megabytes (the tokenizer is most of them) travel.
A split GGUF is read from its first part (which holds the metadata), whichever part is named.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import get_session, hf_raise_for_status, httpx

from app.gguf.compat import Compatibility, check_compatible
from app.gguf.meta import GGUFMetadata, read_metadata, read_metadata_file
from app.gguf.split import first_part, model_bytes

from .catalog import CatalogError, validate_filename, validate_repo_id
from .hub_errors import TransferError, explain_error
from .hub_settings import has_token
from .parts import first_part_path, part_paths
from .resolve import RemoteFileInfo, resolve_file
from .retry import RetryPolicy, is_transient

__all__ = [
    "DEFAULT_MAX_METADATA_BYTES",
    "HfRef",
    "ModelFacts",
    "RangeReader",
    "check_pair",
    "model_facts",
    "parse_hf_ref",
    "read_ref_metadata",
    "read_remote_metadata",
]

#: Never read more than this much of a remote file to get its metadata (Gemma 3's 262k-token vocabulary
#: with scores and types is ~6 MiB; 64 MiB leaves ample room while still bounding the transfer).
DEFAULT_MAX_METADATA_BYTES = 64 * 1024 * 1024
FIRST_CHUNK = 1024 * 1024
MAX_CHUNK = 8 * 1024 * 1024
#: HTTP statuses a range read retries (unlike a download, not 408).
_RANGE_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

_HF_REF = re.compile(r"^hf://(?P<owner>[^/@]+)/(?P<name>[^/@]+)/(?P<path>[^@]+?)(?:@(?P<rev>[^@]+))?$")


@dataclass(frozen=True)
class HfRef:
    """A file on the Hub: ``hf://owner/name/path/to/file.gguf[@revision]``."""

    repo_id: str
    filename: str
    revision: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo_id}/{self.filename}{rev}"


def parse_hf_ref(ref: str) -> HfRef:
    """Parse ``hf://owner/name/file.gguf`` (optionally ``@revision``); raises `ValueError` with the reason."""
    m = _HF_REF.match(ref.strip())
    if not m:
        raise ValueError(f"{ref!r} is not a Hub reference of the form hf://owner/name/file.gguf[@revision]")
    repo_id = f"{m['owner']}/{m['name']}"
    try:
        validate_repo_id(repo_id)
        validate_filename(m["path"], allow_subfolder=True)
    except CatalogError as e:
        raise ValueError(f"{ref!r}: {e}") from None
    rev = m["rev"]
    if rev is not None and (not rev.strip() or any(c in rev for c in " \t\\") or ".." in rev):
        raise ValueError(f"{ref!r}: invalid revision {rev!r}")
    return HfRef(repo_id, m["path"], rev)


class RangeReader(io.RawIOBase):
    """Read-only, seekable view of a remote file that fetches ranges lazily (chunks grow 1 -> 8 MiB).

    ``bytes_fetched`` counts body bytes received; reads past ``max_bytes`` raise `TransferError`.
    """

    def __init__(
        self,
        info: RemoteFileInfo,
        *,
        max_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__()
        self.info = info
        self.size = info.size
        self.max_bytes = max_bytes
        self.bytes_fetched = 0
        self.requests = 0
        self._policy = policy or RetryPolicy()
        self._pos = 0
        self._buf = b""
        self._buf_start = 0
        self._next_chunk = FIRST_CHUNK

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1, /) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        n = max(0, min(n, self.size - self._pos))
        out = bytearray()
        while len(out) < n:
            if not (self._buf_start <= self._pos < self._buf_start + len(self._buf)):
                self._fetch(self._pos, max(self._next_chunk, n - len(out)))
            off = self._pos - self._buf_start
            piece = self._buf[off : off + n - len(out)]
            out += piece
            self._pos += len(piece)
        return bytes(out)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def _fetch(self, start: int, length: int) -> None:
        end = min(self.size, start + length) - 1
        if end + 1 > self.max_bytes:
            raise TransferError(
                f"{self.info.repo_id}/{self.info.filename}: the metadata runs past {self.max_bytes} bytes; "
                "refusing to read more of the remote file"
            )
        headers = {**self.info.headers, "Range": f"bytes={start}-{end}"}
        failures = 0
        while True:
            try:
                r = get_session().get(
                    self.info.location, headers=headers, follow_redirects=True, timeout=self._policy.timeout()
                )
                self.requests += 1
                hf_raise_for_status(r)
                data = r.content
                break
            except (httpx.TransportError, HfHubHTTPError) as e:
                failures += 1
                if not is_transient(e, _RANGE_RETRY_STATUSES) or failures > self._policy.metadata_retries:
                    i = self.info
                    raise explain_error(
                        e, i.repo_id, i.filename, i.revision, has_token=has_token(None)
                    ) from None
        self.bytes_fetched += len(data)
        if r.status_code == 200:
            # the server ignored Range: keep only what we asked for (and count the waste above)
            data = data[start : end + 1]
        elif len(data) != end - start + 1:
            raise TransferError(
                f"short range read: asked {end - start + 1} bytes at {start}, got {len(data)}"
            )
        self._buf, self._buf_start = data, start
        self._next_chunk = min(MAX_CHUNK, self._next_chunk * 2)


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF header says about the model (for display and memory estimates)."""

    architecture: str | None
    name: str | None
    n_layers: int | None
    context_length: int | None
    n_embd: int | None
    n_heads: int | None
    n_kv_heads: int | None
    head_dim: int | None  # key length (falls back to n_embd / n_heads)
    value_dim: int | None
    vocab_size: int | None
    file_type: int | None
    file_size: int | None = None
    bytes_read: int | None = None  # how much of a remote file was fetched


def model_facts(
    meta: GGUFMetadata, *, file_size: int | None = None, bytes_read: int | None = None
) -> ModelFacts:
    """Summarise `meta` into `ModelFacts`."""
    return ModelFacts(
        architecture=meta.architecture, name=meta.name, n_layers=meta.block_count,
        context_length=meta.context_length, n_embd=meta.embedding_length, n_heads=meta.head_count,
        n_kv_heads=meta.head_count_kv, head_dim=meta.key_length, value_dim=meta.value_length,
        vocab_size=meta.vocab_size, file_type=meta.file_type, file_size=file_size, bytes_read=bytes_read,
    )  # fmt: skip


def read_remote_metadata(
    ref: HfRef | str,
    *,
    token: str | bool | None = None,
    max_bytes: int = DEFAULT_MAX_METADATA_BYTES,
    policy: RetryPolicy | None = None,
) -> tuple[GGUFMetadata, RangeReader]:
    """Parse the GGUF metadata of a Hub file with Range requests; returns it and the reader (for stats).

    For a split model (any of its parts named) the header is read from the first part.
    """
    if isinstance(ref, str):
        ref = parse_hf_ref(ref)
    first = first_part_path(ref.filename)
    info = resolve_file(ref.repo_id, first, revision=ref.revision, token=token, policy=policy)
    reader = RangeReader(info, max_bytes=max_bytes, policy=policy)
    meta = read_metadata(reader, max_bytes=max_bytes)
    return meta, reader


def read_ref_metadata(
    ref: str | os.PathLike[str] | HfRef, **kwargs: object
) -> tuple[GGUFMetadata, ModelFacts]:
    """Metadata and facts of a local GGUF path or an ``hf://`` reference (read remotely, header only).

    A split model is read from its first part; its `file_size` counts every part (for a remote one, from
    what the Hub says of the other parts, without fetching them).
    """
    if isinstance(ref, HfRef) or (isinstance(ref, str) and ref.startswith("hf://")):
        h = parse_hf_ref(ref) if isinstance(ref, str) else ref
        meta, reader = read_remote_metadata(h, **kwargs)  # type: ignore[arg-type]
        size = reader.size
        for other in part_paths(h.filename)[1:]:
            size += resolve_file(h.repo_id, other, revision=h.revision, **_resolve_kwargs(kwargs)).size
        return meta, model_facts(meta, file_size=size, bytes_read=reader.bytes_fetched)
    path = Path(ref)
    meta = read_metadata_file(first_part(path))
    return meta, model_facts(meta, file_size=model_bytes(path))


def _resolve_kwargs(kwargs: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in kwargs.items() if k in ("token", "policy")}


def check_pair(
    target: str | os.PathLike[str] | HfRef, draft: str | os.PathLike[str] | HfRef, **kwargs: object
) -> Compatibility:
    """`check_compatible` on two models, each a local path or an ``hf://`` reference (nothing big fetched).

    Raises `HubError` (remote trouble), `ValueError` (bad reference) or a `GGUFError` (bad file).
    """
    t, _ = read_ref_metadata(target, **kwargs)
    d, _ = read_ref_metadata(draft, **kwargs)
    return check_compatible(t, d)
