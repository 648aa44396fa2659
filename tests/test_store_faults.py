"""Store faults (issue 18: items 1, 5, 7): failed writes, read-only stores, file modes.

Which fault is real and which is injected (docs/reliability.md, "Store faults"):
- real: a 2 MB tmpfs that fills up mid-run, a tmpfs remounted read-only, a second process
  holding `BEGIN EXCLUSIVE` (the `tmpfs` tests need root, as in CI; with CI=true they fail
  instead of skipping), and file modes under a permissive umask;
- injected (`FaultyStore`: the writer's COMMIT raises what SQLite raises): the exact sequences
  (a failure that clears while it is retried, one that does not, a terminal checkpoint that
  cannot be stored, a non-transient error, a revision whose predecessor was given up).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, SqliteStore, tool
from steerable.actors._stores.sqlite import default_db_path
from steerable.actors.testing import Gate, ScriptedAgent, call, plan
from steerable.protocol import (
    AgentError,
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    RunState,
    RunView,
    SteerableError,
)

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import (
        WAIT,
        FaultyStore,
        Locker,
        Tmpfs,
        disk_full,
        fill,
        locked,
        read_only,
        retrying,
        until,
    )
    from tests.test_stores import notes, snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import (
        WAIT,
        FaultyStore,
        Locker,
        Tmpfs,
        disk_full,
        fill,
        locked,
        read_only,
        retrying,
        until,
    )
    from test_stores import notes, snapshot


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    mounts = Tmpfs(tmp_path)
    try:
        yield mounts
    finally:
        mounts.close()


@tool
def pure(value: str = "") -> str:
    """A side-effect-free tool."""
    return f"pure {value}"


def _ended(handle: Any) -> list[dict[str, Any]]:
    """The (state, error, revision) of every run_ended event of the run."""
    return [
        {k: e.data[k] for k in ("state", "error", "revision")}
        for e in handle.events(timeout=WAIT)
        if e.kind is EventKind.RUN_ENDED
    ]


def _whole(store: SqliteStore, run_id: str) -> int:
    """The latest stored revision of a run loads whole; returns it."""
    stored = store.load(run_id)
    assert len(stored.transcript) == stored.snapshot.transcript_len
    for info in store.revisions(run_id):
        again = store.load(run_id, info.revision)
        assert len(again.transcript) == info.transcript_len
    return stored.snapshot.revision


# --------------------------------------------------------------------------- injected


def test_a_transient_failure_is_retried_and_the_run_finishes_stored(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=WAIT)
    store.faults.arm(disk_full(), times=3)
    agent = ScriptedAgent([plan(call("pure", value="a"))], then=Finish(output="done"))
    with Runtime(store=store, tools=[pure]) as rt:
        handle = rt.start("t", agent=agent)
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "done"
        assert store.faults.failures == 3
        assert store.statistics() == {"write_retries": 3, "writes_given_up": 0}
        stored = store.load(handle.run_id)
        assert stored.snapshot.state is RunState.FINISHED
        assert stored.snapshot.revision == outcome.revision
        assert _whole(store, handle.run_id) == outcome.revision


def test_a_store_that_stays_full_ends_the_run_in_error_and_keeps_what_it_stored(
    tmp_path: Path,
) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=0.3)
    gate = Gate()
    agent = ScriptedAgent([plan(call("gate"))], then=Finish(output="done"))
    with Runtime(store=store, tools=[gate.tool("gate")]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started()
        assert store.flush(WAIT)
        before = store.load(handle.run_id).snapshot.revision
        store.faults.arm(disk_full())
        gate.release()
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.ERROR
        error = outcome.error
        assert error is not None
        assert error.code is ErrorCode.STORE_UNAVAILABLE
        assert "full" in error.details["cause"]
        assert error.details["sqlite_error"] == "SQLITE_FULL"
        assert error.details["stored_revision"] == before == outcome.revision
        assert outcome.output is None
        assert _ended(handle)[-1] == {
            "state": "error",
            "error": "store_unavailable",
            "revision": before,
        }
        # Nothing stored was touched: the store holds the run as it was before the failure.
        stored = store.load(handle.run_id)
        assert stored.snapshot.revision == before
        assert not stored.snapshot.state.is_terminal
        assert _whole(store, handle.run_id) == before
        assert rt.unfinished() == [handle.run_id]
        # The disk has room again: the run continues from what was stored.
        store.faults.disarm()
        resumed = rt.resume(handle.run_id, agent=ScriptedAgent([], then=Finish(output="again")))
        final = resumed.result(timeout=WAIT)
        assert final.state is RunState.FINISHED
        assert final.output == "again"
        assert store.load(handle.run_id).snapshot.state is RunState.FINISHED


def test_a_terminal_checkpoint_that_cannot_be_stored_is_never_reported_finished(
    tmp_path: Path,
) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=0.2)
    finished: list[str] = []

    def finish(view: RunView) -> Finish:
        assert store.flush(WAIT)  # the revisions before this decision are stored
        store.faults.arm(disk_full())
        return Finish(output="claimed")

    agent = ScriptedAgent([finish])
    with Runtime(store=store) as rt:
        handle = rt.start(
            "t", agent=agent, hooks={"on_finish": lambda e: finished.append(e.data["state"])}
        )
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.ERROR
        assert outcome.output is None
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.STORE_UNAVAILABLE
        assert handle.state is RunState.ERROR
        # Hosts and on_finish hooks learn the state the store holds, never "finished".
        assert _ended(handle) == [
            {"state": "error", "error": "store_unavailable", "revision": outcome.revision}
        ]
        store.faults.disarm()
        stored = store.load(handle.run_id)
        assert stored.snapshot.state is RunState.RUNNING
        assert stored.snapshot.revision == outcome.revision
    # on_finish runs after the outcome is published (shutdown waits for it): it saw "error".
    assert finished == ["error"]


def test_a_non_transient_failure_is_not_retried(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=WAIT)
    store.faults.arm(read_only())
    started = time.monotonic()
    with Runtime(store=store, tools=[pure]) as rt:
        outcome = rt.start("t", agent=ScriptedAgent([plan(call("pure"))])).result(timeout=WAIT)
    assert time.monotonic() - started < WAIT / 2  # no retries for a read-only file
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.STORE_UNAVAILABLE
    assert outcome.error.details["transient"] is False
    assert outcome.error.details["stored_revision"] == -1  # nothing of the run was stored
    assert store.faults.failures <= 3  # one attempt per batch


def test_a_revision_whose_predecessor_was_given_up_is_refused(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=0.0)
    try:
        errors: list[AgentError] = []
        stored: list[int] = []

        def write(revision: int, entries_from: int, count: int) -> None:
            store.write_checkpoint(
                "r",
                revision,
                snapshot("r", revision, transcript_len=entries_from + count),
                entries_from,
                notes("r", entries_from, count),
                lambda: stored.append(revision),
                on_failed=errors.append,
            )
            assert store.flush(WAIT)

        write(0, 0, 2)
        store.faults.arm(disk_full())
        write(1, 2, 2)  # given up
        store.faults.disarm()
        write(2, 4, 2)  # the disk has room again, but revision 1 is missing: refused
        assert stored == [0]
        assert [e.code for e in errors] == [ErrorCode.STORE_UNAVAILABLE] * 2
        assert "not stored" in errors[1].message
        assert [i.revision for i in store.revisions("r")] == [0]
        assert _whole(store, "r") == 0
    finally:
        store.close()


def test_send_to_a_run_whose_store_gave_up_is_refused_at_once(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "runs.db", write_timeout=WAIT)
    with Runtime(store=store) as rt:
        store.faults.arm(read_only())  # refused at once: the first revision is given up
        handle = rt.start("t", agent=ScriptedAgent([AskUser(question="?")]))
        outcome = handle.result(timeout=WAIT)
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.STORE_UNAVAILABLE
        waiting = rt.start("w", agent=ScriptedAgent([AskUser(question="?")]))
        # A transient failure now: a store whose last write was given up answers promptly
        # (one short try) instead of retrying for write_timeout.
        store.faults.arm(disk_full())
        started = time.monotonic()
        with pytest.raises(SteerableError) as raised:
            waiting.send("hello")
        assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
        assert time.monotonic() - started < WAIT / 3
        assert waiting.result(timeout=WAIT).state is RunState.ERROR


def test_a_retried_write_holds_the_run_at_its_next_boundary(tmp_path: Path) -> None:
    # The run must not get ahead of its store: while the write of boundary N is retried, the
    # run may take the step after N, but its model is not called past boundary N + 1.
    store = FaultyStore(tmp_path / "runs.db", write_timeout=WAIT)
    gate = Gate()
    held_call = threading.Event()

    def third(view: RunView) -> Finish:
        held_call.set()
        return Finish(output="ok")

    agent = ScriptedAgent([plan(call("gate")), plan(call("pure")), third])
    with Runtime(store=store, tools=[gate.tool("gate"), pure]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started()
        assert store.flush(WAIT)
        before = store.load(handle.run_id).snapshot.revision
        store.faults.arm(locked())
        gate.release()
        # Boundary before+1 (being retried), the plan before+2, boundary before+3: written
        # by the run, not stored; the model call after before+3 waits for before+2.
        assert store.faults.failed.wait(WAIT)
        for event in handle.events(timeout=WAIT):
            if event.kind is EventKind.CHECKPOINT and event.data["revision"] == before + 3:
                break
        assert not held_call.wait(0.2)  # a regression calls it within milliseconds
        store.faults.disarm()
        outcome = handle.result(timeout=WAIT)
        assert held_call.is_set()
        assert outcome.state is RunState.FINISHED
        assert store.load(handle.run_id).snapshot.state is RunState.FINISHED


def test_shutdown_with_a_failing_store_is_bounded_by_write_timeout(tmp_path: Path) -> None:
    # A run whose first write is being retried: cancelling it stores a CancelRequest, which
    # waits behind that write until it is given up (write_timeout); then the store answers
    # promptly and closing it cuts every retry short. Never the 30 s of a busy timeout.
    store = FaultyStore(tmp_path / "runs.db", write_timeout=2.0)
    rt = Runtime(store=store)
    store.faults.arm(disk_full())
    handle = rt.start("t", agent=ScriptedAgent([AskUser(question="?")]))
    until(retrying(store), "retrying")
    started = time.monotonic()
    rt.shutdown(timeout=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 1.0 + 5.0  # write_timeout + shutdown's timeout + a margin
    assert not store._thread.is_alive()
    assert handle.done()


# --------------------------------------------------------------------------- real faults


def test_a_real_full_disk_ends_the_run_in_error_and_resumes_once_there_is_room(
    tmpfs: Tmpfs,
) -> None:
    folder = tmpfs.mount("2m")
    store = SqliteStore(folder / "runs.db", write_timeout=0.5)
    gate = Gate()

    @tool
    def big() -> str:
        """A result larger than anything the disk still has room for."""
        return "x" * 300_000

    agent = ScriptedAgent([plan(call("gate")), plan(call("big"))], then=Finish(output="done"))
    with Runtime(store=store, tools=[gate.tool("gate"), big]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started()
        assert store.flush(WAIT)
        filler = fill(folder)
        gate.release()
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.ERROR
        error = outcome.error
        assert error is not None
        assert error.code is ErrorCode.STORE_UNAVAILABLE
        assert "full" in error.details["cause"]
        assert error.details["stored_revision"] == outcome.revision
        stored = store.load(handle.run_id)
        assert stored.snapshot.revision == outcome.revision
        assert not stored.snapshot.state.is_terminal
        assert _whole(store, handle.run_id) == outcome.revision
        filler.unlink()
        resumed = rt.resume(handle.run_id, agent=ScriptedAgent([], then=Finish(output="room")))
        assert resumed.result(timeout=WAIT).state is RunState.FINISHED
    reopened = SqliteStore(folder / "runs.db")
    try:
        assert reopened.load(handle.run_id).snapshot.state is RunState.FINISHED
        assert _whole(reopened, handle.run_id) >= 0
    finally:
        reopened.close()


def test_a_lock_held_by_another_process_past_write_timeout_ends_the_run_in_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path, write_timeout=0.5)
    locker = Locker(path)
    gate = Gate()
    agent = ScriptedAgent([plan(call("gate"))], then=Finish(output="done"))
    try:
        with Runtime(store=store, tools=[gate.tool("gate")]) as rt:
            handle = rt.start("t", agent=agent)
            gate.wait_started()
            assert store.flush(WAIT)
            locker.hold()
            gate.release()
            outcome = handle.result(timeout=WAIT)
            assert outcome.state is RunState.ERROR
            error = outcome.error
            assert error is not None
            assert error.code is ErrorCode.STORE_UNAVAILABLE
            assert "locked" in error.details["cause"]
            assert error.details["attempts"] >= 1
            locker.release()
            assert store.load(handle.run_id).snapshot.revision == outcome.revision
            assert _whole(store, handle.run_id) == outcome.revision
    finally:
        locker.release()


def test_a_lock_released_while_the_write_is_retried_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path, write_timeout=WAIT)
    locker = Locker(path)
    gate = Gate()
    agent = ScriptedAgent([plan(call("gate"))], then=Finish(output="done"))
    try:
        with Runtime(store=store, tools=[gate.tool("gate")]) as rt:
            handle = rt.start("t", agent=agent)
            gate.wait_started()
            assert store.flush(WAIT)
            locker.hold()
            gate.release()
            until(retrying(store), "retrying")
            locker.release()
            outcome = handle.result(timeout=WAIT)
            assert outcome.state is RunState.FINISHED
            assert store.load(handle.run_id).snapshot.state is RunState.FINISHED
    finally:
        locker.release()


def test_opening_a_store_locked_by_another_process_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SqliteStore(path).close()
    locker = Locker(path)
    locker.hold()
    try:
        with pytest.raises(SteerableError) as raised:
            SqliteStore(path, write_timeout=0.2)
        assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
        assert raised.value.error.details["path"] == str(path)
    finally:
        locker.release()


class _Seen(logging.Handler):
    """Sets `event` when a record whose message starts with `prefix` is logged."""

    def __init__(self, prefix: str) -> None:
        super().__init__(logging.WARNING)
        self.prefix = prefix
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


def test_opening_a_store_waits_out_a_lock_released_within_write_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that opens the store while another one holds a long transaction (or recovers
    # a WAL a killed process left) must not fail after one attempt's busy wait: it is
    # retried up to `write_timeout`, as writes are (the crash loop across processes met it).
    from steerable.actors._stores import sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_ATTEMPT_BUSY", 0.05)  # one attempt: 50 ms
    path = tmp_path / "runs.db"
    SqliteStore(path).close()
    seen = _Seen("sqlite_open_retry")
    logger = logging.getLogger("steerable.sqlite")
    logger.addHandler(seen)
    locker = Locker(path)
    locker.hold()
    opened: list[SqliteStore | BaseException] = []

    def open_it() -> None:
        try:
            opened.append(SqliteStore(path, write_timeout=WAIT))
        except BaseException as exc:
            opened.append(exc)

    opener = threading.Thread(target=open_it)
    try:
        opener.start()
        assert seen.event.wait(WAIT)  # an attempt failed on the lock and is being retried
        locker.release()
        opener.join(WAIT)
        assert not opener.is_alive()
        (store,) = opened
        assert isinstance(store, SqliteStore)
        store.close()
    finally:
        logger.removeHandler(seen)
        locker.release()
        opener.join(WAIT)


# --------------------------------------------------------------------------- read-only (item 7)


def test_a_read_only_file_system_is_refused_when_the_store_is_opened(tmpfs: Tmpfs) -> None:
    folder = tmpfs.mount("1m")
    path = folder / "runs.db"
    first = SqliteStore(path)
    first.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=1), 0, notes("r", 0, 1))
    first.close()
    tmpfs.read_only(folder)
    started = time.monotonic()
    with pytest.raises(SteerableError) as raised:
        SqliteStore(path)
    assert time.monotonic() - started < WAIT / 3
    assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
    assert raised.value.error.details["path"] == str(path)
    with pytest.raises(SteerableError) as created:
        SqliteStore(folder / "new" / "runs.db")  # cannot even create its folder
    assert created.value.code is ErrorCode.STORE_UNAVAILABLE


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a 0444 file: not read-only for root")
def test_a_read_only_file_or_folder_is_refused_when_the_store_is_opened(tmp_path: Path) -> None:
    # As root (CI), the read-only file system above covers this; file modes bind other users.
    path = tmp_path / "runs.db"
    SqliteStore(path).close()
    os.chmod(path, 0o444)
    try:
        with pytest.raises(SteerableError) as raised:
            SqliteStore(path)
        assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
    finally:
        os.chmod(path, 0o600)
    locked_dir = tmp_path / "ro"
    locked_dir.mkdir()
    os.chmod(locked_dir, 0o555)
    try:
        with pytest.raises(SteerableError) as raised:
            SqliteStore(locked_dir / "runs.db")
        assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
    finally:
        os.chmod(locked_dir, 0o755)


# --------------------------------------------------------------------------- file modes (item 5)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_files_are_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg" / "share"))
    monkeypatch.delenv("STEERABLE_DB", raising=False)
    path = default_db_path()
    assert path == tmp_path / "xdg" / "share" / "steerable" / "runs.db"
    old = os.umask(0o000)  # the most permissive umask: nothing is masked
    try:
        store = SqliteStore(path)
        try:
            store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=1), 0, notes("r", 0, 1))
            assert store.flush(WAIT)
            reader = sqlite3.connect(path)  # a second connection: -wal and -shm exist
            try:
                assert reader.execute("SELECT count(*) FROM runs").fetchone() == (1,)
                for suffix in ("", "-wal", "-shm"):
                    assert _mode(Path(f"{path}{suffix}")) == 0o600, suffix
            finally:
                reader.close()
        finally:
            store.close()
    finally:
        os.umask(old)
    # Every folder the store created is 0700 (XDG base-directory spec); tmp_path is not ours.
    for folder in (path.parent, path.parent.parent, path.parent.parent.parent):
        assert _mode(folder) == 0o700, folder


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.touch(mode=0o640)
    os.chmod(path, 0o640)
    SqliteStore(path).close()
    assert _mode(path) == 0o640
