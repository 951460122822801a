"""Split GGUFs: a model published as parts named ``name-00001-of-00003.gguf``.

llama.cpp loads a split model from its first part and finds the others beside it; the weights are the
sum of the parts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_PART = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_info(name: str) -> tuple[str, int, int] | None:
    """``(stem, index, count)`` of a part's file name (1-based index), or None for a single file."""
    m = _PART.match(os.path.basename(name))
    if m is None:
        return None
    index, count = int(m["index"]), int(m["count"])
    if not 1 <= index <= count:
        return None
    return m["stem"], index, count


def part_name(stem: str, index: int, count: int) -> str:
    """The file name of part ``index`` (1-based) of ``count``."""
    return f"{stem}-{index:05d}-of-{count:05d}.gguf"


def part_names(name: str) -> list[str]:
    """Every part's file name for a split model's part (any of them); ``[name]`` for a single file."""
    info = split_info(name)
    if info is None:
        return [os.path.basename(name)]
    stem, _, count = info
    return [part_name(stem, i, count) for i in range(1, count + 1)]


def first_part(path: str | os.PathLike[str]) -> Path:
    """The file llama.cpp opens: the first part of a split model, or the file itself."""
    p = Path(path)
    return p.with_name(part_names(p.name)[0])


def model_parts(path: str | os.PathLike[str]) -> list[Path]:
    """All the files of a model on disk (for a split model, every part beside ``path``)."""
    p = Path(path)
    return [p.with_name(n) for n in part_names(p.name)]


def missing_parts(path: str | os.PathLike[str]) -> list[Path]:
    """The parts of a split model that are not on disk beside ``path`` (empty when complete)."""
    return [p for p in model_parts(path) if not p.is_file()]


def model_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of a model on disk, every part summed."""
    return sum(p.stat().st_size for p in model_parts(path) if p.is_file())
