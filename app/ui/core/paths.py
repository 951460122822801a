"""Where the app keeps its data (see :mod:`app.paths`)."""

from app.paths import data_dir

__all__ = ["data_dir"]
