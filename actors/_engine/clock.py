"""Time, injected: the runtime reads a `Clock`; tests advance a `ManualClock`, never sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """A source of time. `now()` is monotonic seconds; `wall()` is seconds since the epoch."""

    def now(self) -> float:
        """Monotonic seconds, for deadlines and durations."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps shown to people."""
        ...

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` whenever time jumps (a manual clock advanced); returns an unsubscribe.

        A real clock never jumps, so its subscription is a no-op. The timer service uses this
        to re-check its deadlines at once when a test advances time.
        """
        ...


class SystemClock:
    """The real clock: `time.monotonic` and `time.time`."""

    __slots__ = ()

    def now(self) -> float:
        """Monotonic seconds."""
        return time.monotonic()

    def wall(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Real time never jumps: nothing to subscribe to."""
        del callback
        return _noop


def _noop() -> None:
    return None


class ManualClock:
    """A clock that moves only when told to, for deterministic tests of timeouts and retries.

    Args:
        start: The initial monotonic reading, in seconds.
        wall_start: The initial wall-clock reading, in seconds since the epoch.
    """

    def __init__(self, start: float = 1_000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = start
        self._offset = wall_start - start
        self._subscribers: list[Callable[[], None]] = []

    def now(self) -> float:
        """The current manual reading."""
        with self._lock:
            return self._now

    def wall(self) -> float:
        """The wall-clock reading that corresponds to `now()`."""
        with self._lock:
            return self._now + self._offset

    def advance(self, seconds: float) -> None:
        """Move time forward and wake everyone waiting on a deadline."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += seconds
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after every `advance()`; returns a function that unsubscribes."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe
