"""The drafting history: the user's earlier documents (conversations, API requests) as token ids, indexed
for "where did the context's last tokens occur before, and what followed" (:mod:`.index`), kept on disk
per tokenizer family (:mod:`.store`, in the format of :mod:`.fileformat`, shared safely by several processes:
:mod:`.safety`, :mod:`.merge`), and drafted from (:mod:`.drafter`)."""

from app.engine.history.drafter import HistoryDrafter
from app.engine.history.fileformat import HistoryFileError, load, save
from app.engine.history.index import HistoryIndex
from app.engine.history.store import HistoryStore
from app.engine.history.timing import measure

__all__ = ["HistoryDrafter", "HistoryFileError", "HistoryIndex", "HistoryStore", "load", "measure", "save"]
