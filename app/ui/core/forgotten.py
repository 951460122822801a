"""Chats the user deleted, remembered so that their tokens leave every drafting history: the engine
keeps one history per tokenizer family, and only the loaded family's can be changed at once."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable

from app.ui.core.paths import data_dir

log = logging.getLogger("tandem.ui")

FILE_NAME = "history-removed.json"
KEEP = 2000  # the most recent removals remembered
_lock = threading.Lock()


def documents() -> list[str]:
    """The removed documents (conversation names in the drafting history)."""
    path = data_dir() / FILE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable %s: %s", path, e)
        return []
    return [d for d in data if isinstance(d, str)] if isinstance(data, list) else []


def remember(removed: Iterable[str]) -> None:
    with _lock:
        known = documents()
        known += [d for d in removed if d not in known]
        path = data_dir() / FILE_NAME
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(known[-KEEP:]), encoding="utf-8")
        tmp.replace(path)
