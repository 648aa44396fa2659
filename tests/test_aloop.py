"""AsyncRunner: coroutine tools share one event loop thread; outcomes come back via on_done."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from steerable.actors._engine.aloop import AsyncRunner

WAIT = 10.0  # generous fail-instead-of-hang bound for every wait in this file

Outcome = tuple[Any, BaseException | None, str]


class Outcomes:
    """An `on_done` that records (result, exc, thread name) on a thread-safe queue."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Outcome] = queue.SimpleQueue()

    def __call__(self, result: Any, exc: BaseException | None) -> None:
        self.queue.put((result, exc, threading.current_thread().name))

    def get(self) -> Outcome:
        return self.queue.get(timeout=WAIT)


@pytest.fixture
def runner() -> Iterator[AsyncRunner]:
    runner = AsyncRunner()
    try:
        yield runner
    finally:
        runner.shutdown(timeout=WAIT)


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "steerable-asyncio"]


def _never(started: threading.Event | None = None) -> Callable[[], Coroutine[Any, Any, None]]:
    async def wait_forever() -> None:
        if started is not None:
            started.set()
        await asyncio.Event().wait()

    return wait_forever


def test_100_coroutines_run_concurrently_on_one_thread(runner: AsyncRunner) -> None:
    arrived = 0
    all_here = asyncio.Event()  # binds to the runner's loop on first wait
    outcomes = Outcomes()

    def make(i: int) -> Callable[[], Coroutine[Any, Any, int]]:
        async def tool() -> int:
            nonlocal arrived
            arrived += 1  # loop thread only: no lock needed
            if arrived == 100:
                all_here.set()
            await all_here.wait()  # only returns if all 100 are waiting at once
            return i

        return tool

    for i in range(100):
        runner.submit(make(i), outcomes)
    results = [outcomes.get() for _ in range(100)]
    assert sorted(r for r, _, _ in results) == list(range(100))
    assert all(exc is None for _, exc, _ in results)
    assert {name for _, _, name in results} == {"steerable-asyncio"}
    assert len(_loop_threads()) == 1
    assert runner.statistics() == {"tasks_running": 0, "tasks_done": 100}


def test_the_loop_starts_lazily() -> None:
    runner = AsyncRunner(name="steerable-asyncio-lazy")
    assert not [t for t in threading.enumerate() if t.name == "steerable-asyncio-lazy"]
    runner.shutdown(timeout=WAIT)  # a runner never used shuts down too
    with pytest.raises(RuntimeError, match="shut down"):
        runner.submit(_never(), Outcomes())


def test_cancel_delivers_cancelled_error(runner: AsyncRunner) -> None:
    started = threading.Event()
    outcomes = Outcomes()
    handle = runner.submit(_never(started), outcomes)
    assert started.wait(WAIT)
    assert runner.statistics()["tasks_running"] == 1
    handle.cancel()
    result, exc, _ = outcomes.get()
    assert result is None
    assert isinstance(exc, asyncio.CancelledError)
    assert handle.done
    handle.cancel()  # no-op once done
    assert runner.statistics() == {"tasks_running": 0, "tasks_done": 1}


def test_cancel_right_after_submit(runner: AsyncRunner) -> None:
    outcomes = Outcomes()
    handle = runner.submit(_never(), outcomes)
    handle.cancel()
    _, exc, _ = outcomes.get()
    assert isinstance(exc, asyncio.CancelledError)


def test_results_and_errors_go_to_on_done(runner: AsyncRunner) -> None:
    outcomes = Outcomes()

    async def ok() -> str:
        await asyncio.sleep(0)
        return "ok"

    async def fails() -> str:
        raise ValueError("tool bug")

    def bad_factory() -> Coroutine[Any, Any, str]:
        raise TypeError("factory bug")

    runner.submit(ok, outcomes)
    assert outcomes.get()[:2] == ("ok", None)
    runner.submit(fails, outcomes)
    result, exc, _ = outcomes.get()
    assert result is None
    assert isinstance(exc, ValueError)
    runner.submit(bad_factory, outcomes)
    result, exc, _ = outcomes.get()
    assert result is None
    assert isinstance(exc, TypeError)


@pytest.mark.parametrize("error", [SystemExit(2), KeyboardInterrupt()], ids=repr)
def test_a_coroutine_raising_base_exception_does_not_kill_the_loop(
    runner: AsyncRunner, error: BaseException
) -> None:
    outcomes = Outcomes()

    async def exits() -> None:
        raise error

    async def ok() -> int:
        return 1

    runner.submit(exits, outcomes)
    result, exc, _ = outcomes.get()
    assert result is None
    assert exc is error
    runner.submit(ok, outcomes)
    assert outcomes.get()[:2] == (1, None)


@pytest.mark.parametrize("error", [RuntimeError("hook bug"), SystemExit(1)], ids=repr)
def test_on_done_raising_does_not_kill_the_loop(runner: AsyncRunner, error: BaseException) -> None:
    async def ok() -> int:
        return 1

    def broken(result: int | None, exc: BaseException | None) -> None:
        raise error

    runner.submit(ok, broken)
    outcomes = Outcomes()
    runner.submit(ok, outcomes)
    assert outcomes.get()[:2] == (1, None)
    assert runner.statistics()["tasks_done"] == 2


def test_shutdown_cancels_running_tasks_and_joins_the_thread() -> None:
    runner = AsyncRunner()
    outcomes = Outcomes()
    started = [threading.Event() for _ in range(5)]
    for event in started:
        runner.submit(_never(event), outcomes)
    for event in started:
        assert event.wait(WAIT)
    (thread,) = _loop_threads()
    runner.shutdown(timeout=WAIT)
    assert not thread.is_alive()
    assert not _loop_threads()
    for _ in started:
        result, exc, _ = outcomes.get()
        assert result is None
        assert isinstance(exc, asyncio.CancelledError)
    assert runner.statistics() == {"tasks_running": 0, "tasks_done": 5}
    runner.shutdown(timeout=WAIT)  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        runner.submit(_never(), outcomes)


def test_shutdown_from_on_done_does_not_deadlock() -> None:
    runner = AsyncRunner()
    loop_thread: queue.SimpleQueue[threading.Thread] = queue.SimpleQueue()

    async def ok() -> int:
        return 1

    def stop_runner(result: int | None, exc: BaseException | None) -> None:
        runner.shutdown(timeout=WAIT)  # on the loop thread: must not join itself
        loop_thread.put(threading.current_thread())

    runner.submit(ok, stop_runner)
    thread = loop_thread.get(timeout=WAIT)
    thread.join(WAIT)
    assert not thread.is_alive()
    runner.shutdown(timeout=WAIT)


def _block_loop(runner: AsyncRunner) -> tuple[threading.Event, threading.Event]:
    """Hold the loop thread in a callback until `release` is set; `entered` once it is held."""
    entered, release = threading.Event(), threading.Event()

    async def hold() -> None:
        entered.set()
        release.wait(WAIT)  # blocks the loop on purpose: submits pile up meanwhile

    runner.submit(hold, lambda _result, _exc: None)
    assert entered.wait(WAIT)
    return entered, release


def test_submits_made_while_the_loop_is_busy_are_taken_in_one_wake(runner: AsyncRunner) -> None:
    _, release = _block_loop(runner)
    outcomes = Outcomes()
    order: list[int] = []

    def make(i: int) -> Callable[[], Coroutine[Any, Any, int]]:
        async def record() -> int:
            order.append(i)
            return i

        return record

    for i in range(200):
        runner.submit(make(i), outcomes)
    assert len(runner._pending) == 200  # none taken yet: the loop is held
    release.set()
    results = sorted(outcomes.get()[0] for _ in range(200))
    assert results == list(range(200))
    assert order == list(range(200))  # tasks start in submit order
    assert runner._pending == []


def test_shutdown_cancels_submits_the_loop_has_not_taken_yet() -> None:
    runner = AsyncRunner()
    _, release = _block_loop(runner)
    outcomes = Outcomes()
    for _ in range(10):
        runner.submit(_never(), outcomes)
    release.set()
    assert runner.shutdown(timeout=WAIT) == []
    for _ in range(10):
        result, exc, _ = outcomes.get()
        assert result is None
        assert isinstance(exc, asyncio.CancelledError)
    assert runner.statistics() == {"tasks_running": 0, "tasks_done": 11}


def test_a_cancel_before_the_loop_takes_the_submit_is_honoured(runner: AsyncRunner) -> None:
    _, release = _block_loop(runner)
    outcomes = Outcomes()
    handle = runner.submit(_never(), outcomes)
    handle.cancel()
    release.set()
    result, exc, _ = outcomes.get()
    assert result is None
    assert isinstance(exc, asyncio.CancelledError)
    assert handle.done
