"""`SqliteStore`'s write queue: what the facade queues and the writer (or a run's own worker)
commits, in the order it was put (docs/decisions/0004-waiting-run-commits.md).

Its own module so that the writer's parts (sqlite_apply.py, sqlite_events.py,
sqlite_own.py) name its type without importing the writer.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any

__all__ = ["WriteQueue"]


class WriteQueue:
    """The writer's queue: writes in order, a doorbell that wakes the writer, and counts of
    what was put and what is done with, so that a flush with nothing queued returns at once
    (a fresh process's `load`, W4).

    A write is taken off only under the store's commit lock (`SqliteWriter._commit_lock`), by
    the writer thread or by a pool worker that commits on its own thread (`commit_now`), so
    writes are committed in the order they were put whoever commits them. `put_lazy` queues
    without waking the writer while it polls (`dozing` False): the run that queued it commits
    it itself if it waits for it, and the writer takes it at its next poll otherwise
    (docs/decisions/0004-waiting-run-commits.md).
    """

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._put = 0
        self._done = 0
        self.dozing = True
        """The writer waits longer than a poll: a lazy put rings (set by the writer only)."""

    def put(self, item: Any) -> None:
        """Queue `item` and wake the writer."""
        with self._lock:  # counted before it can be taken
            self._put += 1
        self._items.append(item)
        self._bell.put(None)

    def put_lazy(self, item: Any) -> None:
        """Queue `item`; wake the writer only if it is not polling."""
        with self._lock:
            self._put += 1
        self._items.append(item)
        if self.dozing:  # read after the append: see `SqliteWriter._wait`
            self._bell.put(None)

    def ring(self) -> None:
        """Wake the writer with nothing queued (it re-reads when stored events are due)."""
        self._bell.put(None)

    def wait(self, timeout: float | None) -> None:
        """The writer's wait for a ring, up to `timeout` seconds (None: no limit)."""
        bell = self._bell
        try:
            bell.get(timeout=timeout)
        except queue.Empty:
            return
        while True:  # one wake for every ring so far; a later ring wakes the next wait
            try:
                bell.get_nowait()
            except queue.Empty:
                return

    def take(self, most: int) -> list[Any]:
        """Up to `most` items, oldest first (under the commit lock)."""
        items = self._items
        taken: list[Any] = []
        while items and len(taken) < most:
            taken.append(items.popleft())
        return taken

    def give_back(self, taken: list[Any]) -> None:
        """Put items taken but not committed back at the front, and wake the writer."""
        self._items.extendleft(reversed(taken))
        self._bell.put(None)

    def empty(self) -> bool:
        """Whether nothing is queued (taken items being committed are not counted)."""
        return not self._items

    def done(self, count: int) -> None:
        """The writer thread is done with `count` items (committed, refused or given up)."""
        with self._lock:
            self._done += count

    def idle(self) -> bool:
        """Whether every item put so far is done."""
        with self._lock:
            return self._done >= self._put
