"""WorkerPool: one shared queue, bounded threads, abandoned workers, contained failures."""

from __future__ import annotations

import asyncio
import gc
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest

from steerable.actors._engine.clock import SystemClock
from steerable.actors._engine.pool import Job, ToolWorker, WorkerPool

WAIT = 10.0  # generous fail-instead-of-hang bound for every wait in this file


class Call:
    """A job that records the thread it ran on and optionally blocks on a gate first."""

    def __init__(
        self,
        done: queue.SimpleQueue[Call] | None = None,
        gate: threading.Event | None = None,
        action: Callable[[], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        self.done = done
        self.on_cancel = on_cancel
        self.gate = gate
        self.action = action
        self.started = threading.Event()
        self.finished = threading.Event()
        self.thread: threading.Thread | None = None
        self.cancelled = False

    def run(self) -> None:
        self.thread = threading.current_thread()
        self.started.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(WAIT), "gate never opened"
            if self.action is not None:
                self.action()
        finally:
            self.finished.set()
            if self.done is not None:
                self.done.put(self)

    def cancel_pending(self) -> None:
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel()


@pytest.fixture
def pools() -> Iterator[Callable[..., WorkerPool]]:
    """Make pools that are always shut down (and whose hung jobs the test released)."""
    made: list[WorkerPool] = []

    def make(**kwargs: Any) -> WorkerPool:
        pool = WorkerPool(**kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        assert pool.shutdown(timeout=WAIT) == []


def _worker_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("ToolWorker-")}


def test_jobs_run_on_named_daemon_worker_threads(pools: Callable[..., WorkerPool]) -> None:
    pool = pools()
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    calls = [Call(done) for _ in range(5)]
    for call in calls:
        assert pool.submit(call)
    finished = {id(done.get(timeout=WAIT)) for _ in calls}
    assert finished == {id(c) for c in calls}
    for call in calls:
        assert call.thread is not None
        assert call.thread.name.startswith("ToolWorker-")
        assert call.thread.daemon
    assert pool.statistics()["jobs_run"] == 5


def test_worker_uses_a_simple_queue_inbox(pools: Callable[..., WorkerPool]) -> None:
    # W1: the C SimpleQueue inbox saves 6-9 µs per iteration; pin the private hook.
    pool = pools(prestart=1)
    pool.start()
    (ref,) = pykka.ActorRegistry.get_by_class(ToolWorker)
    assert isinstance(ref.actor_inbox, queue.SimpleQueue)


def test_100_blocking_jobs_run_concurrently(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=100)
    barrier = threading.Barrier(100, timeout=WAIT)
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()

    def meet() -> None:
        barrier.wait()

    calls = [Call(done, action=meet) for _ in range(100)]
    for call in calls:
        assert pool.submit(call)
    for _ in calls:
        done.get(timeout=WAIT)
    assert not barrier.broken, "fewer than 100 jobs ran at once"
    assert pool.statistics()["threads_started"] == 100


def test_max_workers_caps_concurrency(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=10)
    gate = threading.Event()
    lock = threading.Lock()
    running = 0
    peak = 0
    started: queue.SimpleQueue[int] = queue.SimpleQueue()

    def track() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        started.put(1)
        assert gate.wait(WAIT)
        with lock:
            running -= 1

    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    calls = [Call(done, action=track) for _ in range(50)]
    for call in calls:
        assert pool.submit(call)
    for _ in range(10):
        started.get(timeout=WAIT)
    stats = pool.statistics()
    assert stats["workers_live"] == 10
    assert stats["jobs_queued"] == 40
    gate.set()
    for _ in calls:
        done.get(timeout=WAIT)
    assert peak == 10
    assert pool.statistics()["threads_started"] == 10


def test_a_free_worker_takes_queued_work_while_another_is_stuck(
    pools: Callable[..., WorkerPool],
) -> None:
    # W2: with one shared queue, a decide request never waits behind one slow tool.
    pool = pools(max_workers=2)
    slow_gate, short_gate = threading.Event(), threading.Event()
    slow = Call(gate=slow_gate)
    short = Call(gate=short_gate)
    assert pool.submit(slow)
    assert pool.submit(short)
    assert slow.started.wait(WAIT)
    assert short.started.wait(WAIT)
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    queued = [Call(done) for _ in range(3)]
    for call in queued:
        assert pool.submit(call)
    assert pool.statistics()["jobs_queued"] == 3
    short_gate.set()
    for call in queued:
        assert done.get(timeout=WAIT) is call  # FIFO, all on the free worker
        assert call.thread is short.thread
    assert not slow.finished.is_set()
    slow_gate.set()
    assert slow.finished.wait(WAIT)


def test_workers_are_reused(pools: Callable[..., WorkerPool]) -> None:
    pool = pools()
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    for _ in range(1_000):
        assert pool.submit(Call(done))
        done.get(timeout=WAIT)
    stats = pool.statistics()
    assert stats["threads_started"] <= 2
    assert stats["jobs_run"] == 1_000
    assert stats["workers_idle"] == stats["workers_live"]


def test_prestart_starts_idle_workers(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=8, prestart=4)
    pool.start()
    pool.start()  # idempotent
    assert pool.statistics()["workers_idle"] == 4
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    gate = threading.Event()
    calls = [Call(done, gate=gate) for _ in range(4)]
    for call in calls:
        assert pool.submit(call)
    gate.set()
    for _ in calls:
        done.get(timeout=WAIT)
    assert pool.statistics()["threads_started"] == 4


def test_abandoned_hung_job_is_replaced_and_its_thread_exits(
    pools: Callable[..., WorkerPool],
) -> None:
    pool = pools(max_workers=1)
    gate = threading.Event()
    hung = Call(gate=gate)
    assert pool.submit(hung)
    assert hung.started.wait(WAIT)
    try:
        assert pool.abandon(hung) is True
        assert pool.abandon(hung) is True  # idempotent while it still runs
        done: queue.SimpleQueue[Call] = queue.SimpleQueue()
        fresh = Call(done)
        assert pool.submit(fresh)
        assert done.get(timeout=WAIT) is fresh
        assert fresh.thread is not hung.thread
        stats = pool.statistics()
        assert stats["workers_abandoned"] == 1
        assert stats["abandoned_total"] == 1
        assert stats["workers_live"] == 2
    finally:
        gate.set()
    assert hung.thread is not None
    hung.thread.join(WAIT)
    assert not hung.thread.is_alive()
    stats = pool.statistics()
    assert stats["workers_abandoned"] == 0
    assert stats["abandoned_total"] == 1
    assert stats["workers_live"] == 1
    assert pool.abandon(hung) is False  # finished: nothing held any more


def test_abandon_refills_capacity_for_queued_jobs(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=1)
    gate = threading.Event()
    hung = Call(gate=gate)
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    waiting = Call(done)
    assert pool.submit(hung)
    assert pool.submit(waiting)
    assert hung.started.wait(WAIT)
    try:
        assert pool.abandon(hung)
        assert done.get(timeout=WAIT) is waiting
    finally:
        gate.set()
    assert hung.finished.wait(WAIT)


def test_abandoned_queued_job_never_runs(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=1)
    gate = threading.Event()
    blocker = Call(gate=gate)
    queued = Call()
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    after = Call(done)
    assert pool.submit(blocker)
    assert pool.submit(queued)
    assert pool.submit(after)
    assert pool.abandon(queued) is False
    assert pool.statistics()["jobs_queued"] == 1
    gate.set()
    assert done.get(timeout=WAIT) is after
    assert not queued.started.is_set()
    assert not queued.cancelled
    assert pool.statistics()["workers_abandoned"] == 0


def test_abandon_unknown_job_is_false(pools: Callable[..., WorkerPool]) -> None:
    assert pools().abandon(Call()) is False


def test_submitting_the_same_job_twice_is_an_error(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=1)
    gate = threading.Event()
    call = Call(gate=gate)
    assert pool.submit(call)
    try:
        with pytest.raises(ValueError, match="already submitted"):
            pool.submit(call)
    finally:
        gate.set()
    assert call.finished.wait(WAIT)


class Probe(pykka.ThreadingActor):
    """A bystander actor: it must survive whatever a job raises."""

    def on_receive(self, message: Any) -> Any:
        return message


def _raise(exc: BaseException) -> Callable[[], None]:
    def action() -> None:
        raise exc

    return action


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("tool bug"),
        SystemExit(3),
        KeyboardInterrupt(),
        asyncio.CancelledError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_raising_job_does_not_kill_its_worker_or_other_actors(
    pools: Callable[..., WorkerPool], exc: BaseException
) -> None:
    probe = Probe.start()
    try:
        pool = pools(max_workers=1)
        done: queue.SimpleQueue[Call] = queue.SimpleQueue()
        bad = Call(done, action=_raise(exc))
        good = Call(done)
        assert pool.submit(bad)
        assert done.get(timeout=WAIT) is bad
        assert pool.submit(good)
        assert done.get(timeout=WAIT) is good
        assert good.thread is bad.thread
        assert pool.statistics()["threads_started"] == 1
        assert probe.is_alive()
        assert probe.ask("ping", timeout=WAIT) == "ping"
    finally:
        probe.stop(timeout=WAIT)


def test_saturation_by_abandoned_workers(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(max_workers=4, max_abandoned=2)
    gate = threading.Event()
    hung = [Call(gate=gate) for _ in range(2)]
    try:
        for call in hung:
            assert pool.submit(call)
            assert call.started.wait(WAIT)
        assert not pool.is_saturated_by_abandoned()
        assert pool.abandon(hung[0])
        assert not pool.is_saturated_by_abandoned()
        assert pool.abandon(hung[1])
        assert pool.is_saturated_by_abandoned()
        assert pool.statistics()["workers_abandoned"] == 2
    finally:
        gate.set()
    for call in hung:
        assert call.thread is not None
        call.thread.join(WAIT)
    assert not pool.is_saturated_by_abandoned()


def test_shutdown_joins_every_worker_thread() -> None:
    before = _worker_threads()
    pool = WorkerPool(max_workers=8, prestart=3)
    pool.start()
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    gate = threading.Event()
    calls = [Call(done, gate=gate) for _ in range(6)]
    for call in calls:
        assert pool.submit(call)
    assert _worker_threads() - before
    gate.set()
    for _ in calls:
        done.get(timeout=WAIT)
    assert pool.shutdown(timeout=WAIT) == []
    assert _worker_threads() == before
    assert pykka.ActorRegistry.get_by_class(ToolWorker) == []
    assert pool.shutdown(timeout=WAIT) == []  # idempotent
    assert pool.closed
    assert pool.submit(Call()) is False
    assert pool.statistics()["workers_live"] == 0


def test_shutdown_waits_for_busy_workers_to_finish() -> None:
    pool = WorkerPool(max_workers=1)
    gate = threading.Event()
    busy = Call(gate=gate)
    # Shutdown drops the pending job first: its cancel_pending releases the busy one, which
    # therefore finishes while shutdown is waiting for it.
    pending = Call(on_cancel=gate.set)
    assert pool.submit(busy)
    assert pool.submit(pending)
    assert busy.started.wait(WAIT)
    assert pool.shutdown(timeout=WAIT) == []
    assert pending.cancelled
    assert not pending.started.is_set()
    assert busy.finished.is_set()
    assert busy.thread is not None
    assert not busy.thread.is_alive()


def test_shutdown_is_bounded_and_reports_hung_threads() -> None:
    clock = SystemClock()
    pool = WorkerPool(max_workers=3)
    gate = threading.Event()
    hung, abandoned = Call(gate=gate), Call(gate=gate)
    try:
        for call in (hung, abandoned):
            assert pool.submit(call)
            assert call.started.wait(WAIT)
        assert pool.abandon(abandoned)
        t0 = clock.now()
        names = pool.shutdown(timeout=0.05)
        assert clock.now() - t0 < WAIT  # bounded: it did not wait for the hung tool
        assert hung.thread is not None
        assert abandoned.thread is not None
        assert names == sorted([hung.thread.name, abandoned.thread.name])
    finally:
        gate.set()
    for call in (hung, abandoned):
        assert call.thread is not None
        call.thread.join(WAIT)
        assert not call.thread.is_alive()
    assert pool.shutdown(timeout=WAIT) == []
    assert pykka.ActorRegistry.get_by_class(ToolWorker) == []


def test_shutdown_drops_pending_jobs_with_cancel_pending() -> None:
    pool = WorkerPool(max_workers=1)
    gate = threading.Event()
    running = Call(gate=gate)
    pending = [Call() for _ in range(3)]
    assert pool.submit(running)
    for call in pending:
        assert pool.submit(call)
    assert running.started.wait(WAIT)
    try:
        assert running.thread is not None
        assert pool.shutdown(timeout=0.01) == [running.thread.name]
    finally:
        gate.set()
    running.thread.join(WAIT)
    assert not running.thread.is_alive()
    for call in pending:
        assert call.cancelled
        assert not call.started.is_set()
    assert running.finished.is_set()


def _failing_start(self: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


def test_start_failure_with_no_worker_returns_false(
    pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[Job] = []
    pool = pools(on_start_failure=lambda job, exc: failures.append(job))
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", _failing_start)
        assert pool.submit(Call()) is False
    assert failures == []  # the caller was told directly
    assert not pool.closed
    assert pykka.ActorRegistry.get_by_class(ToolWorker) == []  # T1: no zombie ref
    assert pool.statistics()["workers_live"] == 0
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    assert pool.submit(Call(done))  # threads can start again: the pool recovers
    done.get(timeout=WAIT)


def test_start_failure_queues_the_job_when_another_worker_lives(
    pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = pools(max_workers=2)
    gate = threading.Event()
    first = Call(gate=gate)
    assert pool.submit(first)
    assert first.started.wait(WAIT)
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    second = Call(done)
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", _failing_start)
        assert pool.submit(second) is True
    assert pool.statistics()["jobs_queued"] == 1
    gate.set()
    assert done.get(timeout=WAIT) is second
    assert second.thread is first.thread


def test_start_failure_of_a_replacement_reports_stranded_jobs(
    pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[tuple[Job, BaseException]] = []
    pool = pools(max_workers=1, on_start_failure=lambda job, exc: failures.append((job, exc)))
    gate = threading.Event()
    hung = Call(gate=gate)
    waiting = [Call(), Call()]
    assert pool.submit(hung)
    for call in waiting:
        assert pool.submit(call)
    assert hung.started.wait(WAIT)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", _failing_start)
            assert pool.abandon(hung)
        assert [job for job, _ in failures] == waiting
        assert all(isinstance(exc, RuntimeError) for _, exc in failures)
        assert pool.statistics()["jobs_queued"] == 0
    finally:
        gate.set()
    assert hung.thread is not None
    hung.thread.join(WAIT)
    assert pykka.ActorRegistry.get_by_class(ToolWorker) == []


def _wait_until(predicate: Callable[[], bool]) -> None:
    """Poll a condition the code under test offers no event for (bounded, never a guess)."""
    pause = threading.Event()
    for _ in range(int(WAIT / 0.001)):
        if predicate():
            return
        pause.wait(0.001)
    raise AssertionError("condition never became true")


def test_a_worker_that_goes_idle_during_a_failed_start_takes_the_job(
    pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = pools(max_workers=2)
    gate = threading.Event()
    first = Call(gate=gate)
    assert pool.submit(first)
    assert first.started.wait(WAIT)

    def start_fails_after_first_goes_idle(self: threading.Thread) -> None:
        gate.set()
        _wait_until(lambda: pool.statistics()["workers_idle"] == 1)
        raise RuntimeError("can't start new thread")

    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    second = Call(done)
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", start_fails_after_first_goes_idle)
        assert pool.submit(second) is True
    assert done.get(timeout=WAIT) is second
    assert second.thread is first.thread
    assert pool.statistics()["jobs_queued"] == 0


def test_a_worker_stopped_behind_the_pools_back_is_replaced(
    pools: Callable[..., WorkerPool],
) -> None:
    # T9: a host may stop our actors (ActorRegistry.stop_all); the pool must not hand jobs
    # to a dead worker.
    pool = pools(prestart=1)
    pool.start()
    (ref,) = pykka.ActorRegistry.get_by_class(ToolWorker)
    assert ref.stop(timeout=WAIT)
    assert pool.statistics()["workers_live"] == 0
    done: queue.SimpleQueue[Call] = queue.SimpleQueue()
    assert pool.submit(Call(done))
    done.get(timeout=WAIT)
    assert pool.statistics()["threads_started"] == 2


class _Failing(Call):
    """A job that records the start failure the pool reports to it."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: list[BaseException] = []

    def start_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)


def test_a_stranded_job_hears_of_the_start_failure_itself(
    pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job's own start_failed comes before the pool's callback: a run's call learns
    # resource_exhausted instead of waiting for a worker that will never come.
    others: list[Job] = []
    pool = pools(max_workers=1, on_start_failure=lambda job, exc: others.append(job))
    gate = threading.Event()
    hung = Call(gate=gate)
    assert pool.submit(hung)
    assert hung.started.wait(WAIT)
    waiting = _Failing()
    assert pool.submit(waiting)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", _failing_start)
            assert pool.abandon(hung)  # its replacement cannot start
        assert [type(exc) for exc in waiting.failed] == [RuntimeError]
        assert others == []
        assert not waiting.started.is_set()
    finally:
        gate.set()
    assert hung.thread is not None
    hung.thread.join(WAIT)


def test_an_idle_worker_keeps_nothing_of_its_last_job(pools: Callable[..., WorkerPool]) -> None:
    # pykka's loop keeps the last message a worker got until the next one: the pool tells a
    # worker "run your slot's job", never the job, so a finished run's job (its view, its
    # arguments) is not kept alive by the worker that ran it.
    pool = pools(max_workers=1)
    job = Call()
    gone = weakref.ref(job)
    assert pool.submit(job)
    assert job.finished.wait(WAIT)
    for _ in range(10_000):  # its bookkeeping after the job, then idle
        if pool.statistics()["workers_idle"] == 1:
            break
        job.finished.wait(0.001)
    assert pool.statistics()["workers_idle"] == 1
    del job
    gc.collect()
    assert gone() is None
