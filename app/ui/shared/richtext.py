"""Plain text put into Qt's rich-text labels: escaped, so ``<``, ``&`` and quotes show as typed."""

from __future__ import annotations

import html

__all__ = ["escape", "escape_lines"]


def escape(text: str) -> str:
    """``text`` safe inside HTML (``html.escape``)."""
    return html.escape(text)


def escape_lines(text: str) -> str:
    """``text`` escaped, its line breaks kept as ``<br>`` (multi-line messages)."""
    return escape(text).replace("\n", "<br>")
