"""What auto mode learned for one pair on one machine, kept across restarts.

``auto-<key>.json`` in the data folder (beside the drafting history) holds, for a pair of model files on a
machine and backend (CPU model, backend, threads, layers offloaded), the verify costs relative to one
decode step, the draft's costs, what model rounds really took over their prediction, and the pooled
acceptance of every drafter by class. A new session starts from it instead of the priors: the
second session starts where the first ended. The file is small (a few kilobytes), versioned, written
atomically, read only if it is a regular file of a sane size; one that cannot be read, is of another
version or belongs to another pair or machine is ignored with a log line (and replaced at the next save).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

from app.engine.history.safety import read_regular, write_atomically

log = logging.getLogger("tandem.auto")

VERSION = 1
MAX_BYTES = 1 << 20  # a sane file holds a few kilobytes


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _file_id(path: Path | None) -> str:
    if path is None:
        return "-"
    try:
        return f"{path.name}:{path.stat().st_size}"
    except OSError:
        return path.name


class AutoMemory:
    """The memory file of one pair on one machine (``key`` names both; the file is named by its hash)."""

    def __init__(self, folder: str | os.PathLike[str], key: str):
        self.key = key
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        self.path = Path(folder) / f"auto-{digest}.json"

    @classmethod
    def for_pair(
        cls, folder: str | os.PathLike[str] | None, target: Path, draft: Path | None, backend: str
    ) -> AutoMemory | None:
        """The memory for this pair on this machine with ``backend`` (the backend and where the layers
        go, as the engine words it), or None without a folder."""
        if not folder:
            return None
        key = f"{_file_id(target)} | {_file_id(draft)} | {cpu_name()} | {os.cpu_count()} | {backend}"
        return cls(folder, key)

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None (no file yet; or one that cannot be used, with a log line why)."""
        try:
            data = json.loads(read_regular(self.path, MAX_BYTES).decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning("auto mode's memory %s ignored: %s", self.path, e)
            return None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            found = data.get("version") if isinstance(data, dict) else None
            log.warning("auto mode's memory %s ignored: version %r, not %d", self.path, found, VERSION)
            return None
        if data.get("key") != self.key:
            log.warning("auto mode's memory %s ignored: it belongs to %r", self.path, data.get("key"))
            return None
        state = data.get("state")
        return state if isinstance(state, dict) else None

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` (replacing the file atomically); a failure is logged, never raised."""
        body = json.dumps({"version": VERSION, "key": self.key, "state": state}, separators=(",", ":"))
        try:
            write_atomically(self.path, [body.encode("utf-8")])
        except OSError as e:
            log.warning("auto mode's memory %s not saved: %s", self.path, e)


def floats(value: Any, n: int) -> list[float] | None:
    """``value`` as a list of ``n`` finite, non-negative floats, or None (a state from another shape)."""
    if not isinstance(value, list) or len(value) != n:
        return None
    try:
        out = [float(x) for x in value]
    except (TypeError, ValueError):
        return None
    return out if all(0.0 <= x < float("inf") for x in out) else None
