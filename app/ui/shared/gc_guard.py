"""Run Python's cyclic garbage collector in the GUI thread only.

Automatic collection runs in whichever thread happens to allocate. If that is the engine thread and the
collected cycle holds a Qt widget, the widget is destroyed outside the GUI thread and Qt crashes. While
a window is open, automatic collection is off and a GUI-thread timer collects instead (the same
generation thresholds, checked every half second).
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

_users = 0
_was_enabled = True


class MainThreadGC(QObject):
    """Disables automatic GC while alive (reference counted) and collects from a GUI-thread timer."""

    INTERVAL_MS = 500

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        global _users, _was_enabled
        if _users == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _users += 1
        self._active = True
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.check)
        self._timer.start(self.INTERVAL_MS)

    def check(self) -> None:
        """Collect the generations whose allocation counts passed their thresholds."""
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if c0 > t0:
            gen = 2 if c2 > t2 else (1 if c1 > t1 else 0)
            gc.collect(gen)

    def stop(self) -> None:
        """Stop collecting here; re-enable automatic collection when the last user stops."""
        global _users
        if not self._active:
            return
        self._active = False
        self._timer.stop()
        _users -= 1
        if _users == 0:
            gc.collect()
            if _was_enabled:
                gc.enable()
