"""`ProcessPool` on its own (the engine layer, knows nothing of tools): entry points, queueing
beyond `max_workers`, cooperative signal, kill, crash reports, shutdown.

Outcomes are collected through `on_done` into a queue the test blocks on.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from steerable.actors import OutcomeKind, RemoteOutcome, RemoteTask
from steerable.actors._engine.procpool import ProcessPool

if TYPE_CHECKING:
    from tests import isolation_tools as kit
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    import isolation_tools as kit

WAIT = kit.WAIT
ECHO = "isolation_tools:echo"
BLOCK = "isolation_tools:block"


class Outcomes:
    """on_done callbacks that put (label, outcome) on a queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[str, RemoteOutcome]] = queue.Queue()

    def on(self, label: str) -> Callable[[RemoteOutcome], None]:
        return lambda outcome: self.queue.put((label, outcome))

    def next(self) -> tuple[str, RemoteOutcome]:
        return self.queue.get(timeout=WAIT)


def warm(pool: ProcessPool) -> None:
    """Return once the pool's worker has served a call (so it is ready and idle)."""
    outcomes = Outcomes()
    pool.submit(RemoteTask(entry=ECHO, payload=b"warm"), outcomes.on("warm"))
    assert outcomes.next()[1].kind is OutcomeKind.DONE


@pytest.fixture
def pool() -> Iterator[ProcessPool]:
    p = ProcessPool(workers=1, max_workers=1, preload=["isolation_tools"], name="steerable-pp")
    p.start()
    try:
        warm(p)
        yield p
    finally:
        assert p.shutdown() == []


def test_an_entry_runs_in_a_worker(pool: ProcessPool) -> None:
    outcomes = Outcomes()
    pool.submit(RemoteTask(entry=ECHO, payload=b"hi"), outcomes.on("a"))
    _, outcome = outcomes.next()
    assert outcome.kind is OutcomeKind.DONE
    assert outcome.payload is not None
    text, pid = outcome.payload.split()
    assert text == b"hi"
    assert int(pid) != os.getpid()
    assert int(pid) in pool.pids()


def test_the_deadline_travels_as_time_left(pool: ProcessPool) -> None:
    outcomes = Outcomes()
    task = RemoteTask(entry="isolation_tools:deadline_of", payload=b"", remaining=30.0)
    pool.submit(task, outcomes.on("d"))
    _, outcome = outcomes.next()
    assert outcome.payload is not None
    assert 0 < float(outcome.payload) <= 30.0


def test_calls_beyond_max_workers_queue_and_a_signal_drops_a_queued_one(
    pool: ProcessPool,
) -> None:
    outcomes = Outcomes()
    running = pool.submit(RemoteTask(entry=BLOCK, payload=b""), outcomes.on("running"))
    queued = pool.submit(RemoteTask(entry=ECHO, payload=b"q"), outcomes.on("queued"))
    assert pool.statistics()["process_calls_queued"] == 1
    queued.signal("stop")
    label, outcome = outcomes.next()
    assert (label, outcome.kind) == ("queued", OutcomeKind.CANCELLED)
    # The running call gets the cooperative signal in its worker and stops on its own.
    running.signal("stop")
    label, outcome = outcomes.next()
    assert label == "running"
    assert outcome.payload == b"cancelled"
    assert pool.statistics()["process_kills"] == 0


def test_kill_ends_the_worker_and_a_fresh_one_serves_the_queue(pool: ProcessPool) -> None:
    outcomes = Outcomes()
    running = pool.submit(RemoteTask(entry=BLOCK, payload=b""), outcomes.on("running"))
    pool.submit(RemoteTask(entry=ECHO, payload=b"next"), outcomes.on("next"))
    (victim,) = pool.pids()
    assert running.kill() is True
    assert running.kill() is True  # idempotent
    label, outcome = outcomes.next()
    assert label == "next"  # the killed call is never reported: the killer recorded it
    assert outcome.payload is not None
    assert int(outcome.payload.split()[1]) != victim
    assert kit.wait_gone(victim)
    assert pool.statistics()["process_kills"] == 1
    assert outcomes.queue.empty()


def test_kill_of_a_queued_call_drops_it(pool: ProcessPool) -> None:
    outcomes = Outcomes()
    running = pool.submit(RemoteTask(entry=BLOCK, payload=b""), outcomes.on("running"))
    queued = pool.submit(RemoteTask(entry=ECHO, payload=b"q"), outcomes.on("queued"))
    assert queued.kill() is True
    running.signal("stop")
    assert outcomes.next()[0] == "running"
    assert outcomes.queue.empty()


def test_an_entry_that_cannot_be_imported_is_a_failed_outcome(pool: ProcessPool) -> None:
    outcomes = Outcomes()
    pool.submit(RemoteTask(entry="no_such_module_x:fn", payload=b""), outcomes.on("x"))
    _, outcome = outcomes.next()
    assert outcome.kind is OutcomeKind.FAILED
    assert "no_such_module_x" in outcome.message


def test_shutdown_refuses_queued_and_running_calls_and_later_submits() -> None:
    pool = ProcessPool(workers=1, max_workers=1, preload=["isolation_tools"], name="steerable-pp")
    pool.start()
    warm(pool)
    outcomes = Outcomes()
    pool.submit(RemoteTask(entry=BLOCK, payload=b""), outcomes.on("running"))
    pool.submit(RemoteTask(entry=ECHO, payload=b"q"), outcomes.on("queued"))
    assert pool.shutdown() == []
    seen = dict([outcomes.next(), outcomes.next()])
    assert set(seen) == {"running", "queued"}
    assert {o.kind for o in seen.values()} == {OutcomeKind.REFUSED}
    pool.submit(RemoteTask(entry=ECHO, payload=b"late"), outcomes.on("late"))
    label, outcome = outcomes.next()
    assert (label, outcome.kind) == ("late", OutcomeKind.REFUSED)
    assert pool.pids() == [] or all(kit.wait_gone(p) for p in pool.pids())
