"""Streaming reader for the header and key/value metadata of GGUF files.

Reads from any binary file-like object exposing ``read(n)`` (a local file, or a wrapper around HTTP
Range requests), consumes only the header, and never touches tensor data. GGUF v2 and v3,
little-endian only (big-endian files are detected and rejected with a clear message).

Layout parsed here (all integers little-endian)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x  (string key, u32 value_type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)   # optional
    padding to general.alignment, then tensor data                                       # never read

where ``string`` is ``u64 length + UTF-8 bytes`` and an array value is
``u32 element_type, u64 count, elements`` (arrays may nest).

Declared lengths and counts are validated against the bytes that can still exist (the file size when the
stream is seekable, ``max_bytes``, or a 1 GiB sanity cap on metadata) *before* anything is allocated.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, BinaryIO, Protocol

import numpy as np

__all__ = [
    "GGUFCorruptError",
    "GGUFEmptyFileError",
    "GGUFError",
    "GGUFLimitError",
    "GGUFMetadata",
    "GGUFNotGGUFError",
    "GGUFTruncatedError",
    "GGUFUnsupportedError",
    "GGUFValueType",
    "TensorInfo",
    "read_metadata",
    "read_metadata_file",
]

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


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TensorInfo:
    """One tensor descriptor. ``shape`` is in ggml order (``ne[0]``, the contiguous dimension, first);
    ``offset`` is relative to the start of the tensor data section."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int

    @property
    def type_name(self) -> str:
        """ggml type name, e.g. ``Q4_K``, or ``type<N>`` if unknown to the installed ``gguf``."""
        try:
            from gguf.constants import GGMLQuantizationType

            return GGMLQuantizationType(self.type).name
        except (ImportError, ValueError):
            return f"type{self.type}"

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int | None:
        """Size of the tensor data, or None for a type unknown to the installed ``gguf``."""
        try:
            from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        except (ImportError, ValueError, KeyError):
            return None
        return self.n_elements // block * type_size


@dataclass(frozen=True, eq=False)
class GGUFMetadata:
    """Parsed GGUF header.

    ``kv`` maps keys to values: ints/floats/bools/str for scalars (strings decoded as UTF-8 with
    ``errors="replace"``), lists for arrays, except numeric arrays of at least ``NUMPY_ARRAY_THRESHOLD``
    elements, which are read-only numpy arrays. ``bytes_read`` is the number of bytes the parser consumed
    (the header length up to where it stopped); the underlying stream may have been read up to
    ``DEFAULT_READ_AHEAD`` bytes further, never past ``max_bytes``. ``tensors`` and ``data_offset`` (start of
    the aligned tensor data section) are only set when tensor infos were requested.
    """

    version: int
    n_tensors: int
    kv: Mapping[str, Any]
    bytes_read: int
    tensors: tuple[TensorInfo, ...] | None = None
    data_offset: int | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def _arch_key(self, suffix: str) -> Any:
        arch = self.architecture
        return None if arch is None else self.kv.get(f"{arch}.{suffix}")

    @property
    def architecture(self) -> str | None:
        return _as_str(self.kv.get("general.architecture"))

    @property
    def name(self) -> str | None:
        return _as_str(self.kv.get("general.name"))

    @property
    def alignment(self) -> int:
        a = _as_int(self.kv.get("general.alignment"))
        return a if a else DEFAULT_ALIGNMENT

    @property
    def context_length(self) -> int | None:
        return _as_int(self._arch_key("context_length"))

    @property
    def block_count(self) -> int | None:
        return _as_int(self._arch_key("block_count"))

    @property
    def embedding_length(self) -> int | None:
        return _as_int(self._arch_key("embedding_length"))

    @property
    def head_count(self) -> int | None:
        """Attention heads; for per-layer arrays, the maximum over layers."""
        return _as_int(self._arch_key("attention.head_count"))

    @property
    def head_count_kv(self) -> int | None:
        """KV heads (GQA), defaulting to ``head_count`` like llama.cpp; per-layer arrays give the maximum."""
        n = _as_int(self._arch_key("attention.head_count_kv"))
        return n if n is not None else self.head_count

    def _head_size(self, key: str) -> int | None:
        n = _as_int(self._arch_key(key))
        if n is not None:
            return n
        emb, heads = self.embedding_length, self.head_count
        return emb // heads if emb and heads else None

    @property
    def key_length(self) -> int | None:
        """Size of one K head, falling back to ``embedding_length // head_count``."""
        return self._head_size("attention.key_length")

    @property
    def value_length(self) -> int | None:
        """Size of one V head, falling back to ``embedding_length // head_count``."""
        return self._head_size("attention.value_length")

    @property
    def tokens(self) -> list[str] | None:
        toks = self.kv.get("tokenizer.ggml.tokens")
        return toks if isinstance(toks, list) else None

    @property
    def vocab_size(self) -> int | None:
        """Number of tokenizer tokens (what llama.cpp calls ``n_vocab``), else ``<arch>.vocab_size``."""
        toks = self.kv.get("tokenizer.ggml.tokens")
        if toks is not None and hasattr(toks, "__len__"):
            return len(toks)
        return _as_int(self._arch_key("vocab_size"))

    @property
    def tokenizer_model(self) -> str | None:
        return _as_str(self.kv.get("tokenizer.ggml.model"))

    @property
    def tokenizer_pre(self) -> str | None:
        return _as_str(self.kv.get("tokenizer.ggml.pre"))

    @property
    def file_type(self) -> int | None:
        """``general.file_type`` (llama_ftype, e.g. 15 = MOSTLY_Q4_K_M)."""
        return _as_int(self.kv.get("general.file_type"))

    @property
    def chat_template(self) -> str | None:
        return _as_str(self.kv.get("tokenizer.chat_template"))


def _as_int(v: Any) -> int | None:
    if v is None or isinstance(v, str):
        return None
    if isinstance(v, (list, tuple, np.ndarray)):
        return int(max(v)) if len(v) else None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


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


def read_metadata(
    fp: BinaryIO | _Readable,
    *,
    tensor_infos: bool = False,
    max_bytes: int | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
) -> GGUFMetadata:
    """Parse the GGUF header and key/value metadata from the current position of `fp`.

    Reads only what the header needs (plus at most `read_ahead` bytes of read-ahead, never past
    `max_bytes`); stops after the key/value section unless `tensor_infos` is true. Offsets in error
    messages are relative to the starting position. Raises a `GGUFError` subclass on bad input.
    """
    r = _Reader(fp, max_bytes=max_bytes, read_ahead=read_ahead)

    def header() -> str:
        return "the GGUF header"

    # the magic on its own first, so a short non-GGUF file reports "not GGUF" rather than "truncated"
    head = r.peek(32)
    if not head:
        if max_bytes is not None and max_bytes < 4:
            raise GGUFLimitError(f"max_bytes={max_bytes} is too small to read the GGUF header")
        raise GGUFEmptyFileError("empty file: no bytes to read (expected a GGUF header)")
    if head[:4] != GGUF_MAGIC[: len(head[:4])]:
        short = f"only {len(head)} bytes, " if len(head) < 4 else ""
        raise GGUFNotGGUFError(f"not a GGUF file: {short}expected magic b'GGUF', got {_describe_magic(head)}")
    _, version, n_tensors, n_kv = r.unpack(_HEADER, header)
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (1, 2, 3):
            raise GGUFUnsupportedError(
                f"big-endian GGUF file (version {swapped} stored big-endian): only little-endian GGUF is "
                "supported"
            )
        if version == 1:
            raise GGUFUnsupportedError(
                "GGUF version 1 (32-bit lengths, 2023) is not supported: only versions 2 and 3; "
                "re-convert the model with a current llama.cpp"
            )
        raise GGUFUnsupportedError(
            f"unsupported GGUF version {version}: only versions {SUPPORTED_VERSIONS[0]} and "
            f"{SUPPORTED_VERSIONS[-1]} are supported"
        )
    # the smallest key/value is 8 (key length) + 4 (type) + 1 (u8) bytes; the smallest tensor info 24
    r.check_size(n_kv * 13, lambda: "the header", f"key/value count {n_kv}")
    if n_tensors > (1 << 40):
        raise GGUFCorruptError(f"corrupt GGUF header: absurd tensor count {n_tensors}")

    kv: dict[str, Any] = {}
    for idx in range(n_kv):

        def kname(idx: int = idx) -> str:
            return f"the name of key #{idx} (of {n_kv})"

        key = r.string(kname)

        def kval(key: str = key) -> str:
            return f"the value of key {key!r}"

        vtype = r.u32(kval)
        if key in kv:
            raise GGUFCorruptError(f"corrupt GGUF metadata: duplicate key {key!r} (key #{idx})")
        kv[key] = _read_value(r, vtype, kval)

    tensors: tuple[TensorInfo, ...] | None = None
    data_offset: int | None = None
    if tensor_infos:
        r.check_size(n_tensors * 24, lambda: "the tensor info section", f"tensor count {n_tensors}")
        infos = []
        for idx in range(n_tensors):

            def tname(idx: int = idx) -> str:
                return f"the name of tensor info #{idx} (of {n_tensors})"

            name = r.string(tname)

            def tinfo(name: str = name) -> str:
                return f"the tensor info of {name!r}"

            n_dims = r.u32(tinfo)
            if n_dims > _MAX_DIMS:
                raise GGUFCorruptError(f"corrupt GGUF tensor info: tensor {name!r} has {n_dims} dimensions")
            shape = r.unpack(struct.Struct(f"<{n_dims}Q"), tinfo) if n_dims else ()
            ggml_type, offset = r.unpack(struct.Struct("<IQ"), tinfo)
            infos.append(TensorInfo(name, tuple(shape), ggml_type, offset))
        tensors = tuple(infos)
        align = _as_int(kv.get("general.alignment")) or DEFAULT_ALIGNMENT
        data_offset = -(-r.offset // align) * align

    return GGUFMetadata(
        version=version,
        n_tensors=n_tensors,
        kv=MappingProxyType(kv),
        bytes_read=r.offset,
        tensors=tensors,
        data_offset=data_offset,
    )


def read_metadata_file(path: str | os.PathLike[str], **kw: Any) -> GGUFMetadata:
    """`read_metadata` on a local file; FileNotFoundError names the path."""
    p = os.fspath(path)
    try:
        f = open(p, "rb", buffering=0)  # noqa: SIM115 - closed below; our reader does its own buffering
    except FileNotFoundError as e:
        raise FileNotFoundError(e.errno, "GGUF file not found", p) from None
    with f:
        try:
            return read_metadata(f, **kw)
        except GGUFError as e:
            raise type(e)(f"{p}: {e}") from None
