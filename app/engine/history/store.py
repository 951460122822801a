"""The history on disk, ``history-<fingerprint>.bin`` per tokenizer family in the data folder (its format:
:mod:`.fileformat`), which several processes may share (the app's engine, ``tandem serve``).

``HistoryStore`` loads the file in the background, refusing what is not a regular file of a sane size or
holds token ids outside the vocabulary (a log line says why; the history starts empty and the next save
replaces the file). Every write holds the folder's lock file (``history-<fingerprint>.lock``, see
:mod:`.safety`): if another process wrote the file since this one last read or wrote it, the file is read and
merged (:mod:`.merge`) so that neither loses the other's documents, and removals and forgets hold; else this
process's documents are written as they are. Killed saves' temporary files are removed at start.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path

from app.engine.history.fileformat import (
    Contents,
    HistoryFileError,
    file_name,
    index_of,
    load,
    read,
    read_generation,
    save,
    write,
)
from app.engine.history.index import HistoryIndex
from app.engine.history.layout import DEAD, Shared
from app.engine.history.merge import Merged, merge, merge_shared
from app.engine.history.safety import RefusedFile, file_lock, remove_stale_temporaries

__all__ = ["HistoryFileError", "HistoryStore", "file_name", "load", "save"]

log = logging.getLogger("tandem.history")

LOAD_WAIT = 60.0  # seconds a save waits for the file to finish loading


class HistoryStore:
    """The history file of one tokenizer family in ``folder``, and the index it holds.

    ``index`` is usable at once; :meth:`load_in_background` fills it from the file (documents added
    meanwhile are kept, as the most recent) and sets ``ready``. A missing, unreadable or refused file leaves
    the index empty and logs why. ``n_vocab``: the family's vocabulary size (token ids are below it).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        fingerprint: str,
        *,
        k: int = 4,
        max_bytes: int = 64 << 20,
        n_vocab: int | None = None,
    ):
        self.path = Path(folder) / file_name(fingerprint)
        self.lock_path = self.path.with_suffix(".lock")
        self.fingerprint = fingerprint
        self.n_vocab = n_vocab
        self.max_bytes = max_bytes
        self.index = HistoryIndex(k=k, max_bytes=max_bytes, fingerprint=fingerprint)
        self.ready = threading.Event()
        self.leftover = 0  # bytes of temporary files that could not be removed (counted in the bound)
        self._thread: threading.Thread | None = None
        self._mutex = threading.RLock()
        # what this process knows of the file since it last read or wrote it
        self._shared = Shared()  # its generation, the forgets and removals (this process's added)
        self._synced: dict[str, float] = {}  # document -> the version (last written) the file had
        self._complete = True  # this index holds every document the file had

    def load_in_background(self) -> threading.Thread:
        """Start loading the file in a daemon thread (once); ``ready`` is set when it is done."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._load, name="history-load", daemon=True)
            self._thread.start()
        return self._thread

    def _load(self) -> None:
        try:
            self._clean()
            contents = read(
                self.path, fingerprint=self.fingerprint, k=self.index.k, n_vocab=self.n_vocab,
                max_bytes=self.max_bytes,
            )  # fmt: skip
        except FileNotFoundError:
            log.info("no history yet at %s", self.path)
        except (HistoryFileError, OSError) as e:
            log.warning("history not loaded, starting empty: %s", e)
        except Exception:
            log.exception("history not loaded, starting empty: %s", self.path)
        else:
            self._adopt(contents)
        finally:
            self.ready.set()

    def _adopt(self, contents: Contents) -> None:
        with self._mutex:
            shared = merge_shared(contents.shared, self._shared)  # with what was removed meanwhile
            for doc_id in [d for d, doc in contents.docs.items() if shared.dead(d, doc.used)]:
                for a, b in contents.docs.pop(doc_id).runs:
                    contents.tokens[a : b + 1] = DEAD  # never indexed, left out of the next save
            self.index.adopt(index_of(contents, self.index.max_bytes))
            self._shared = shared
            self._synced = {doc_id: doc.used for doc_id, doc in contents.docs.items()}
            self._complete = True
        log.info("history loaded: %d documents, %d tokens", len(self.index.documents()), len(self.index))

    def _clean(self) -> None:
        """Remove the temporary files of killed saves; what remains counts in the bound."""
        if not self.path.parent.is_dir():
            return
        try:
            with file_lock(self.lock_path):
                self.leftover = remove_stale_temporaries(self.path, locked=True)
        except OSError as e:
            log.warning("the history folder's lock is unavailable (%s): removing only old temporary files", e)
            self.leftover = remove_stale_temporaries(self.path, locked=False)
        if self.leftover:
            self.index.max_bytes = max(self.max_bytes - self.leftover, self.max_bytes // 2)

    def _wait(self) -> None:
        if self._thread is not None and not self.ready.wait(LOAD_WAIT):  # never write over a file being read
            raise TimeoutError(f"the history at {self.path} is still loading")

    def save(self) -> int:
        """Write the index to the file (merged with what another process wrote there meanwhile); returns the
        file's size in bytes."""
        self._wait()
        with self._mutex, file_lock(self.lock_path):
            tokens, docs = self.index.snapshot()
            changed = {d for d, doc in docs if self._synced.get(d) != doc.used}
            on_disk = read_generation(self.path)
            if self._complete and on_disk is not None and on_disk == self._shared.generation:
                disk = None  # nobody else wrote it since: this index holds all it had
            else:
                disk = self._read_for_merge()
            if disk is None:  # this index is all there is to write
                merged = Merged(tokens, docs, merge_shared(self._shared, Shared()), [], True)
            else:
                merged = merge(disk, tokens, docs, changed, self._shared, max_bytes=self.max_bytes)
            merged.shared.generation = _next(max(merged.shared.generation, on_disk or 0))
            size = write(self.path, self.index.k, self.fingerprint, merged.tokens, merged.docs, merged.shared)
            drop = set(merged.drop)
            for doc_id in drop:
                self.index.remove(doc_id)
            self._shared = merged.shared
            self._synced = {doc_id: doc.used for doc_id, doc in docs if doc_id not in drop}
            self._complete = merged.complete
            return size

    def _read_for_merge(self) -> Contents | None:
        try:
            return read(
                self.path, fingerprint=self.fingerprint, k=self.index.k, n_vocab=self.n_vocab,
                max_bytes=self.max_bytes,
            )  # fmt: skip
        except FileNotFoundError:
            return None
        except (HistoryFileError, RefusedFile, OSError) as e:
            log.warning("history file replaced, it could not be merged: %s", e)
            return None

    def remove(self, documents: Iterable[str]) -> None:
        """Remove documents, and remember that they were (another process's copy does not come back)."""
        with self._mutex:
            tombs = self._shared.tombstones
            for doc_id in documents:
                if doc_id in self.index or doc_id not in tombs:  # else: removed before, and not written since
                    tombs.pop(doc_id, None)
                    tombs[doc_id] = self.index._now()
                self.index.remove(doc_id)

    def forget(self) -> None:
        """Empty the index and the file: what was written before now, by any process, is forgotten (the
        time is kept in the file, so another process's next save drops its older documents too)."""
        self._wait()
        with self._mutex:
            now = self.index._now()
            self.index.clear()
            self._shared = Shared(self._shared.generation, now, {})
            self._synced, self._complete = {}, True
            self.save()

    def size_bytes(self) -> int:
        """The file's size on disk (0 if there is none yet), with the temporary files left over."""
        try:
            return os.lstat(self.path).st_size + self.leftover
        except FileNotFoundError:
            return self.leftover


def _next(generation: int) -> int:
    """The generation after ``generation``: a count in the high bits, random low bits (two processes that
    write the same count, one over a file it could not read, still differ)."""
    return (((generation >> 20) + 1) << 20) | secrets.randbits(20)
