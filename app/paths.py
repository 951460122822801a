"""Where Tandem keeps its data (conversations, settings, the drafting history): ``$TANDEM_DATA_DIR`` or
the platform's user data directory. Shared by the app, the CLI and the server."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """The app's data directory (created if missing)."""
    env = os.environ.get("TANDEM_DATA_DIR")
    path = Path(env) if env else Path(platformdirs.user_data_dir("Tandem", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path
