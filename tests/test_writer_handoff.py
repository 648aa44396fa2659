"""A thread that wakes actors it must not handle hands them to an idle worker
(docs/decisions/0003-writer-handoff.md): `handoff_to_workers`, `WorkerPool.submit_if_idle`,
and the durable stores' writers that use them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, SqliteStore, tool
from steerable.actors._engine import inline
from steerable.actors._engine.inline import handoff_to_workers
from steerable.actors._engine.mux import Dispatcher, MuxActor
from steerable.actors._engine.pool import WorkerPool
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import Finish, Plan, RunState, ToolCall

if TYPE_CHECKING:  # mypy resolves the kit as tests.pg_kit (explicit package bases)
    from tests.pg_kit import pg_store
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import pg_store

WAIT = 10.0  # seconds: fail instead of hanging, never a synchronisation


class _Job:
    """Records the thread it ran on; waits for `gate` first if given."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.thread = ""
        self.ran = threading.Event()

    def run(self) -> None:
        self.thread = threading.current_thread().name
        if self.gate is not None:
            assert self.gate.wait(WAIT)
        self.ran.set()


class _Record:
    """What a `_Recorder` saw: the thread of each message it handled, and its job."""

    def __init__(self, pool: WorkerPool | None = None) -> None:
        self.pool = pool
        self.threads: list[str] = []
        self.job = _Job()
        self.handled = threading.Event()


class _Recorder(MuxActor):
    """Records the thread of each message but "ready"; "submit" also submits a job."""

    def __init__(self, *, dispatcher: Dispatcher, record: _Record) -> None:
        super().__init__(dispatcher=dispatcher)
        self.record = record

    def on_receive(self, message: Any) -> Any:
        if message == "ready":
            return None
        record = self.record
        record.threads.append(threading.current_thread().name)
        if message == "submit":
            assert record.pool is not None
            assert record.pool.submit(record.job)
        record.handled.set()
        return None


def _started(dispatcher: Dispatcher, record: _Record) -> Any:
    ref = _Recorder.start(dispatcher=dispatcher, record=record)
    ref.ask("ready", timeout=WAIT)  # on_start ran; the actor is idle again
    return ref


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = WorkerPool(max_workers=2, prestart=1, name="Helper")
    p.start()
    try:
        yield p
    finally:
        assert p.shutdown(timeout=WAIT) == []


def _dispatcher(helpers: Any) -> Dispatcher:
    d = Dispatcher(name="steerable-dispatch-handoff", helpers=helpers)
    d.start()
    return d


def test_an_idle_worker_handles_the_woken_actor_and_keeps_the_job_it_submits(
    pool: WorkerPool,
) -> None:
    dispatcher = _dispatcher(pool)
    try:
        actor = _Record(pool)
        ref = _started(dispatcher, actor)
        with handoff_to_workers():
            ref.tell("submit")
        assert actor.job.ran.wait(WAIT)
        handled_on = actor.threads[-1]
        assert handled_on.startswith("Helper-")
        assert actor.job.thread == handled_on  # claimed: no second hand-off
        ref.stop()
    finally:
        dispatcher.stop()


def test_with_no_idle_worker_the_dispatcher_handles_it(pool: WorkerPool) -> None:
    gate = threading.Event()
    busy = [_Job(gate), _Job(gate)]  # both workers the pool may have
    dispatcher = _dispatcher(pool)
    try:
        for job in busy:
            assert pool.submit(job)
        actor = _Record()
        ref = _started(dispatcher, actor)
        with handoff_to_workers():
            ref.tell("woken")
        assert actor.handled.wait(WAIT)
        assert actor.threads[-1].startswith("steerable-dispatch-handoff")
        gate.set()
        assert all(job.ran.wait(WAIT) for job in busy)
        ref.stop()
    finally:
        gate.set()
        dispatcher.stop()


def test_without_helpers_or_outside_the_block_the_dispatcher_handles_it(
    pool: WorkerPool,
) -> None:
    plain = _dispatcher(None)
    helped = _dispatcher(pool)
    try:
        first, second = _Record(), _Record()
        refs = [_started(plain, first), _started(helped, second)]
        with handoff_to_workers():
            refs[0].tell("woken")
        refs[1].tell("woken")  # no block: an ordinary tell
        assert first.handled.wait(WAIT)
        assert second.handled.wait(WAIT)
        assert first.threads[-1].startswith("steerable-dispatch-handoff")
        assert second.threads[-1].startswith("steerable-dispatch-handoff")
        for ref in refs:
            ref.stop()
    finally:
        plain.stop()
        helped.stop()


def test_a_jobs_own_tells_are_not_held_back_until_it_returns(pool: WorkerPool) -> None:
    # Only a job's report is collected for its worker (decision 0002): what the user code it
    # runs tells is handled meanwhile, elsewhere, so that code may wait for it.
    dispatcher = _dispatcher(pool)
    try:
        actor = _Record()
        ref = _started(dispatcher, actor)

        class _Waits(_Job):
            def run(self) -> None:
                ref.tell("woken")
                self.seen = actor.handled.wait(WAIT)
                super().run()

        job = _Waits()
        assert pool.submit(job)
        assert job.ran.wait(WAIT)
        assert job.seen
        assert actor.threads[-1] != job.thread
        ref.stop()
    finally:
        dispatcher.stop()


class _Keeps:
    """Helpers that take every job and run nothing: the test decides what becomes of it."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def submit_if_idle(self, job: Any, /) -> bool:
        self.jobs.append(job)
        return True


@pytest.mark.parametrize("fate", ["dropped", "run_elsewhere"])
def test_a_hand_off_that_never_reaches_a_worker_goes_back_to_the_dispatcher(fate: str) -> None:
    helpers = _Keeps()
    dispatcher = _dispatcher(helpers)
    try:
        actor = _Record()
        ref = _started(dispatcher, actor)
        with handoff_to_workers():
            ref.tell("woken")
        assert len(helpers.jobs) == 1
        assert not actor.handled.is_set()  # scheduled, waiting for its helper
        if fate == "dropped":
            helpers.jobs[0].cancel_pending()  # a pool that shut down with it queued
        else:
            helpers.jobs[0].run()  # on a thread that services nothing
        assert actor.handled.wait(WAIT)
        assert actor.threads[-1].startswith("steerable-dispatch-handoff")
        ref.stop()
    finally:
        dispatcher.stop()


def test_submit_if_idle_takes_only_an_idle_worker_and_nothing_after_shutdown() -> None:
    cold = WorkerPool(max_workers=1, name="Helper")
    assert not cold.submit_if_idle(_Job())  # no worker yet, and none is started for it
    assert cold.statistics()["threads_started"] == 0
    assert cold.shutdown(timeout=WAIT) == []
    pool = WorkerPool(max_workers=1, prestart=1, name="Helper")
    pool.start()
    gate = threading.Event()
    try:
        first = _Job(gate)
        assert pool.submit_if_idle(first)
        assert not pool.submit_if_idle(_Job())  # its only worker is busy with the first
        gate.set()
        assert first.ran.wait(WAIT)
        assert first.thread.startswith("Helper-")
    finally:
        gate.set()
        assert pool.shutdown(timeout=WAIT) == []
    assert not pool.submit_if_idle(_Job())


@tool(side_effect="none")
def note(text: str) -> str:
    return text


@pytest.fixture
def adopted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each hand-off job that ran: (the thread that handed runs over, the one that took them)."""
    jobs: list[tuple[str, str]] = []
    made = inline._Adopt.__init__
    run = inline._Adopt.run
    origin: dict[int, str] = {}

    def init(self: Any, inboxes: Any) -> None:
        made(self, inboxes)
        origin[id(self)] = threading.current_thread().name

    def counted(self: Any) -> None:
        jobs.append((origin.pop(id(self), "?"), threading.current_thread().name))
        run(self)

    monkeypatch.setattr(inline._Adopt, "__init__", init)
    monkeypatch.setattr(inline._Adopt, "run", counted)
    return jobs


def _from_writer(adopted: list[tuple[str, str]], writer: str) -> list[str]:
    """The threads that took runs over from the store's writer thread `writer`."""
    return [taker for giver, taker in adopted if giver.startswith(writer)]


def _run_ten_steps(store: Any) -> None:
    """Ten one-call steps on `store`, then Finish."""
    script: list[Plan | Finish] = [
        Plan(steps=(ToolCall(name="note", arguments={"text": str(i)}),)) for i in range(10)
    ]
    agent = ScriptedAgent([*script, Finish(output="done")])
    # Two workers started up front: one run uses one at a time, so one is idle at each commit.
    with Runtime(store=store, tools=[note], prestart_workers=2) as rt:
        outcome = rt.start("task", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "done"


def test_a_sqlite_runs_stored_revisions_reach_it_through_a_worker(
    tmp_path: Path, adopted: list[tuple[str, str]]
) -> None:
    _run_ten_steps(SqliteStore(tmp_path / "runs.db"))
    # The writer's commits woke the run through idle workers. Not every commit does: one that
    # lands while the run is still being handled only adds to its inbox.
    takers = _from_writer(adopted, "steerable-sqlite")
    assert takers
    assert all(name.startswith("ToolWorker-") for name in takers)


def test_a_postgres_runs_stored_revisions_reach_it_through_a_worker(
    pg_schema: str, adopted: list[tuple[str, str]]
) -> None:
    store = pg_store(pg_schema)
    try:
        _run_ten_steps(store)
    finally:
        store.close()
    takers = _from_writer(adopted, "steerable-postgres")
    assert takers
    assert all(name.startswith("ToolWorker-") for name in takers)


class _Where:
    """Finishes at once, recording the thread its decide ran on."""

    name = "where"

    def __init__(self) -> None:
        self.threads: list[str] = []

    def decide(self, view: Any) -> Finish:
        self.threads.append(threading.current_thread().name)
        return Finish(output="done")


def test_a_run_starts_on_an_idle_worker_which_keeps_its_first_decide(
    adopted: list[tuple[str, str]],
) -> None:
    agent = _Where()
    with Runtime(prestart_workers=1) as rt:  # one idle worker, nothing else running
        outcome = rt.start("task", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert [giver for giver, _ in adopted] == ["MainThread"]  # on_start and Begin, together
    assert agent.threads == [taker for _, taker in adopted]  # its first decide stayed there
