"""`LazyEvent`: a `threading.Event` whose condition variable is made by its first waiter.

A plain `threading.Event()` builds a `Condition` around a new lock (about ten objects the
collector tracks, several microseconds); every run has two that are mostly only set and
tested, never waited on: its actor's `actor_stopped` and its cell's `stored`. With 1,000 runs
alive at once (W5) they were a visible part of `start()` and of each full collection.
"""

from __future__ import annotations

import threading

__all__ = ["LazyEvent"]

# One lock for every LazyEvent: each critical section is a few bytecodes.
_LOCK = threading.Lock()


class LazyEvent(threading.Event):
    """A `threading.Event` (same methods, same semantics) that allocates on first `wait`."""

    def __init__(self) -> None:
        # No super().__init__(): that would build the Condition this class exists to defer.
        self._flag = False
        self._waiters: threading.Condition | None = None

    def _at_fork_reinit(self) -> None:
        self._flag = False
        self._waiters = None

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._flag

    isSet = is_set

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        with _LOCK:
            self._flag = True
            waiters = self._waiters
        if waiters is not None:
            # A waiter holds this condition from before it released _LOCK until it waits,
            # so this notify cannot fall between its flag check and its wait.
            with waiters:
                waiters.notify_all()

    def clear(self) -> None:
        """Reset the flag."""
        with _LOCK:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set, at most `timeout` seconds; returns the flag."""
        with _LOCK:
            if self._flag:
                return True
            waiters = self._waiters
            if waiters is None:
                waiters = self._waiters = threading.Condition(threading.Lock())
            waiters.acquire()
        try:
            # As threading.Event: True once notified by set(), even if cleared since.
            return self._flag or waiters.wait(timeout)
        finally:
            waiters.release()
