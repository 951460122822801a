"""Where the registry keeps what it measures on this machine (the app's data folder), written atomically.

The same folder as the app's settings and conversations (`app.ui.core.paths.data_dir`): ``$TANDEM_DATA_DIR``
or the platform's user data directory (``platformdirs``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import platformdirs

__all__ = ["data_dir", "write_json_atomic"]


def data_dir() -> Path:
    """The app's data folder (not created here: writers create it)."""
    env = os.environ.get("TANDEM_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir("Tandem", appauthor=False))


def write_json_atomic(path: Path, data: object) -> None:
    """Write `data` as JSON to a temporary file in `path`'s folder, then rename it over `path`: a reader
    sees the old file or the new one, never half of one (a unique temporary name per writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
