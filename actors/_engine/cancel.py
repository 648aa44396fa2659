"""Cancellation as an object: a scope tree that mirrors the run tree (R18, docs/pykka.md T5).

A tool that is running does not read its actor's inbox, so a cancel message would wait behind
the very call it means to stop. Cancellation is therefore shared state: the cancelling thread
sets the scope (and every descendant) directly; messages only record it in order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .log import get_logger

__all__ = ["CancelScope", "Cancelled"]

_log = get_logger("steerable.cancel")
_SCOPES_LOCK = threading.Lock()


class Cancelled(Exception):
    """Raised by `CancelScope.raise_if_cancelled()`; carries the first reason given."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CancelScope:
    """A node of the cancellation tree: an event, a deadline, a parent, first reason wins.

    Cancelling a scope cancels all its descendants and runs their callbacks. A child's
    deadline is clamped to its parent's, so `remaining()` never promises more time than the
    run has left (R14). Deadlines are informational here: the timer service enforces them.

    Args:
        deadline: Monotonic deadline in seconds, or None for no deadline of its own.
        parent: The enclosing scope; None for a root.
    """

    __slots__ = ("_callbacks", "_children", "_deadline", "_event", "_lock", "_parent", "_reason")

    _deadline: float | None

    def __init__(self, deadline: float | None = None, parent: CancelScope | None = None) -> None:
        # The Event is made on first use: most scopes (one per call) are never waited on, and
        # `threading.Event()` costs microseconds on the supervisor's hot path.
        self._event: threading.Event | None = None
        # One lock for every scope: each critical section is a few bytecodes, and a lock per
        # scope (two per loop iteration) cost more to allocate than all their uses.
        self._lock = _SCOPES_LOCK
        self._parent = parent
        # Made on first use, like the Event: a call's scope (two per loop iteration) rarely
        # gets a child or a callback, and each empty container is one more object for the
        # collector to track.
        self._children: set[CancelScope] | None = None
        self._callbacks: list[Callable[[str], None]] | None = None
        self._reason: str | None = None
        if parent is not None and parent._deadline is not None:
            deadline = parent._deadline if deadline is None else min(deadline, parent._deadline)
        self._deadline = deadline

    @property
    def cancelled(self) -> bool:
        """Whether this scope (or an ancestor) has been cancelled."""
        return self._reason is not None

    @property
    def event(self) -> threading.Event:
        """A `threading.Event` set on cancellation (for tools that wait on an event)."""
        event = self._event
        if event is None:
            with self._lock:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
                    if self._reason is not None:
                        event.set()
        return event

    @property
    def reason(self) -> str | None:
        """The first reason given to `cancel()`, or None while not cancelled."""
        return self._reason

    @property
    def deadline(self) -> float | None:
        """The monotonic deadline: the earliest along the parent chain, or None."""
        return self._deadline

    def remaining(self, now: float) -> float | None:
        """Seconds left until the deadline at monotonic time `now` (never negative), or None."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - now)

    def child(self, deadline: float | None = None) -> CancelScope:
        """A new scope inside this one; cancelled at once if this one already is."""
        scope = CancelScope(deadline, self)
        with self._lock:
            reason = self._reason
            if reason is None:
                children = self._children
                if children is None:
                    self._children = {scope}
                else:
                    children.add(scope)
        if reason is not None:
            scope.cancel(reason)
        return scope

    def detach(self) -> None:
        """Forget this scope in its parent, so finished work does not pile up in a long run."""
        parent = self._parent
        if parent is not None:
            with parent._lock:
                children = parent._children
                if children is not None:
                    children.discard(self)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel this scope and its descendants. Returns False if it was already cancelled."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            children = self._children
            callbacks = self._callbacks
            self._children = None
            self._callbacks = None
            event = self._event
        if event is not None:
            event.set()
        if callbacks is not None:
            for callback in callbacks:
                _run_callback(callback, reason)
        if children is not None:
            for child in children:  # detached above: nobody changes it any more
                child.cancel(reason)
        return True

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(reason)` once when cancelled (at once if already); returns unregister.

        Tools use this to abort blocking I/O: close a socket, kill a process, end a stream.
        """
        with self._lock:
            reason = self._reason
            if reason is None:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = [callback]
                else:
                    callbacks.append(callback)
        if reason is not None:
            _run_callback(callback, reason)
            return _noop

        def unregister() -> None:
            with self._lock:
                callbacks = self._callbacks
                if callbacks is not None and callback in callbacks:
                    callbacks.remove(callback)

        return unregister

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled` if this scope has been cancelled."""
        if self._reason is not None:
            raise Cancelled(self._reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking at once on cancellation. True if cancelled.

        Tools use this instead of `time.sleep` so that a cancel stops them within microseconds.
        """
        return self.event.wait(timeout)

    def __repr__(self) -> str:
        state = f"cancelled={self._reason!r}" if self._reason is not None else "active"
        return f"<CancelScope {state} deadline={self._deadline}>"


def _noop() -> None:
    return None


def _run_callback(callback: Callable[[str], None], reason: str) -> None:
    # A cancel callback that raises must not stop the others or the cancelling thread (R6:
    # recorded, not swallowed).
    try:
        callback(reason)
    except Exception:  # noqa: BLE001
        _log.warning("cancel_callback_failed", callback=repr(callback), exc_info=True)
