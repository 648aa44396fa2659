"""The worker pool's records: the `Job` protocol and one worker's slot (split from pool.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pykka

__all__ = ["Job", "StartFailureCallback"]


class Job(Protocol):
    """A unit of blocking work. The job itself delivers its result; the pool only runs it.

    A job may also define `cancel_pending(self) -> None`, looked up with `getattr`: the pool calls
    it for a job still queued when the pool shuts down (it will never run), so that its caller
    can record the call as cancelled. And `start_failed(self, exc: BaseException) -> None`: called
    for a job the pool had accepted but can never run, because no worker thread could be started
    for it and no live worker is left to take it (T1); it takes precedence over the pool's
    `on_start_failure`. Neither may block or raise.
    """

    def run(self) -> None:
        """Run on a worker thread. Should not raise: whatever it raises is logged and dropped."""
        ...


StartFailureCallback = Callable[[Job, BaseException], None]


class _Slot:
    """The pool's record of one worker. Every field is guarded by the pool's lock."""

    __slots__ = ("abandoned", "job", "name", "ref", "thread")

    def __init__(self, name: str) -> None:
        self.name = name
        self.job: Job | None = None
        self.abandoned = False
        self.ref: pykka.ActorRef[Any] | None = None  # its ToolWorker
        self.thread: threading.Thread | None = None
