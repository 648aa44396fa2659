"""The async face's host threads (HostIO) and await_future: what the event loop is spared.

Real threads and loops; synchronised on events and futures, never on sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any

import pytest

from steerable.actors import MemoryStore, Runtime
from steerable.actors._host.offload import HostIO, await_future
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import Finish, RunState

WAIT = 10.0  # generous fail-instead-of-hang bound


def _host_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("test-host"))


def test_operations_run_on_host_threads_and_shutdown_joins_them() -> None:
    io = HostIO(max_threads=2, name="test-host")
    assert _host_threads() == []  # lazy: nothing until first use
    ran_on = io.submit(lambda: threading.current_thread().name).result(WAIT)
    assert ran_on.startswith("test-host")
    io.shutdown()
    assert _host_threads() == []


def test_at_most_max_threads_run_at_once_and_all_queued_work_runs() -> None:
    io = HostIO(max_threads=2, name="test-host")
    gate = threading.Event()
    inside = threading.Semaphore(0)
    running = 0
    peak = 0
    lock = threading.Lock()

    def job(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        inside.release()
        gate.wait(WAIT)
        with lock:
            running -= 1
        return i

    futures = [io.submit(functools.partial(job, i)) for i in range(6)]
    assert inside.acquire(timeout=WAIT)
    assert inside.acquire(timeout=WAIT)
    assert io.statistics()["threads"] == 2
    gate.set()
    assert [f.result(WAIT) for f in futures] == list(range(6))
    assert peak == 2
    io.shutdown()


def test_start_starts_every_thread_up_front() -> None:
    io = HostIO(max_threads=3, name="test-host")
    io.start()
    assert len(_host_threads()) == 3
    io.start()  # idempotent
    assert len(_host_threads()) == 3
    io.shutdown()
    assert _host_threads() == []


def test_once_every_thread_runs_submit_takes_no_lock() -> None:
    # The loop must never block on a lock a host thread holds (docs/host.md "Keeping the
    # loop free"): with every thread started, a submit is a bare queue put.
    io = HostIO(max_threads=2, name="test-host")
    io.start()
    with io._lock:  # a host thread holding the lock cannot delay the submit
        future = io.submit(lambda: 42)
    assert future.result(WAIT) == 42
    io.shutdown()


def test_a_job_queued_behind_shutdowns_markers_still_runs() -> None:
    # A lock-free submit that races shutdown() lands behind the end-of-work markers:
    # shutdown runs it rather than leave its awaiting task waiting forever.
    io = HostIO(max_threads=1, name="test-host")
    io.start()
    io.shutdown()
    late: concurrent.futures.Future[int] = concurrent.futures.Future()
    io._jobs.put((late, lambda: 7, (), {}))  # as the racing put would leave it
    io.shutdown()
    assert late.result(0) == 7


def test_a_job_cancelled_before_it_starts_never_runs() -> None:
    io = HostIO(max_threads=1, name="test-host")
    gate = threading.Event()
    started = threading.Event()

    def block() -> None:
        started.set()
        gate.wait(WAIT)

    ran: list[int] = []
    first = io.submit(block)
    assert started.wait(WAIT)
    second = io.submit(lambda: ran.append(1))
    assert second.cancel()
    gate.set()
    first.result(WAIT)
    io.shutdown()
    assert ran == []


def test_errors_reach_the_caller_and_the_thread_lives_on() -> None:
    io = HostIO(max_threads=1, name="test-host")

    def fail() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        io.submit(fail).result(WAIT)
    assert io.submit(lambda: 7).result(WAIT) == 7
    io.shutdown()


def test_after_shutdown_work_runs_inline_on_the_caller() -> None:
    io = HostIO(max_threads=1, name="test-host")
    io.shutdown()
    assert io.submit(lambda: threading.current_thread().name).result(0) == (
        threading.current_thread().name
    )
    assert _host_threads() == []


def test_max_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_threads"):
        HostIO(max_threads=0)


def test_await_future_returns_a_done_future_without_yielding_to_the_loop() -> None:
    async def main() -> None:
        other_ran = False

        async def other() -> None:
            nonlocal other_ran
            other_ran = True

        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        done.set_result(3)
        task = asyncio.create_task(other())
        assert await await_future(done) == 3
        assert not other_ran  # no suspension: no trip through the loop's self-pipe
        failed: concurrent.futures.Future[int] = concurrent.futures.Future()
        failed.set_exception(KeyError("k"))
        with pytest.raises(KeyError):
            await await_future(failed)
        await task

    asyncio.run(main())


def test_await_future_waits_for_a_pending_future_and_cancelling_cancels_it() -> None:
    async def main() -> None:
        pending: concurrent.futures.Future[int] = concurrent.futures.Future()
        threading.Thread(target=pending.set_result, args=(5,)).start()
        assert await await_future(pending) == 5
        never: concurrent.futures.Future[int] = concurrent.futures.Future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(await_future(never), 0.01)
        assert never.cancelled()

    asyncio.run(main())


def test_the_loop_starts_no_host_thread_while_it_serves(monkeypatch: Any) -> None:
    """`async with Runtime(...)` starts the host threads up front; the loop then only queues."""
    started_on: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("steerable-host"):
            started_on.append(threading.current_thread().name)
        real_start(self)

    async def main() -> None:
        async with Runtime(store=MemoryStore()) as rt:
            loop_thread = threading.current_thread().name
            entered = list(started_on)
            handles = await asyncio.gather(
                *(rt.astart(f"t{i}", agent=ScriptedAgent([Finish(output="ok")])) for i in range(8))
            )
            outcomes = [await h.wait() for h in handles]
            assert all(o.state is RunState.FINISHED for o in outcomes)
            assert await handles[0].wait() is outcomes[0]  # done: returned at once
            assert started_on == entered, "a host thread was started while the loop served"
            assert entered.count(loop_thread) == len(entered) > 0

    monkeypatch.setattr(threading.Thread, "start", start)
    asyncio.run(main())
