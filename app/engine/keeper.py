"""The engine's drafting history: kept per tokenizer family in the history folder, loaded in the
background when a pair loads, added to after every reply that names its document (a conversation or
an API request), saved now and then and when the pair unloads."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from app.engine.history.drafter import HistoryDrafter
from app.engine.history.store import HistoryStore
from app.engine.info import HistoryInfo

log = logging.getLogger("tandem.engine")

SAVE_EVERY = 60.0  # seconds: a crash loses at most this much of what was learned


class HistoryKeeper:
    """The history store and its drafter for one loaded pair."""

    def __init__(self, folder: str | Path, fingerprint: str, *, n_vocab: int | None = None):
        """``n_vocab``: the family's vocabulary size; a file holding token ids outside it is refused."""
        self.store = HistoryStore(Path(folder), fingerprint, n_vocab=n_vocab)
        self.store.load_in_background()
        self.drafter = HistoryDrafter(self.store.index)
        self._saved = time.monotonic()
        self._dirty = False

    def record(self, document: str) -> None:
        """The reply just generated (with its prompt) belongs to ``document``."""
        self.drafter.commit(document)
        self._dirty = True
        if time.monotonic() - self._saved > SAVE_EVERY:
            self.save()

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.store.save()
        except OSError as e:
            log.warning("could not save the drafting history: %s", e)
            return
        except Exception:  # never let the history stop a request
            log.exception("could not save the drafting history")
            return
        self._saved = time.monotonic()
        self._dirty = False

    def info(self) -> HistoryInfo:
        index = self.store.index
        return HistoryInfo(
            True,
            ready=self.store.ready.is_set(),
            tokens=len(index),
            documents=len(index.documents()),
            size_bytes=self.store.size_bytes(),
        )

    def forget(self) -> HistoryInfo:
        try:
            self.store.forget()
        except Exception as e:  # emptied all the same; the file is written at the next save
            log.warning("could not forget the drafting history on disk: %s", e)
            self.store.index.clear()
            self._dirty = True
        else:
            self._dirty = False
        return self.info()

    def remove(self, documents: Sequence[str]) -> HistoryInfo:
        self.store.remove(documents)
        self._dirty = True
        self.save()
        return self.info()

    def close(self) -> None:
        self.save()
