"""The byte-level part of reading GGUF metadata (`app.gguf.meta` builds its records with it): the format's
constants and value types, the errors a file can raise, and a bounded reader over any ``read(n)``
stream that validates each declared length against the bytes that can still exist before allocating."""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: Numeric arrays with at least this many elements are returned as (read-only) numpy arrays, smaller ones
#: as lists.
NUMPY_ARRAY_THRESHOLD = 1024
#: Upper bound on the size of the metadata when neither the stream size nor ``max_bytes`` is known.
SANITY_LIMIT = 1 << 30
#: Bytes requested from the stream beyond what the parser needs at that moment.
DEFAULT_READ_AHEAD = 64 * 1024
_MAX_DIMS = 8


class GGUFValueType:
    """GGUF metadata value type codes."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
    7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}  # fmt: skip
# struct format char and numpy dtype of each fixed-size type
_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
_SCALAR = {t: struct.Struct("<" + c) for t, c in _FMT.items()}
_DTYPE = {t: np.dtype("<" + c) for t, c in _FMT.items()}
# smallest encoded size of one element of each type (used to bound counts before reading)
_MIN_SIZE = {**{t: s.size for t, s in _SCALAR.items()}, 8: 8, 9: 12}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")


# ----------------------------------------------------------------------------------------------- errors


class GGUFError(ValueError):
    """Base class of every error raised while parsing GGUF metadata."""


class GGUFEmptyFileError(GGUFError):
    """The file or stream holds no bytes at all."""


class GGUFNotGGUFError(GGUFError):
    """The data does not start with the GGUF magic."""


class GGUFUnsupportedError(GGUFError):
    """A GGUF file this reader cannot parse (version, byte order)."""


class GGUFCorruptError(GGUFError):
    """Structurally invalid metadata: unknown type codes, absurd lengths or counts, duplicate keys."""


class GGUFTruncatedError(GGUFCorruptError):
    """The data ends before the metadata does."""


class GGUFLimitError(GGUFError):
    """Parsing the metadata would need more than ``max_bytes`` bytes."""


# ----------------------------------------------------------------------------------------------- reader


class _Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


def _stream_remaining(fp: Any) -> int | None:
    """Bytes left in a seekable stream, or None if it cannot tell."""
    try:
        if hasattr(fp, "seekable") and not fp.seekable():
            return None
        pos = fp.tell()
        end = fp.seek(0, os.SEEK_END)
        fp.seek(pos)
        return max(0, end - pos)
    except (AttributeError, OSError, ValueError):
        return None


class _Reader:
    """Buffered little-endian reader with a hard limit on how far it may read."""

    def __init__(self, fp: _Readable, *, max_bytes: int | None, read_ahead: int) -> None:
        self._fp = fp
        self._buf = b""
        self._pos = 0  # parse position inside _buf
        self._base = 0  # stream offset of _buf[0]
        self._eof = False
        self._read_ahead = max(0, read_ahead)
        size = _stream_remaining(fp)
        self.size = size
        # (limit, kind): the parse never goes past `limit`; `kind` decides the error raised when it would.
        candidates = []
        if max_bytes is not None:
            candidates.append((max_bytes, "max_bytes"))
        if size is not None:
            candidates.append((size, "eof"))
        if not candidates:
            candidates.append((SANITY_LIMIT, "sanity"))
        self.limit, self.kind = min(candidates, key=lambda c: (c[0], c[1] != "eof"))
        self.max_bytes = max_bytes

    @property
    def offset(self) -> int:
        return self._base + self._pos

    @property
    def fetched(self) -> int:
        return self._base + len(self._buf)

    # -- limit errors --------------------------------------------------------------------------------------

    def check_size(self, n: int, what: Callable[[], str], declared: str | None = None) -> None:
        """Raise if `n` bytes cannot follow the parse position; `declared` names the length field that
        asked for them (None for a plain read)."""
        left = self.limit - self.offset
        if n <= left:
            return
        where = f"{what()} at offset {self.offset}"
        needs = f"declares {declared} ({n} bytes)" if declared else f"needs {n} bytes"
        if self.kind == "max_bytes":
            raise GGUFLimitError(
                f"metadata exceeds max_bytes={self.max_bytes}: {where} {needs}, but only {left} bytes are "
                "allowed past that point"
            )
        if self.kind == "sanity" or n > SANITY_LIMIT:
            raise GGUFCorruptError(
                f"corrupt GGUF metadata: {where} {needs.replace('declares', 'declares an absurd')}; GGUF "
                f"metadata never exceeds the {SANITY_LIMIT >> 20} MiB sanity limit"
            )
        label = "truncated or corrupt GGUF file" if declared else "truncated GGUF file"
        raise GGUFTruncatedError(
            f"{label}: {where} {needs} but the file ends at offset {self.limit} ({left} bytes left)"
        )

    def peek(self, n: int) -> bytes:
        """Up to `n` bytes at the parse position, without raising if fewer exist."""
        with contextlib.suppress(GGUFTruncatedError, GGUFEmptyFileError):
            self._fill(min(n, max(0, self.limit - self.offset)), lambda: "")
        return self._buf[self._pos : self._pos + n]

    def _fill(self, n: int, what: Callable[[], str]) -> None:
        """Make sure `n` bytes are buffered at the parse position."""
        avail = len(self._buf) - self._pos
        if avail >= n:
            return
        if self.offset + n > self.limit:
            self.check_size(n, what)
        need = n - avail
        want = min(need + self._read_ahead, self.limit - self.fetched)
        want = max(want, need)
        parts = [self._buf[self._pos :]] if avail else []
        got = 0
        while got < need and not self._eof:
            chunk = self._fp.read(want - got)
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            got += len(chunk)
        self._base += self._pos
        self._buf = b"".join(parts)
        self._pos = 0
        if got < need:
            end = self.fetched
            if end == 0:
                raise GGUFEmptyFileError("empty file: no bytes to read")
            raise GGUFTruncatedError(
                f"truncated GGUF file: {what()} at offset {self.offset} needs {n} bytes but the data "
                f"ends at offset {end}"
            )

    # -- primitives ----------------------------------------------------------------------------------------

    def take(self, n: int, what: Callable[[], str]) -> bytes:
        self._fill(n, what)
        p = self._pos
        self._pos = p + n
        return self._buf[p : p + n]

    def unpack(self, st: struct.Struct, what: Callable[[], str]) -> tuple[Any, ...]:
        self._fill(st.size, what)
        v = st.unpack_from(self._buf, self._pos)
        self._pos += st.size
        return v

    def u32(self, what: Callable[[], str]) -> int:
        return self.unpack(_U32, what)[0]

    def u64(self, what: Callable[[], str]) -> int:
        return self.unpack(_U64, what)[0]

    def string(self, what: Callable[[], str]) -> str:
        n = self.u64(what)
        self.check_size(n, what, "string length")
        return self.take(n, what).decode("utf-8", "replace")

    def string_array(self, count: int, what: Callable[[], str]) -> list[str]:
        """`count` strings; the hot path for tokenizer vocabularies (~150k entries)."""
        out: list[str] = []
        append = out.append
        unpack_len = _U64.unpack_from
        while len(out) < count:
            buf, pos = self._buf, self._pos
            end = len(buf)
            last = end - 8  # last position at which a length prefix fits in the buffer
            for _ in range(count - len(out)):
                if pos > last:
                    break
                start = pos + 8
                stop = start + unpack_len(buf, pos)[0]
                if stop > end:
                    break
                raw = buf[start:stop]
                try:
                    append(raw.decode())
                except UnicodeDecodeError:
                    append(raw.decode("utf-8", "replace"))
                pos = stop
            self._pos = pos
            i = len(out)
            if i < count:  # slow path: the next string straddles the buffer end (or is bad)

                def elem(i: int = i) -> str:
                    return f"{what()}, element {i} of {count}"

                append(self.string(elem))
        return out


# ----------------------------------------------------------------------------------------------- parsing


def _read_value(r: _Reader, vtype: int, what: Callable[[], str], depth: int = 0) -> Any:
    st = _SCALAR.get(vtype)
    if st is not None:
        v = r.unpack(st, what)[0]
        return bool(v) if vtype == GGUFValueType.BOOL else v
    if vtype == GGUFValueType.STRING:
        return r.string(what)
    if vtype == GGUFValueType.ARRAY:
        if depth > 16:
            raise GGUFCorruptError(f"corrupt GGUF metadata: {what()} nests arrays more than 16 deep")
        etype = r.u32(what)
        if etype not in _MIN_SIZE:
            raise GGUFCorruptError(
                f"corrupt GGUF metadata: {what()} at offset {r.offset - 4} has unknown array element type "
                f"{etype}"
            )
        count = r.u64(what)
        r.check_size(count * _MIN_SIZE[etype], what, f"array of {count} {_TYPE_NAMES[etype]} elements")
        if etype == GGUFValueType.STRING:
            return r.string_array(count, what)
        if etype == GGUFValueType.ARRAY:
            return [
                _read_value(r, etype, lambda i=i: f"{what()}, element {i} of {count}", depth + 1)
                for i in range(count)
            ]
        raw = r.take(count * _MIN_SIZE[etype], what)
        if count >= NUMPY_ARRAY_THRESHOLD:
            arr = np.frombuffer(raw, dtype=_DTYPE[etype])
            return arr.astype(bool) if etype == GGUFValueType.BOOL else arr
        vals = list(struct.unpack(f"<{count}{_FMT[etype]}", raw))
        return [bool(v) for v in vals] if etype == GGUFValueType.BOOL else vals
    raise GGUFCorruptError(
        f"corrupt GGUF metadata: {what()} at offset {r.offset - 4} has unknown value type {vtype}"
    )


def _describe_magic(head: bytes) -> str:
    text = head.lstrip()
    hint = ""
    if text.startswith(b"version https://git-lfs"):
        hint = " (this is a Git LFS pointer file, not the model itself)"
    elif text[:1] == b"<":
        hint = " (looks like an HTML/XML page: a failed download?)"
    elif text[:1] in (b"{", b"["):
        hint = " (looks like JSON)"
    elif head.startswith(b"FUGG"):
        hint = " (byte-swapped magic)"
    return f"{head[:4]!r} (hex {head[:4].hex(' ')}; starts {head[:16]!r}){hint}"
