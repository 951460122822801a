"""The history index on disk: one file per tokenizer family, written atomically, checked on load.

File layout (little-endian)::

    header   magic "TANDHIST", version u32, K u32, fingerprint bytes u32, documents u32,
             store tokens u64, table bytes u64
    fingerprint (utf-8)
    tokens   int32 x store tokens: the compacted store, separators and the sentinel included
    table    per document: id bytes u16, last written f64, runs u32, ranges u32, the id (utf-8),
             then (start, end) u32 pairs: its runs, then the ranges of its latest version
    crc32    u32 of everything before it

The sorted index is not stored: loading rebuilds it vectorized (``HistoryIndex._rebuild``).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np

from app.engine.history.index import HistoryIndex
from app.engine.history.layout import DOC_RECORD_BYTES, HEADER_BYTES, RANGE_BYTES, SEP, Doc

log = logging.getLogger("tandem.history")

MAGIC = b"TANDHIST"
VERSION = 1
_HEADER = struct.Struct("<8sIIIIQQ")
_DOC = struct.Struct("<HdII")
assert _HEADER.size == HEADER_BYTES and _DOC.size == DOC_RECORD_BYTES and RANGE_BYTES == 8
_FINGERPRINT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class HistoryFileError(Exception):
    """A history file that cannot be read: not one, another version or vocabulary, truncated, corrupt."""


def file_name(fingerprint: str) -> str:
    """The file of one tokenizer family: ``history-<fingerprint>.bin``."""
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(f"a vocabulary fingerprint is 1-64 letters, digits, '.', '_', '-': {fingerprint!r}")
    return f"history-{fingerprint}.bin"


def save(index: HistoryIndex, path: str | os.PathLike) -> int:
    """Write ``index`` to ``path`` atomically (a temporary file in the same folder, fsync, rename),
    without its removed and transient documents. Returns the bytes written."""
    path = Path(path)
    tokens, docs = index.snapshot()
    raw = tokens.astype("<i4", copy=False).tobytes()
    table = b"".join(_doc_record(doc_id, doc) for doc_id, doc in docs)
    fingerprint = index.fingerprint.encode()
    head = _HEADER.pack(MAGIC, VERSION, index.k, len(fingerprint), len(docs), len(tokens), len(table))
    crc = zlib.crc32(table, zlib.crc32(raw, zlib.crc32(fingerprint, zlib.crc32(head))))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(fingerprint)
            f.write(raw)
            f.write(table)
            f.write(struct.pack("<I", crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def _doc_record(doc_id: str, doc: Doc) -> bytes:
    ident = doc_id.encode()
    ranges = np.array(doc.runs + doc.text, "<u4").tobytes()
    return _DOC.pack(len(ident), doc.used, len(doc.runs), len(doc.text)) + ident + ranges


def load(
    path: str | os.PathLike,
    *,
    fingerprint: str | None = None,
    k: int | None = None,
    max_bytes: int = 64 << 20,
) -> HistoryIndex:
    """Read a history file. Raises :class:`HistoryFileError` if it is not a valid one (or was written for
    another ``fingerprint`` or ``k``), ``OSError`` if it cannot be read."""
    data = memoryview(Path(path).read_bytes())
    if len(data) < _HEADER.size + 4:
        raise HistoryFileError(f"{path}: too short for a history file ({len(data)} bytes)")
    magic, version, file_k, n_fp, n_docs, n_tokens, n_table = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise HistoryFileError(f"{path}: not a history file")
    if version != VERSION:
        raise HistoryFileError(f"{path}: history file version {version}, this build reads {VERSION}")
    expected = _HEADER.size + n_fp + 4 * n_tokens + n_table + 4
    if len(data) != expected:
        raise HistoryFileError(f"{path}: {len(data)} bytes where the header says {expected} (truncated?)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise HistoryFileError(f"{path}: checksum mismatch (the file is corrupt)")
    at = _HEADER.size
    try:
        file_fp = bytes(data[at : at + n_fp]).decode()
    except UnicodeDecodeError as e:
        raise HistoryFileError(f"{path}: the vocabulary fingerprint is not text") from e
    if fingerprint is not None and file_fp != fingerprint:
        raise HistoryFileError(f"{path}: written for vocabulary {file_fp!r}, not {fingerprint!r}")
    if k is not None and file_k != k:
        raise HistoryFileError(f"{path}: indexed by {file_k}-grams, not {k}-grams")
    at += n_fp
    tokens = np.frombuffer(data, "<i4", n_tokens, at).astype(np.int32)
    at += 4 * n_tokens
    try:
        docs = _read_table(data[at : at + n_table], n_docs, tokens)
        index = HistoryIndex(k=file_k, max_bytes=max_bytes, fingerprint=file_fp)
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        raise HistoryFileError(f"{path}: {e}") from e
    index._set_store(tokens, docs)
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
        runs = ranges[:n_runs]
        if (tokens[runs[:, 1]] != SEP).any():
            raise ValueError(f"document {doc_id!r} has a run without its separator")
        n = int((runs[:, 1] - runs[:, 0]).sum())
        if doc_id in docs:
            raise ValueError(f"document {doc_id!r} appears twice")
        docs[doc_id] = Doc(runs.tolist(), ranges[n_runs:].tolist(), used, n, len(doc_id.encode()))
    if at != len(table):
        raise ValueError("the document table has trailing bytes")
    return docs


class HistoryStore:
    """The history file of one tokenizer family in ``folder``, and the index it holds.

    ``index`` is usable at once; :meth:`load_in_background` fills it from the file (documents added
    meanwhile are kept, as the most recent) and sets ``ready``. A missing or unreadable file leaves the
    index empty and logs why.
    """

    def __init__(self, folder: str | os.PathLike, fingerprint: str, *, k: int = 4, max_bytes: int = 64 << 20):
        self.path = Path(folder) / file_name(fingerprint)
        self.fingerprint = fingerprint
        self.index = HistoryIndex(k=k, max_bytes=max_bytes, fingerprint=fingerprint)
        self.ready = threading.Event()
        self._thread: threading.Thread | None = None

    def load_in_background(self) -> threading.Thread:
        """Start loading the file in a daemon thread (once); ``ready`` is set when it is done."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._load, name="history-load", daemon=True)
            self._thread.start()
        return self._thread

    def _load(self) -> None:
        try:
            loaded = load(
                self.path, fingerprint=self.fingerprint, k=self.index.k, max_bytes=self.index.max_bytes
            )
        except FileNotFoundError:
            log.info("no history yet at %s", self.path)
        except (HistoryFileError, OSError) as e:
            log.warning("history not loaded, starting empty: %s", e)
        except Exception:
            log.exception("history not loaded, starting empty: %s", self.path)
        else:
            self.index.adopt(loaded)
            log.info("history loaded: %d documents, %d tokens", len(self.index.documents()), len(self.index))
        finally:
            self.ready.set()

    def _wait(self) -> None:
        if self._thread is not None:
            self.ready.wait()  # never write over a file that is still being read

    def save(self) -> int:
        """Write the index to the file; returns its size in bytes."""
        self._wait()
        return save(self.index, self.path)

    def forget(self) -> None:
        """Delete the file and empty the index."""
        self._wait()
        self.path.unlink(missing_ok=True)
        self.index.clear()

    def size_bytes(self) -> int:
        """The file's size on disk (0 if there is none yet)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0
