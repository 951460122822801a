"""Other processes' use of the CPU, for benchmarks on a shared machine: how many cores they used over a
stretch of time, a cancel check that stops a run when they get busy, and a wait for a quiet machine."""

from __future__ import annotations

import os
import sys
import time

QUIET_CORES = 0.2  # --wait-quiet: other processes under this share of the CPU count as a quiet machine
BUSY_CORES = 0.5  # a turn during which other processes used more than this is counted as contended
BUSY_WINDOW = 5.0  # seconds: --retry-busy judges other processes' use over windows this long


class OthersCpu:
    """The CPU other processes use, in cores: the machine's busy time (``/proc/stat``) less this
    process's own. On a 2-core machine another process's work slows every mode; a turn that saw
    some is marked (None where ``/proc/stat`` is missing)."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        own = os.times()
        busy = (sum(ticks) - ticks[3] - ticks[4]) / hz  # all but idle and iowait
        return busy, own.user + own.system, time.monotonic()

    def cores(self) -> float | None:
        """Cores other processes used since the start (or the last call), and start again."""
        now = self._sample()
        then, self._start = self._start, now
        if now is None or then is None or now[2] <= then[2]:
            return None
        return max(0.0, ((now[0] - then[0]) - (now[1] - then[1])) / (now[2] - then[2]))


class BusyWatch:
    """A generation's cancel check: true once other processes used more than ``BUSY_CORES`` over
    ``BUSY_WINDOW`` seconds (``busy`` says how many cores)."""

    def __init__(self) -> None:
        self._probe = OthersCpu()
        self._since = time.monotonic()
        self.busy = 0.0

    def __call__(self) -> bool:
        if not self.busy and time.monotonic() - self._since >= BUSY_WINDOW:
            used = self._probe.cores()
            self._since = time.monotonic()
            if used is not None and used > BUSY_CORES:
                self.busy = used
        return bool(self.busy)


def wait_quiet(limit: float) -> float | None:
    """Wait (up to ``limit`` seconds) until other processes use under ``QUIET_CORES`` of a core over
    two seconds; returns what they used last."""
    deadline = time.monotonic() + limit
    said = False
    while True:
        probe = OthersCpu()
        time.sleep(2.0)
        used = probe.cores()
        if used is None or used < QUIET_CORES or time.monotonic() > deadline:
            return used
        if not said:
            print(f"waiting for a quiet machine (others use {used:.1f} cores)", file=sys.stderr, flush=True)
            said = True
