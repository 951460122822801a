"""Streamed output text: incremental UTF-8 (:class:`Utf8Stream`) and stop strings (:class:`StopMatcher`).
Pure Python."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["StopMatcher", "Utf8Stream"]


class Utf8Stream:
    """Incremental UTF-8 decoding of token byte pieces.

    :meth:`feed` returns only complete characters and holds back an incomplete trailing
    sequence; invalid bytes become U+FFFD at once (they never stall the stream).
    :meth:`flush` ends the stream: a dangling incomplete sequence becomes U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes | bytearray | memoryview) -> str:
        """Add bytes; return the newly completed text."""
        return self._decoder.decode(bytes(piece))

    def flush(self) -> str:
        """End of generation: return whatever is left (and start afresh)."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending(self) -> bytes:
        """Bytes held back as the start of an incomplete character."""
        return self._decoder.getstate()[0]


# --------------------------------------------------------------------------- stop strings


class StopMatcher:
    """Cuts streamed text at the first stop string to be completed.

    Generation stops as soon as any stop string has arrived in full; the output ends just
    before it (if several complete at the same character, at the one that starts first).
    This answer does not depend on how the text is split into :meth:`feed` calls. Held back
    is only the longest suffix that is a proper prefix of some stop string, so work is
    linear in the output length.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            raise TypeError("stops must be a sequence of strings, not a single string")
        for stop in stops:
            if not isinstance(stop, str):
                raise TypeError(f"stop strings must be str, got {type(stop).__name__}")
            if not stop:
                raise ValueError("stop strings must not be empty")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self._prefixes = frozenset(stop[:i] for stop in self.stops for i in range(1, len(stop)))
        self._max_hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether a stop string has been hit."""
        return self._stopped

    @property
    def held(self) -> str:
        """Text held back because it could be the beginning of a stop string."""
        return self._held

    def feed(self, text: str) -> tuple[str, bool]:
        """Add generated text; return ``(text safe to emit now, stop string hit)``.

        After a hit, further calls return ``("", True)``.
        """
        if self._stopped:
            return "", True
        window = self._held + text
        cut = self._first_stop(window)
        if cut is not None:
            self._held = ""
            self._stopped = True
            return window[:cut], True
        hold = self._hold_length(window)
        self._held = window[len(window) - hold :] if hold else ""
        return window[: len(window) - hold], False

    def flush(self) -> str:
        """Generation ended without a stop: return the held-back text."""
        held, self._held = self._held, ""
        return held

    def reset(self) -> None:
        """Forget all state, ready for a new generation."""
        self._held = ""
        self._stopped = False

    def _first_stop(self, window: str) -> int | None:
        """Start of the stop string that completes earliest in ``window`` (ties: starts first)."""
        best: tuple[int, int] | None = None
        for stop in self.stops:
            start = window.find(stop)
            if start >= 0:
                key = (start + len(stop), start)
                if best is None or key < best:
                    best = key
        return None if best is None else best[1]

    def _hold_length(self, window: str) -> int:
        """Length of the longest suffix of ``window`` that is a proper prefix of a stop."""
        for length in range(min(self._max_hold, len(window)), 0, -1):
            if window[-length:] in self._prefixes:
                return length
        return 0
