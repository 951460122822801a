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

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, BinaryIO

import numpy as np

from app.gguf.reader import (
    _HEADER,
    _MAX_DIMS,
    DEFAULT_ALIGNMENT,
    DEFAULT_READ_AHEAD,
    GGUF_MAGIC,
    NUMPY_ARRAY_THRESHOLD,
    SANITY_LIMIT,
    SUPPORTED_VERSIONS,
    GGUFCorruptError,
    GGUFEmptyFileError,
    GGUFError,
    GGUFLimitError,
    GGUFNotGGUFError,
    GGUFTruncatedError,
    GGUFUnsupportedError,
    GGUFValueType,
    _describe_magic,
    _read_value,
    _Readable,
    _Reader,
)

__all__ = [
    "DEFAULT_READ_AHEAD",
    "NUMPY_ARRAY_THRESHOLD",
    "SANITY_LIMIT",
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
