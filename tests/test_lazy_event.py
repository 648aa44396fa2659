"""`LazyEvent` behaves as `threading.Event` (set, clear, wait with and without timeout)."""

from __future__ import annotations

import threading

from steerable.actors._engine.flag import LazyEvent

GUARD = 10.0  # anti-hang bound only


def test_is_an_event_and_starts_clear() -> None:
    event = LazyEvent()
    assert isinstance(event, threading.Event)
    assert not event.is_set()
    assert event.wait(0) is False
    event.set()
    assert event.is_set()
    assert event.isSet()
    assert event.wait() is True
    event.clear()
    assert not event.is_set()
    assert event.wait(0.001) is False


def test_set_wakes_every_waiter() -> None:
    event = LazyEvent()
    waiting = threading.Barrier(5)
    results: list[bool] = []
    lock = threading.Lock()

    def waiter() -> None:
        waiting.wait(GUARD)
        got = event.wait(GUARD)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for thread in threads:
        thread.start()
    waiting.wait(GUARD)  # all four are about to wait (or already do): none may miss the set
    event.set()
    for thread in threads:
        thread.join(GUARD)
    assert results == [True] * 4


def test_no_lost_wakeup_under_races() -> None:
    # A set racing with a wait's first allocation of its condition is never missed.
    for _ in range(300):
        event = LazyEvent()
        go = threading.Barrier(2)

        def setter(e: LazyEvent = event, b: threading.Barrier = go) -> None:
            b.wait(GUARD)
            e.set()

        thread = threading.Thread(target=setter)
        thread.start()
        go.wait(GUARD)
        assert event.wait(GUARD) is True
        thread.join(GUARD)
