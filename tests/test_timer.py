"""TimerService: deadline order, cancel, errors contained, never early, stop, no leaks."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from steerable.actors._engine.clock import ManualClock, SystemClock
from steerable.actors._engine.timer import TimerService

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=0.0)


@pytest.fixture
def timers(clock: ManualClock) -> Iterator[TimerService]:
    service = TimerService(clock)
    service.start()
    try:
        yield service
    finally:
        service.stop()


def recorder(log: list[str], name: str) -> Callable[[], None]:
    def callback() -> None:
        log.append(name)

    return callback


def test_fires_in_deadline_order(clock: ManualClock, timers: TimerService) -> None:
    fired: list[str] = []
    timers.schedule(3.0, recorder(fired, "c"))
    timers.schedule(1.0, recorder(fired, "a"))
    timers.schedule_at(2.0, recorder(fired, "b"))
    clock.advance(5.0)
    assert timers.wait_idle(GUARD)
    assert fired == ["a", "b", "c"]
    assert timers.statistics() == {"timers_pending": 0, "timers_fired": 3, "timers_cancelled": 0}


def test_ties_fire_in_schedule_order(clock: ManualClock, timers: TimerService) -> None:
    fired: list[str] = []
    for name in "abcdefgh":
        timers.schedule(1.0, recorder(fired, name))
    clock.advance(1.0)
    assert timers.wait_idle(GUARD)
    assert fired == list("abcdefgh")


def test_manual_clock_never_fires_early(clock: ManualClock, timers: TimerService) -> None:
    fired: list[str] = []
    timers.schedule(1.0, recorder(fired, "one"))
    timers.schedule(2.0, recorder(fired, "two"))
    clock.advance(0.5)
    assert timers.wait_idle(GUARD)
    assert fired == []
    clock.advance(0.25)
    clock.advance(0.125)
    assert timers.wait_idle(GUARD)
    assert fired == []
    clock.advance(0.125)  # exactly at the first deadline: due
    assert timers.wait_idle(GUARD)
    assert fired == ["one"]
    assert timers.statistics()["timers_pending"] == 1
    clock.advance(10.0)  # one jump fires everything due
    assert timers.wait_idle(GUARD)
    assert fired == ["one", "two"]


def test_nonpositive_delay_fires_without_advance(timers: TimerService) -> None:
    done = threading.Event()
    timers.schedule(0.0, done.set)
    timers.schedule(-5.0, lambda: None)
    assert done.wait(GUARD)
    assert timers.wait_idle(GUARD)
    assert timers.statistics()["timers_fired"] == 2


def test_callback_sees_clock_at_or_after_deadline(clock: ManualClock) -> None:
    service = TimerService(clock)
    seen: list[float] = []
    handle = service.schedule(2.5, lambda: seen.append(clock.now()))
    service.start()
    try:
        for _ in range(5):
            clock.advance(0.5)
            assert service.wait_idle(GUARD)
        assert seen == [2.5]
        assert handle.deadline == 2.5
        assert not handle.pending
    finally:
        service.stop()


def test_cancel(clock: ManualClock, timers: TimerService) -> None:
    fired: list[str] = []
    keep = timers.schedule(1.0, recorder(fired, "keep"))
    drop = timers.schedule(1.0, recorder(fired, "drop"))
    assert drop.cancel() is True
    assert drop.cancel() is False  # already cancelled
    clock.advance(1.0)
    assert timers.wait_idle(GUARD)
    assert fired == ["keep"]
    assert keep.cancel() is False  # already fired
    assert timers.statistics() == {"timers_pending": 0, "timers_fired": 1, "timers_cancelled": 1}


def test_cancel_from_a_callback_stops_a_later_timer(
    clock: ManualClock, timers: TimerService
) -> None:
    fired: list[str] = []
    later = timers.schedule(2.0, recorder(fired, "later"))
    timers.schedule(1.0, lambda: fired.append(f"cancelled={later.cancel()}"))
    clock.advance(5.0)
    assert timers.wait_idle(GUARD)
    assert fired == ["cancelled=True"]


def test_raising_callbacks_are_logged_and_the_service_goes_on(
    clock: ManualClock, timers: TimerService
) -> None:
    fired: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    def exit_() -> None:
        raise SystemExit(3)

    def interrupt() -> None:
        raise KeyboardInterrupt

    timers.schedule(1.0, boom)
    timers.schedule(1.0, exit_)
    timers.schedule(1.0, interrupt)
    timers.schedule(1.0, recorder(fired, "after"))
    with capture_logs() as logs:
        clock.advance(1.0)
        assert timers.wait_idle(GUARD)
    assert fired == ["after"]
    failures = [entry for entry in logs if entry["event"] == "timer_callback_failed"]
    assert len(failures) == 3
    assert all(entry["log_level"] == "error" for entry in failures)
    # The thread survived: later timers still fire.
    timers.schedule(1.0, recorder(fired, "later"))
    clock.advance(1.0)
    assert timers.wait_idle(GUARD)
    assert fired == ["after", "later"]


def test_stop_joins_the_thread_and_drops_pending_timers(clock: ManualClock) -> None:
    service = TimerService(clock, name="steerable-timer-stoptest")
    service.start()
    service.start()  # idempotent
    fired: list[str] = []
    handle = service.schedule(1.0, recorder(fired, "never"))
    assert any(t.name == "steerable-timer-stoptest" for t in threading.enumerate())
    service.stop()
    assert not any(t.name == "steerable-timer-stoptest" for t in threading.enumerate())
    service.stop()  # idempotent
    clock.advance(5.0)
    assert fired == []
    assert service.statistics()["timers_pending"] == 0
    assert handle.cancel() is True  # it never fired
    with pytest.raises(RuntimeError):
        service.schedule(1.0, recorder(fired, "late"))
    with pytest.raises(RuntimeError):
        service.schedule_at(1.0, recorder(fired, "late"))
    with pytest.raises(RuntimeError):
        service.start()


def test_stop_from_a_callback_does_not_deadlock(clock: ManualClock) -> None:
    service = TimerService(clock)
    service.start()
    try:
        service.schedule(0.0, service.stop)
        assert service.wait_idle(GUARD)
    finally:
        service.stop()


def test_heap_is_compacted_after_many_cancels(clock: ManualClock, timers: TimerService) -> None:
    keep = [timers.schedule(1_000.0 + i, lambda: None) for i in range(10)]
    handles = [timers.schedule(10.0 + i * 0.001, lambda: None) for i in range(10_000)]
    for handle in handles:
        assert handle.cancel()
    # Internal check: lazy deletion must not keep thousands of dead entries alive.
    assert len(timers._heap) <= 2 * len(keep)
    stats = timers.statistics()
    assert stats["timers_pending"] == 10
    assert stats["timers_cancelled"] == 10_000
    clock.advance(2_000.0)
    assert timers.wait_idle(GUARD)
    assert timers.statistics()["timers_fired"] == 10
    assert not timers._heap


def test_wait_idle_is_false_when_due_timers_cannot_fire(clock: ManualClock) -> None:
    service = TimerService(clock)  # never started
    try:
        service.schedule(0.0, lambda: None)
        assert service.wait_idle(0.05) is False
    finally:
        service.stop()


def test_wait_idle_waits_for_a_running_callback(clock: ManualClock, timers: TimerService) -> None:
    entered = threading.Event()
    release = threading.Event()

    def slow() -> None:
        entered.set()
        release.wait(GUARD)

    timers.schedule(0.0, slow)
    assert entered.wait(GUARD)
    assert timers.wait_idle(0.01) is False  # the callback is still running
    release.set()
    assert timers.wait_idle(GUARD)


def test_system_clock_fires_at_or_after_the_deadline() -> None:
    clock = SystemClock()
    service = TimerService(clock)
    service.start()
    try:
        results: list[tuple[float, float]] = []
        done = threading.Event()
        count = 20

        def make(deadline: float) -> Callable[[], None]:
            def callback() -> None:
                results.append((deadline, clock.now()))
                if len(results) == count:
                    done.set()

            return callback

        base = clock.now()
        for i in range(count):
            deadline = base + 0.005 + i * 0.001
            service.schedule_at(deadline, make(deadline))
        assert done.wait(GUARD)
        assert [d for d, _ in results] == sorted(d for d, _ in results)
        assert all(fired_at >= deadline for deadline, fired_at in results)
    finally:
        service.stop()


@pytest.mark.parametrize("far", [1e12, math.inf])
def test_a_far_deadline_does_not_stop_the_thread(far: float) -> None:
    # A wait longer than the platform allows raised OverflowError in the timer thread, which
    # then died: every later timer of the runtime (timeouts, retries, grace) never fired.
    clock = SystemClock()
    service = TimerService(clock)
    service.start()
    try:
        service.schedule_at(clock.now() + far, lambda: None)
        fired = threading.Event()
        # Scheduled after the thread went to sleep toward the far deadline: it must wake.
        assert service.wait_idle(GUARD)
        service.schedule(0.0, fired.set)
        assert fired.wait(GUARD)
        assert service.statistics()["timers_pending"] == 1
    finally:
        service.stop()
