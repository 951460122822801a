"""Turns at one engine: callers (the app's chat, API requests) take turns in arrival order.

The engine generates one reply at a time. A :class:`TurnQueue` hands out turns first come, first
served, and refuses a newcomer (:class:`QueueFull`) when ``max_waiting`` callers are already waiting,
so a server can answer 429 at once instead of holding connections open without bound.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque


class QueueFull(RuntimeError):
    """Too many callers are waiting for the engine."""

    def __init__(self, waiting: int):
        super().__init__(f"{waiting} requests are already waiting for the engine")
        self.waiting = waiting


class Ticket:
    """A place in the queue: :meth:`wait` for the turn, then :meth:`release` it (or use ``with``)."""

    def __init__(self, queue: TurnQueue, number: int):
        self._queue, self.number = queue, number
        self.active = False
        self.done = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until it is this ticket's turn (True), or ``timeout`` seconds pass (False)."""
        return self._queue._wait(self, timeout)

    def release(self) -> None:
        """End the turn, or leave the queue before it came (idempotent)."""
        self._queue._release(self)

    def __enter__(self) -> Ticket:
        self.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class TurnQueue:
    """First come, first served turns, with at most ``max_waiting`` callers waiting."""

    def __init__(self, max_waiting: int = 16):
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._active: Ticket | None = None
        self._numbers = itertools.count(1)

    def enter(self, *, bounded: bool = True, first: bool = False) -> Ticket:
        """Take a place in the queue (raises :class:`QueueFull` when it is full, unless ``bounded``
        is False: the app's own chat always gets its turn). ``first`` goes before those waiting (a
        restart of the engine that they all need)."""
        with self._cond:
            if bounded and len(self._waiting) >= self.max_waiting and self._active is not None:
                raise QueueFull(len(self._waiting))
            ticket = Ticket(self, next(self._numbers))
            if first:
                self._waiting.appendleft(ticket)
            else:
                self._waiting.append(ticket)
            return ticket

    def turn(self, *, bounded: bool = True, first: bool = False) -> Ticket:
        """A place in the queue, to use as ``with queue.turn(): ...`` (waits for the turn)."""
        return self.enter(bounded=bounded, first=first)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._active is not None

    def _wait(self, ticket: Ticket, timeout: float | None) -> bool:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: (
                    ticket.done or (self._active is None and self._waiting and self._waiting[0] is ticket)
                ),
                timeout,
            )
            if not ok or ticket.done:
                return False
            self._waiting.popleft()
            self._active = ticket
            ticket.active = True
            return True

    def _next_is(self, ticket: Ticket) -> bool:
        return self._active is None and bool(self._waiting) and self._waiting[0] is ticket

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.done:
                return
            ticket.done = True
            if self._active is ticket:
                self._active = None
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._cond.notify_all()
