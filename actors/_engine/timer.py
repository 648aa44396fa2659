"""One timer thread per runtime: a heap of deadlines, never a thread per timer (docs/pykka.md T4).

pykka has no timers, and `ask(timeout=)` only bounds a waiting thread. Supervisors never
block (T2), so every timeout, deadline and retry backoff is a callback scheduled here that
tells a message to an actor (`ref.tell(StepTimeout(...))`); the actor ignores stale ones by id.

Time comes from the injected `Clock`: with a `ManualClock` the service wakes on `advance()`
through `Clock.subscribe` and fires exactly what is due, so tests never sleep.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable

from .clock import Clock
from .log import get_logger

__all__ = ["TimerHandle", "TimerService"]

_log = get_logger("steerable.timer")

_PENDING = 0
_FIRED = 1
_CANCELLED = 2

# The longest single wait: a deadline further out (a huge timeout, `inf`) is waited for in
# steps, since a wait past the platform's limit raises OverflowError and would end the thread.
_MAX_WAIT = 3600.0


class TimerHandle:
    """A scheduled callback; `cancel()` it when the awaited thing happened first.

    Cancelling is lazy: the heap entry stays until it reaches the top or the heap is
    compacted, so cancel is O(1) amortised even with thousands of timers.
    """

    __slots__ = ("_callback", "_deadline", "_service", "_state")

    def __init__(
        self, service: TimerService, deadline: float, callback: Callable[[], None]
    ) -> None:
        self._service = service
        self._deadline = deadline
        self._callback: Callable[[], None] | None = callback
        self._state = _PENDING

    @property
    def deadline(self) -> float:
        """The monotonic deadline on the service's clock, in seconds."""
        return self._deadline

    @property
    def pending(self) -> bool:
        """True until the timer fires or is cancelled."""
        return self._state == _PENDING

    def cancel(self) -> bool:
        """Cancel the timer. Returns True if it had not fired (nor been cancelled) yet."""
        return self._service._cancel(self)

    def __repr__(self) -> str:
        state = ("pending", "fired", "cancelled")[self._state]
        return f"<TimerHandle {state} deadline={self._deadline}>"


class TimerService:
    """Fires callbacks at monotonic deadlines on one daemon thread.

    Callbacks run on the timer thread in deadline order (ties in schedule order) and must be
    quick: they tell a message to an actor and return. One that raises is logged and the
    service goes on; nothing a callback raises can kill the thread.

    Args:
        clock: Where time comes from; a `ManualClock` makes the service fire only on
            `advance()`.
        name: The thread's name (default "steerable-timer"), so leak checks and stack dumps
            read themselves.
    """

    def __init__(self, clock: Clock, *, name: str = "steerable-timer") -> None:
        self._clock = clock
        self._name = name
        # Hot paths take the bare lock (C-level); the condition wraps the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._cancelled_in_heap = 0
        self._fired = 0
        self._cancelled = 0
        self._running_callback = False
        # The deadline the thread sleeps toward (inf: none, or not sleeping); only a new
        # earlier timer needs to wake it, which keeps schedule/cancel pairs off its back.
        self._sleeping_until = math.inf
        self._idle_waiters = 0
        self._started = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Start the timer thread. Idempotent; raises RuntimeError once stopped."""
        with self._cond:
            if self._stopped:
                raise RuntimeError("TimerService is stopped and cannot be restarted")
            if self._started:
                return
            self._started = True
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread = thread
        # Subscribe outside our lock: the clock calls back into `_on_clock_jump`, which takes it.
        self._unsubscribe = self._clock.subscribe(self._on_clock_jump)
        thread.start()

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether `thread` is this service's timer thread."""
        return thread is self._thread

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and join it (up to `timeout` seconds); pending timers are dropped.

        Idempotent. A callback that is running finishes first. `schedule()` afterwards raises
        RuntimeError. Called from a timer callback, it does not join its own thread.
        """
        with self._cond:
            self._stopped = True
            dropped = [entry[2] for entry in self._heap]
            self._heap.clear()
            self._cancelled_in_heap = 0
            self._cond.notify_all()
            thread = self._thread
        for handle in dropped:
            # Release what the callbacks captured (actor refs, messages) at once.
            handle._callback = None
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def schedule(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Call `callback` on the timer thread `delay` seconds from now (<= 0: at once)."""
        return self._push(self._clock.now() + max(delay, 0.0), callback)

    def schedule_at(self, deadline: float, callback: Callable[[], None]) -> TimerHandle:
        """Call `callback` on the timer thread at monotonic `deadline` on the service's clock."""
        return self._push(deadline, callback)

    def statistics(self) -> dict[str, int]:
        """Counters: `timers_pending`, `timers_fired`, `timers_cancelled`."""
        with self._cond:
            return {
                "timers_pending": len(self._heap) - self._cancelled_in_heap,
                "timers_fired": self._fired,
                "timers_cancelled": self._cancelled,
            }

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Test helper: wait until no due timer is pending and no callback is running.

        "Due" means a deadline at or before `clock.now()`, so after `ManualClock.advance()`
        this returns once everything the advance made due has fired. Returns False if that
        did not happen within `timeout` real seconds (for instance, the service never
        started).
        """
        with self._cond:
            self._idle_waiters += 1
            try:
                return self._cond.wait_for(self._idle, timeout)
            finally:
                self._idle_waiters -= 1

    def _idle(self) -> bool:
        # Called with the lock held.
        if self._stopped:
            return True
        if self._running_callback:
            return False
        self._discard_cancelled_head()
        return not self._heap or self._heap[0][0] > self._clock.now()

    def _push(self, deadline: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(self, deadline, callback)
        with self._lock:
            if self._stopped:
                raise RuntimeError("TimerService is stopped")
            entry = (deadline, next(self._seq), handle)
            heapq.heappush(self._heap, entry)
            if deadline < self._sleeping_until:
                # A new earliest deadline: the thread may be waiting for a later one.
                self._sleeping_until = deadline
                self._cond.notify_all()
        return handle

    def _cancel(self, handle: TimerHandle) -> bool:
        with self._lock:
            if handle._state != _PENDING:
                return False
            handle._state = _CANCELLED
            handle._callback = None
            self._cancelled += 1
            if self._stopped:
                return True
            self._cancelled_in_heap += 1
            if self._cancelled_in_heap * 2 > len(self._heap):
                # Lazy deletion must not leak: rebuild once the dead outnumber the living.
                self._heap = [e for e in self._heap if e[2]._state == _PENDING]
                heapq.heapify(self._heap)
                self._cancelled_in_heap = 0
            if self._idle_waiters:
                # wait_idle() may be waiting on a due timer that is now gone.
                self._cond.notify_all()
        return True

    def _discard_cancelled_head(self) -> None:
        heap = self._heap
        while heap and heap[0][2]._state != _PENDING:
            heapq.heappop(heap)
            self._cancelled_in_heap -= 1

    def _on_clock_jump(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            callback = self._next_due()
            if callback is None:
                return
            try:
                callback()
            except BaseException:  # noqa: BLE001 - nothing a callback raises may kill the thread
                _log.error("timer_callback_failed", callback=repr(callback), exc_info=True)
            finally:
                with self._cond:
                    self._running_callback = False
                    if self._idle_waiters:
                        self._cond.notify_all()

    def _next_due(self) -> Callable[[], None] | None:
        """Block until a timer is due and claim it; None once stopped."""
        with self._cond:
            while not self._stopped:
                self._discard_cancelled_head()
                if not self._heap:
                    self._sleeping_until = math.inf
                    self._cond.wait()
                    continue
                # Read the clock under the lock: a ManualClock's advance() notifies through
                # `_on_clock_jump`, which needs this lock, so its wake-up cannot be lost.
                # Firing is decided against clock.now() only, never by a wait that timed out,
                # so a timer never fires early whatever clock is injected.
                now = self._clock.now()
                deadline, _, handle = self._heap[0]
                if deadline > now:
                    self._sleeping_until = deadline
                    self._cond.wait(min(deadline - now, _MAX_WAIT))
                    self._sleeping_until = math.inf
                    continue
                heapq.heappop(self._heap)
                callback = handle._callback
                handle._state = _FIRED
                handle._callback = None
                self._fired += 1
                self._running_callback = True
                self._sleeping_until = math.inf
                assert callback is not None
                return callback
            return None
