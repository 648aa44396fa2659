"""CancelScope (the cancellation tree, R18/T5) and ManualClock."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from steerable.actors._engine.cancel import Cancelled, CancelScope
from steerable.actors._engine.clock import ManualClock, SystemClock

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation


def test_first_reason_wins() -> None:
    scope = CancelScope()
    initial = (scope.cancelled, scope.reason)  # read once: mypy would keep them narrowed
    assert initial == (False, None)
    scope.raise_if_cancelled()  # no-op while active
    assert scope.cancel("user") is True
    assert scope.cancel("timeout") is False
    assert scope.cancelled
    assert scope.reason == "user"
    with pytest.raises(Cancelled) as caught:
        scope.raise_if_cancelled()
    assert caught.value.reason == "user"
    assert "cancelled='user'" in repr(scope)


def test_cancel_propagates_to_descendants_not_ancestors() -> None:
    root = CancelScope()
    step = root.child()
    call = step.child()
    sibling = root.child()
    step.cancel("steer")
    assert step.cancelled
    assert call.cancelled
    assert call.reason == "steer"
    assert not root.cancelled
    assert not sibling.cancelled
    root.cancel("run cancelled")
    assert sibling.reason == "run cancelled"
    assert call.reason == "steer"  # first reason still wins


def test_child_of_a_cancelled_scope_is_cancelled() -> None:
    root = CancelScope()
    root.cancel("gone")
    child = root.child()
    assert child.cancelled
    assert child.reason == "gone"


def test_deadline_is_clamped_to_the_parent() -> None:
    root = CancelScope(deadline=100.0)
    assert root.child().deadline == 100.0
    assert root.child(deadline=50.0).deadline == 50.0
    assert root.child(deadline=500.0).deadline == 100.0
    grandchild = root.child(deadline=80.0).child(deadline=90.0)
    assert grandchild.deadline == 80.0
    assert CancelScope().child(deadline=7.0).deadline == 7.0
    assert CancelScope().deadline is None


def test_remaining() -> None:
    scope = CancelScope(deadline=10.0)
    assert scope.remaining(4.0) == 6.0
    assert scope.remaining(10.0) == 0.0
    assert scope.remaining(12.0) == 0.0  # never negative
    assert CancelScope().remaining(4.0) is None


def test_on_cancel_runs_once_with_the_reason() -> None:
    scope = CancelScope()
    seen: list[str] = []
    scope.on_cancel(seen.append)
    scope.cancel("first")
    scope.cancel("second")
    assert seen == ["first"]


def test_on_cancel_runs_at_once_when_already_cancelled() -> None:
    scope = CancelScope()
    scope.cancel("done")
    seen: list[str] = []
    unregister = scope.on_cancel(seen.append)
    assert seen == ["done"]
    unregister()  # harmless


def test_unregister() -> None:
    scope = CancelScope()
    seen: list[str] = []
    unregister = scope.on_cancel(seen.append)
    unregister()
    unregister()  # idempotent
    scope.cancel("x")
    assert seen == []


def test_a_raising_callback_does_not_stop_the_others() -> None:
    scope = CancelScope()
    child = scope.child()
    seen: list[str] = []

    def boom(reason: str) -> None:
        raise RuntimeError(reason)

    scope.on_cancel(boom)
    scope.on_cancel(seen.append)
    child.on_cancel(lambda reason: seen.append(f"child:{reason}"))
    with capture_logs() as logs:
        assert scope.cancel("r") is True
    assert seen == ["r", "child:r"]
    assert [e["event"] for e in logs] == ["cancel_callback_failed"]
    assert child.cancelled


def test_detach_stops_propagation_to_that_child() -> None:
    root = CancelScope()
    finished = root.child()
    finished.detach()
    finished.detach()  # idempotent
    CancelScope().detach()  # a root has nothing to detach from
    root.cancel("late")
    assert not finished.cancelled


def test_wait_returns_true_promptly_on_cancel_from_another_thread() -> None:
    scope = CancelScope()
    waiting = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        waiting.set()
        result.append(scope.wait(GUARD))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(GUARD)
    scope.cancel("stop")
    thread.join(GUARD)
    assert not thread.is_alive()
    assert result == [True]


def test_wait_times_out_false_when_not_cancelled() -> None:
    assert CancelScope().wait(0) is False


def test_manual_clock_advance_and_subscribers() -> None:
    clock = ManualClock(start=5.0, wall_start=1_000.0)
    assert clock.now() == 5.0
    assert clock.wall() == 1_000.0
    calls: list[float] = []
    unsubscribe = clock.subscribe(lambda: calls.append(clock.now()))
    clock.advance(2.5)
    assert clock.now() == 7.5
    assert clock.wall() == 1_002.5
    clock.advance(0)
    assert calls == [7.5, 7.5]
    unsubscribe()
    unsubscribe()  # idempotent
    clock.advance(1.0)
    assert calls == [7.5, 7.5]


def test_manual_clock_never_goes_back() -> None:
    clock = ManualClock()
    before = clock.now()
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-0.001)
    assert clock.now() == before


def test_system_clock() -> None:
    clock = SystemClock()
    first = clock.now()
    assert clock.now() >= first
    assert clock.wall() > 1_600_000_000
    clock.subscribe(lambda: None)()  # a no-op subscription, unsubscribed
