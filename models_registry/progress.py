"""Progress reports of a download: rate-limited, never going backwards, with a sliding-window speed."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = ["PROGRESS_INTERVAL", "SPEED_WINDOW", "ProgressCallback", "ProgressReporter"]

#: ``progress(bytes_done, bytes_total, speed_bps, eta_s)``; ``eta_s`` is None while the speed is unknown.
ProgressCallback = Callable[[int, int, float, "float | None"], None]

#: Progress callbacks are spaced at least this far apart (the final one always comes).
PROGRESS_INTERVAL = 0.1
#: Window over which the reported speed is averaged.
SPEED_WINDOW = 3.0


class ProgressReporter:
    """Rate-limited, monotonic progress reports with a sliding-window speed."""

    def __init__(self, callback: ProgressCallback | None, total: int, clock: Callable[[], float]) -> None:
        self._cb = callback
        self._total = total
        self._clock = clock
        self._last_t: float | None = None
        self._last_done = -1
        self._samples: deque[tuple[float, int]] = deque()
        self._transferred = 0  # bytes received by this call (the speed ignores resumed bytes)

    def received(self, n: int) -> None:
        """Count `n` bytes that came over the network (for the speed)."""
        self._transferred += n

    def report(self, done: int, *, force: bool = False) -> None:
        """Call back with `done` bytes, unless the last report was too recent (`force` skips that)."""
        if self._cb is None:
            return
        now = self._clock()
        self._samples.append((now, self._transferred))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW:
            self._samples.popleft()
        if done < self._last_done:
            return  # never go backwards (only a server ignoring Range could cause it)
        if not force and self._last_t is not None and now - self._last_t < PROGRESS_INTERVAL:
            return
        if force and done == self._last_done and self._last_t is not None and done != self._total:
            return
        t0, b0 = self._samples[0]
        speed = (self._transferred - b0) / (now - t0) if now > t0 else 0.0
        eta = (self._total - done) / speed if speed > 0 else (0.0 if done >= self._total else None)
        self._last_t, self._last_done = now, done
        self._cb(done, self._total, speed, eta)
