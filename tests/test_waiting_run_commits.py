"""A run that waits for its own checkpoint on a pool worker commits it there (decision 0004).

`SqliteStore` queues the writes of a run handled on a pool worker without waking its writer
thread (`WriteQueue.put_lazy`); the run commits them itself when it waits for them
(`commit_now`), and the writer takes any nobody waits for at its next poll. What a helper does
not do (wait for a lock, retry, a flush, a failing store) stays the writer's.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from steerable.actors import Runtime, SqliteStore, ToolContext, tool
from steerable.actors._engine import inline
from steerable.actors._host import supervisor as supervisor_mod
from steerable.actors._host.messages import Stored
from steerable.actors._stores import events as events_mod
from steerable.actors._stores import sqlite as sqlite_mod
from steerable.actors._stores import sqlite_writer
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunOutcome,
    RunState,
    RunView,
    ToolCall,
)

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import WAIT, FaultyStore, disk_full
    from tests.test_stores import snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import WAIT, FaultyStore, disk_full
    from test_stores import snapshot


@contextmanager
def on_a_worker() -> Iterator[None]:
    """Have this thread queue as a pool worker handling a run does (`serving_inline`)."""
    inline._inline.serving = True
    try:
        yield
    finally:
        inline._inline.serving = False


@pytest.fixture
def polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that always polls, once a minute: a lazy write stays queued for the test."""
    monkeypatch.setattr(sqlite_writer, "_POLL", 60.0)
    monkeypatch.setattr(sqlite_writer, "_ACTIVE", float("inf"))


def _settled(store: SqliteStore) -> None:
    """One eager write through the writer, so that it polls from now on (`dozing` False)."""
    store.write_checkpoint("warm", 0, snapshot("warm", 0, transcript_len=0), 0, [])
    assert store.flush(WAIT)
    deadline = time.monotonic() + WAIT
    while store._queue.dozing:  # set False by the writer right after its wait returns
        assert time.monotonic() < deadline, "the writer did not come back from its wait"
        threading.Event().wait(0.001)


@pytest.fixture
def store(tmp_path: Path, polling: None) -> Iterator[SqliteStore]:
    """A store whose writer polls once a minute and is past its first wait (`_settled`)."""
    store = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        _settled(store)
        yield store
    finally:
        store.close()


def _lazy_checkpoint(store: SqliteStore, run_id: str) -> threading.Event:
    stored = threading.Event()
    with on_a_worker():
        store.write_checkpoint(run_id, 0, snapshot(run_id, 0, transcript_len=0), 0, [], stored.set)
    return stored


def test_a_lazy_write_is_committed_by_the_run_that_waits_for_it(store: SqliteStore) -> None:
    stored = _lazy_checkpoint(store, "r")
    assert not store._queue.empty()  # queued, the writer not woken
    assert not stored.is_set()
    assert store.commit_now("r")
    assert stored.is_set()  # told on this thread, before commit_now returned
    assert store._queue.empty()
    assert store._queue.idle()
    assert store.load("r").snapshot.revision == 0
    assert store.commit_now("r")  # nothing queued: nothing to do


def test_a_lazy_write_nobody_waits_for_is_committed_by_the_writers_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_writer, "_ACTIVE", float("inf"))  # polls every _POLL
    store = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        _settled(store)
        stored = _lazy_checkpoint(store, "r")
        assert stored.wait(WAIT)
        assert store.load("r").snapshot.revision == 0
    finally:
        store.close()


def test_a_lazy_write_wakes_a_dozing_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_writer, "_POLL", 60.0)
    monkeypatch.setattr(sqlite_writer, "_ACTIVE", 0.0)  # never polls: waits until rung
    store = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        assert store.flush(WAIT)
        stored = _lazy_checkpoint(store, "r")
        assert stored.wait(WAIT)  # within the test's bound, not the minute's poll
    finally:
        store.close()


def test_commit_now_does_nothing_while_the_writer_holds_the_queue(store: SqliteStore) -> None:
    stored = _lazy_checkpoint(store, "r")
    with store._commit_lock:  # as the writer does while it commits
        assert not store.commit_now("r")
        assert not stored.is_set()
        assert not store._queue.empty()  # left queued, in order
    assert stored.wait(WAIT)  # rung: the writer took it once it had the lock again


def test_commit_now_leaves_other_runs_writes_to_the_writers_group_commit(
    store: SqliteStore,
) -> None:
    commits: list[str] = []
    mine = _lazy_checkpoint(store, "a")
    other = _lazy_checkpoint(store, "b")
    store._writer_conn.set_trace_callback(
        lambda sql: commits.append(threading.current_thread().name) if sql == "COMMIT" else None
    )
    assert not store.commit_now("a")  # given back, the writer rung
    assert mine.wait(WAIT)  # committed by the writer at once (not at its minute's poll)
    assert other.wait(WAIT)
    assert commits == ["steerable-sqlite"]  # both in one transaction


def test_commit_now_leaves_a_flush_to_the_writer(store: SqliteStore) -> None:
    stored = _lazy_checkpoint(store, "r")
    done: Future[None] = Future()
    store._queue.put_lazy((("flush", True), done, None))  # not rung: the writer polls
    assert not store.commit_now("r")  # given back, the writer rung
    done.result(WAIT)  # the writer took it at once (not at its minute's poll)
    assert stored.is_set()  # queued before the flush: committed before it


def test_commit_now_never_waits_for_another_connections_lock(
    tmp_path: Path, polling: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_mod, "_ATTEMPT_BUSY", 30.0)  # the writer's busy wait: 30 s
    path = tmp_path / "runs.db"
    store = SqliteStore(path, write_timeout=60.0)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        _settled(store)
        stored = _lazy_checkpoint(store, "r")
        other.execute("BEGIN IMMEDIATE")  # another process's write lock
        started = time.monotonic()
        assert not store.commit_now("r")
        assert time.monotonic() - started < 15.0  # no busy wait (that would be 30 s)
        assert not stored.is_set()
        other.execute("ROLLBACK")
        assert stored.wait(WAIT)  # the writer, rung by the give-back, committed it
        assert store._busy_ms == 30_000  # the writer's own busy wait is back
        assert store._writer_conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    finally:
        other.close()
        store.close()


def test_a_full_disk_in_commit_now_is_counted_as_a_retry_and_the_writer_commits_it(
    tmp_path: Path, polling: None
) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        _settled(store)
        stored = _lazy_checkpoint(store, "r")
        store.faults.arm(disk_full(), times=1)
        assert not store.commit_now("r")  # the run's own attempt fails: given back
        assert store.faults.failures == 1
        # A failed attempt that is tried again, whoever made it: `write_retries` counts what
        # the disk refused, not which thread asked.
        assert store.statistics() == {"write_retries": 1, "writes_given_up": 0}
        assert stored.wait(WAIT)  # the writer, rung by the give-back, committed it
        assert store.load("r").snapshot.revision == 0
        assert store.statistics() == {"write_retries": 1, "writes_given_up": 0}
    finally:
        store.close()


@tool
def step() -> str:
    """Return at once."""
    return "ok"


class _Loop:
    """Plans one `step` call per decision, `n` times, then finishes."""

    name = "loop"

    def __init__(self, n: int) -> None:
        self.left = n

    def decide(self, view: RunView) -> Plan | Finish:
        if self.left == 0:
            return Finish(output="done")
        self.left -= 1
        return Plan(steps=(ToolCall(name="step"),))


def _loop_on(store: SqliteStore, iterations: int) -> tuple[RunOutcome, list[EventKind]]:
    """Run `_Loop(iterations)` to its end on `store`; its outcome (checked against the store)
    and the kinds of its events."""
    with Runtime(tools=[step], store=store, prestart_workers=4) as rt:
        config = RunConfig(max_steps=iterations + 10, max_model_calls=iterations + 10)
        handle = rt.start("t", agent=_Loop(iterations), config=config)
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert store.load(handle.run_id).snapshot.revision == outcome.revision
        return outcome, [e.kind for e in handle.events()]


def test_a_run_commits_its_checkpoints_on_the_worker_that_handles_it(
    tmp_path: Path, polling: None
) -> None:
    store = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    committers: list[str] = []

    def traced(statement: str) -> None:
        if statement.startswith("INSERT OR REPLACE INTO revisions"):
            committers.append(threading.current_thread().name)

    store._writer_conn.set_trace_callback(traced)
    iterations = 30
    outcome, _ = _loop_on(store, iterations)
    assert outcome.revision >= 2 * iterations
    on_workers = [name for name in committers if name.startswith("ToolWorker")]
    # Each revision is committed once; with the writer polling once a minute, every one the
    # run waited for was committed by the worker handling it (the old writer did them all).
    assert len(committers) >= outcome.revision + 1
    assert len(on_workers) > len(committers) // 2, committers


def test_a_run_that_commits_its_own_checkpoints_goes_on_without_stored_messages(
    tmp_path: Path, polling: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit made by the run's own thread inside its handler tells it nothing by message:
    # the handler goes on at once (before: two `Stored` messages handled per iteration).
    told: list[int] = []
    real = supervisor_mod._HANDLERS[Stored]

    def counting(sup: supervisor_mod.RunSupervisor, message: Stored, now: float) -> None:
        told.append(message.revision)
        real(sup, message, now)

    monkeypatch.setitem(supervisor_mod._HANDLERS, Stored, counting)
    iterations = 30
    _, kinds = _loop_on(SqliteStore(tmp_path / "runs.db", write_timeout=WAIT), iterations)
    assert kinds.count(EventKind.REASONING_STARTED) == iterations + 1
    # The writer polls once a minute: what it commits (the first revision, a commit the
    # worker found the writer busy with, the terminal one) it tells; the rest nobody does.
    assert len(told) < iterations // 2, told


_read_runs: list[str] = []
_read_gate = threading.Event()


@tool
def read_slowly(ctx: ToolContext) -> str:
    """Side-effect free: waits for the test, counts each run of it."""
    _read_runs.append(ctx.call_id)
    _read_gate.wait(WAIT)
    return "read"


@tool(side_effect="write", requires_approval=True)
def write_it() -> str:
    """Needs a person's approval."""
    return "written"


class _ReadThenWrite:
    name = "read-then-write"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        if self.calls == 1:
            return Plan(steps=(ToolCall(name="read_slowly"), ToolCall(name="write_it")))
        return Finish(output="done")


def test_a_passivated_run_keeps_a_result_journaled_after_its_checkpoint(
    tmp_path: Path, polling: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read's result is queued lazily after the plan's checkpoint was stored; the run then
    passivates (it waits for an approval). Its wake (a message) must read that result, not run
    the read again."""
    # Stored events wait a minute too: their window's first batch, which rings the writer,
    # is queued long before the read's result.
    monkeypatch.setattr(events_mod, "EVENT_DELAY", 60.0)
    _read_runs.clear()
    _read_gate.clear()
    store = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    with Runtime(tools=[read_slowly, write_it], store=store, prestart_workers=2) as rt:
        handle = rt.start("t", agent=_ReadThenWrite())
        deadline = time.monotonic() + WAIT
        while not (_read_runs and handle.pending_approvals()):
            assert time.monotonic() < deadline, "the read did not start or no approval asked"
            threading.Event().wait(0.001)
        # The plan's checkpoint is stored before the read ends (the events stay waiting).
        assert store.flush(WAIT, events=False)
        _read_gate.set()
        while rt.statistics()["runs_passivated"] != 1:
            assert time.monotonic() < deadline, "the run did not passivate"
            threading.Event().wait(0.001)
        # A message wakes it: stored on this thread (not through the writer's queue), so
        # nothing but the wake's own read makes the writer commit the queued result.
        handle.send("and then?")
        assert handle.approve(handle.pending_approvals()[0].call_id)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(_read_runs) == 1, _read_runs  # once: its journaled result was found on the wake
