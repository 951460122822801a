"""How sizes are shown: decimal units, as the Hub lists them (``4.9 GB``)."""

from __future__ import annotations


def format_bytes(n: float | None) -> str:
    """``n`` bytes in decimal units (1 GB = 10**9 bytes); ``?`` when unknown."""
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
