"""The history file: one per tokenizer family, written atomically, checked on load.

File layout (little-endian)::

    header   magic "TANDHIST", version u32, K u32, fingerprint bytes u32, documents u32,
             store tokens u64, table bytes u64, generation u64, forgotten at f64,
             tombstones u32, tombstone bytes u32
    fingerprint (utf-8)
    tokens   int32 x store tokens: the compacted store, separators and the sentinel included
    table    per document: id bytes u16, last written f64, runs u32, ranges u32, the id (utf-8),
             then (start, end) u32 pairs: its runs, then the ranges of its latest version
    removed  per tombstone: id bytes u16, removed at f64, the id (utf-8)
    crc32    u32 of everything before it

Version 1 files (a 40-byte header without the generation, the forget time and the tombstones) are read
too. The sorted index is not stored: loading rebuilds it vectorized (``HistoryIndex._rebuild``).
"""

from __future__ import annotations

import math
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.history.index import HistoryIndex
from app.engine.history.layout import (
    DOC_RECORD_BYTES,
    HEADER_BYTES,
    RANGE_BYTES,
    SEP,
    TOMBSTONE_BYTES,
    Doc,
    Shared,
    file_limit,
)
from app.engine.history.safety import RefusedFile, read_regular, write_atomically

MAGIC = b"TANDHIST"
VERSION = 2
_HEADER = struct.Struct("<8sIIIIQQQdII")
_HEADER_V1 = struct.Struct("<8sIIIIQQ")
_DOC = struct.Struct("<HdII")
_TOMB = struct.Struct("<Hd")
assert _HEADER.size == HEADER_BYTES and _DOC.size == DOC_RECORD_BYTES and RANGE_BYTES == 8
assert _TOMB.size == TOMBSTONE_BYTES
_FINGERPRINT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class HistoryFileError(Exception):
    """A history file that cannot be read: not one, another version or vocabulary, truncated, corrupt,
    token ids outside the vocabulary, or not a regular file of a sane size (:class:`RefusedFile`)."""


@dataclass
class Contents:
    """A history file's contents: the store's tokens, its documents (least recently written first), and
    what the processes sharing it need to know."""

    k: int
    fingerprint: str
    tokens: np.ndarray
    docs: dict[str, Doc]
    shared: Shared


def file_name(fingerprint: str) -> str:
    """The file of one tokenizer family: ``history-<fingerprint>.bin``."""
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(f"a vocabulary fingerprint is 1-64 letters, digits, '.', '_', '-': {fingerprint!r}")
    return f"history-{fingerprint}.bin"


def save(index: HistoryIndex, path: str | os.PathLike, shared: Shared | None = None) -> int:
    """Write ``index`` to ``path`` atomically (a temporary file in the same folder, fsync, rename),
    without its removed and transient documents. Returns the bytes written."""
    tokens, docs = index.snapshot()
    return write(Path(path), index.k, index.fingerprint, tokens, docs, shared or Shared())


def write(
    path: Path, k: int, fingerprint: str, tokens: np.ndarray, docs: list[tuple[str, Doc]], shared: Shared
) -> int:
    """Write a store (``tokens`` with ``docs``' ranges in it) and ``shared`` to ``path`` atomically."""
    raw = tokens.astype("<i4", copy=False).tobytes()
    table = b"".join(_doc_record(doc_id, doc) for doc_id, doc in docs)
    tombs = b"".join(_TOMB.pack(len(i := d.encode()), t) + i for d, t in shared.tombstones.items())
    fp = fingerprint.encode()
    head = _HEADER.pack(
        MAGIC, VERSION, k, len(fp), len(docs), len(tokens), len(table),
        shared.generation, shared.forgotten_at, len(shared.tombstones), len(tombs),
    )  # fmt: skip
    crc = zlib.crc32(tombs, zlib.crc32(table, zlib.crc32(raw, zlib.crc32(fp, zlib.crc32(head)))))
    return write_atomically(path, (head, fp, raw, table, tombs, struct.pack("<I", crc)))


def _doc_record(doc_id: str, doc: Doc) -> bytes:
    ident = doc_id.encode()
    ranges = np.array(doc.runs + doc.text, "<u4").tobytes()
    return _DOC.pack(len(ident), doc.used, len(doc.runs), len(doc.text)) + ident + ranges


def read_generation(path: Path) -> int | None:
    """The generation in ``path``'s header (None if it is missing, refused or not a version 2 file)."""
    try:
        data = read_regular(path, file_limit(8 << 30), head=_HEADER.size)
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, version, *_, generation, _f, _n, _b = _HEADER.unpack(data)
    return generation if magic == MAGIC and version == VERSION else None


def read(
    path: str | os.PathLike,
    *,
    fingerprint: str | None = None,
    k: int | None = None,
    n_vocab: int | None = None,
    max_bytes: int = 64 << 20,
) -> Contents:
    """Read a history file. Raises :class:`HistoryFileError` if it is not a valid one (or was written for
    another ``fingerprint`` or ``k``, or holds token ids outside ``n_vocab``), or is not a regular file of
    at most :func:`~app.engine.history.layout.file_limit` bytes; ``OSError`` if it cannot be read."""
    try:
        raw = read_regular(Path(path), file_limit(max_bytes))
    except RefusedFile as e:
        raise HistoryFileError(str(e)) from None
    return decode(memoryview(raw), path, fingerprint=fingerprint, k=k, n_vocab=n_vocab)


def decode(
    data: memoryview, path: object, *, fingerprint: str | None, k: int | None, n_vocab: int | None
) -> Contents:
    if len(data) < _HEADER_V1.size + 4:
        raise HistoryFileError(f"{path}: too short for a history file ({len(data)} bytes)")
    magic, version, file_k, n_fp, n_docs, n_tokens, n_table = _HEADER_V1.unpack_from(data)
    if magic != MAGIC:
        raise HistoryFileError(f"{path}: not a history file")
    if version not in (1, VERSION):
        raise HistoryFileError(f"{path}: history file version {version}, this build reads {VERSION}")
    shared, n_tomb, tomb_bytes, at = Shared(), 0, 0, _HEADER_V1.size
    if version == VERSION:
        if len(data) < _HEADER.size + 4:
            raise HistoryFileError(f"{path}: too short for a history file ({len(data)} bytes)")
        *_, shared.generation, shared.forgotten_at, n_tomb, tomb_bytes = _HEADER.unpack_from(data)
        if not math.isfinite(shared.forgotten_at):
            raise HistoryFileError(f"{path}: the time of the last forget is not a number")
        at = _HEADER.size
    expected = at + n_fp + 4 * n_tokens + n_table + tomb_bytes + 4
    if len(data) != expected:
        raise HistoryFileError(f"{path}: {len(data)} bytes where the header says {expected} (truncated?)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise HistoryFileError(f"{path}: checksum mismatch (the file is corrupt)")
    try:
        file_fp = bytes(data[at : at + n_fp]).decode()
    except UnicodeDecodeError as e:
        raise HistoryFileError(f"{path}: the vocabulary fingerprint is not text") from e
    if fingerprint is not None and file_fp != fingerprint:
        raise HistoryFileError(f"{path}: written for vocabulary {file_fp!r}, not {fingerprint!r}")
    if k is not None and file_k != k:
        raise HistoryFileError(f"{path}: indexed by {file_k}-grams, not {k}-grams")
    if not 1 <= file_k <= 16:
        raise HistoryFileError(f"{path}: indexed by {file_k}-grams")
    at += n_fp
    tokens = np.frombuffer(data, "<i4", n_tokens, at).astype(np.int32)
    at += 4 * n_tokens
    if n_vocab is not None and len(tokens) and (top := int(tokens.max())) >= n_vocab:
        raise HistoryFileError(f"{path}: token id {top} is outside the vocabulary ({n_vocab} tokens)")
    try:
        docs = _read_table(data[at : at + n_table], n_docs, tokens)
        shared.tombstones = _read_tombstones(data[at + n_table : at + n_table + tomb_bytes], n_tomb)
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        raise HistoryFileError(f"{path}: {e}") from e
    return Contents(file_k, file_fp, tokens, docs, shared)


def load(
    path: str | os.PathLike,
    *,
    fingerprint: str | None = None,
    k: int | None = None,
    max_bytes: int = 64 << 20,
    n_vocab: int | None = None,
) -> HistoryIndex:
    """Read a history file into an index (see :func:`read`)."""
    return index_of(read(path, fingerprint=fingerprint, k=k, n_vocab=n_vocab, max_bytes=max_bytes), max_bytes)


def index_of(contents: Contents, max_bytes: int) -> HistoryIndex:
    index = HistoryIndex(k=contents.k, max_bytes=max_bytes, fingerprint=contents.fingerprint)
    index._set_store(contents.tokens, contents.docs)
    return index


def _read_table(table: memoryview, n_docs: int, tokens: np.ndarray) -> dict:
    """The document table, every range checked against the store."""
    if not len(tokens) or tokens[0] != SEP or tokens[-1] != SEP or tokens.min() < SEP:
        raise ValueError("the token store is malformed")
    neg = np.concatenate(([0], np.cumsum(tokens < 0)))  # separators before each index
    docs: dict[str, Doc] = {}
    at = 0
    for _ in range(n_docs):
        n_id, used, n_runs, n_text = _DOC.unpack_from(table, at)
        at += _DOC.size
        if not math.isfinite(used):
            raise ValueError("a document's time is not a number")
        doc_id = bytes(table[at : at + n_id]).decode()
        at += n_id
        n_ranges = n_runs + n_text
        if at + RANGE_BYTES * n_ranges > len(table):
            raise ValueError("the document table is cut short")
        ranges = np.frombuffer(table, "<u4", 2 * n_ranges, at).astype(np.int64).reshape(-1, 2)
        at += RANGE_BYTES * n_ranges
        starts, ends = ranges[:, 0], ranges[:, 1]
        if ((starts < 1) | (ends <= starts) | (ends >= len(tokens))).any():
            raise ValueError(f"document {doc_id!r} has a range outside the store")
        if (neg[ends] != neg[starts]).any():
            raise ValueError(f"document {doc_id!r} has a range across a separator")
        runs, text = ranges[:n_runs], ranges[n_runs:]
        if (tokens[runs[:, 1]] != SEP).any():
            raise ValueError(f"document {doc_id!r} has a run without its separator")
        inside = (text[:, :1] >= runs[:, 0]) & (text[:, 1:] <= runs[:, 1])  # text range x run
        if not inside.any(axis=1).all():
            raise ValueError(f"document {doc_id!r} has text outside its runs")
        n = int((runs[:, 1] - runs[:, 0]).sum())
        if doc_id in docs:
            raise ValueError(f"document {doc_id!r} appears twice")
        docs[doc_id] = Doc(runs.tolist(), text.tolist(), used, n, len(doc_id.encode()))
    if at != len(table):
        raise ValueError("the document table has trailing bytes")
    return docs


def _read_tombstones(data: memoryview, n: int) -> dict[str, float]:
    tombs: dict[str, float] = {}
    at = 0
    for _ in range(n):
        n_id, when = _TOMB.unpack_from(data, at)
        at += _TOMB.size
        if not math.isfinite(when):
            raise ValueError("a removal's time is not a number")
        if at + n_id > len(data):
            raise ValueError("the removed documents' list is cut short")
        tombs[bytes(data[at : at + n_id]).decode()] = when
        at += n_id
    if at != len(data):
        raise ValueError("the removed documents' list has trailing bytes")
    return tombs
