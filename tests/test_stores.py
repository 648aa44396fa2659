"""The `CheckpointStore` contract (R21, R24, R25), held by `MemoryStore`, `SqliteStore` and
`PostgresStore` alike.

Every contract test runs against every store (the parametrised `store` fixture; PostgreSQL
in a fresh schema of the test server, tests/pg_kit.py); tests named
`test_sqlite_*` cover what only the durable store has: reopening a file, its schema version,
group commit under many writer threads, and a writer process killed with SIGKILL in the middle
of its transactions (no checkpoint is ever half-written).
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import CheckpointStore, MemoryStore, SqliteStore
from steerable.actors._stores.sqlite import SCHEMA_VERSION
from steerable.protocol import (
    CallStatus,
    CapabilitySnapshot,
    ErrorCode,
    PlannedCall,
    RunConfig,
    RunSnapshot,
    RunState,
    SteerableError,
    SystemNote,
    ToolResult,
    TranscriptEntry,
    UserMessage,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.pg_kit (explicit package bases)
    from tests.pg_kit import pg_store
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import pg_store

DRIVERS = Path(__file__).parent / "crash_drivers"
WAIT = 30.0  # generous fail-instead-of-hang bound for subprocesses


# --------------------------------------------------------------------------- helpers


def snapshot(
    run_id: str,
    revision: int,
    *,
    transcript_len: int,
    state: RunState = RunState.RUNNING,
    last_seq: int = -1,
    plan: Sequence[str] = (),
    task: str = "the task",
    parent_run_id: str | None = None,
    updated_at: float = 0.0,
) -> dict[str, Any]:
    """A valid `RunSnapshot` body, as the run machine hands it to `write_checkpoint`."""
    return RunSnapshot(
        run_id=run_id,
        revision=revision,
        trace_id="ab" * 16,
        task=task,
        agent="agent",
        state=state,
        config=RunConfig(max_steps=7),
        capabilities=CapabilitySnapshot(tools={"t": "1:none:x"}, agents={"agent": "1"}),
        transcript_len=transcript_len,
        last_seq=last_seq,
        plan=tuple(
            PlannedCall(
                call_id=cid,
                kind="tool",
                name="t",
                idempotency_key=f"idem_{cid}",
                status=CallStatus.RUNNING,
                attempts=1,
            )
            for cid in plan
        ),
        parent_run_id=parent_run_id,
        updated_at=updated_at,
    ).model_dump(mode="json")


def notes(run_id: str, start: int, count: int) -> list[TranscriptEntry]:
    """`count` transcript entries whose text says where they belong."""
    return [SystemNote(text=f"{run_id}/{i}") for i in range(start, start + count)]


def texts(transcript: Sequence[TranscriptEntry]) -> list[str]:
    out = []
    for entry in transcript:
        assert isinstance(entry, SystemNote)
        out.append(entry.text)
    return out


def message(seq: int, content: str = "") -> UserMessage:
    return UserMessage(seq=seq, content=content or f"m{seq}", at=float(seq))


def result(call_id: str, value: str = "v") -> ToolResult:
    return ToolResult(call_id=call_id, tool="t", ok=True, value=value)


def write_revisions(store: CheckpointStore, run_id: str, revisions: int, per: int = 2) -> None:
    """Revisions 0..revisions-1 of a run, each adding `per` entries."""
    for rev in range(revisions):
        store.write_checkpoint(
            run_id,
            rev,
            snapshot(run_id, rev, transcript_len=(rev + 1) * per, updated_at=float(rev)),
            rev * per,
            notes(run_id, rev * per, per),
        )


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """A store of `kind` ("memory", "sqlite", "postgres": a fresh schema on the test server)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp_path / "runs.db")
    return pg_store(request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    """Each contract test runs against every store."""
    made = make_store(request.param, request, tmp_path)
    try:
        yield made
    finally:
        made.close()


# --------------------------------------------------------------------------- the contract


def test_round_trip_at_the_latest_and_at_older_revisions(store: CheckpointStore) -> None:
    write_revisions(store, "run_a", 4, per=3)
    latest = store.load("run_a")
    assert latest.snapshot.revision == 3
    assert latest.snapshot.run_id == "run_a"
    assert latest.snapshot.task == "the task"
    assert latest.snapshot.config == RunConfig(max_steps=7)
    assert latest.snapshot.capabilities.tools == {"t": "1:none:x"}
    assert texts(latest.transcript) == [f"run_a/{i}" for i in range(12)]
    for rev in range(4):
        older = store.load("run_a", rev)
        assert older.snapshot.revision == rev
        assert older.snapshot.transcript_len == (rev + 1) * 3
        assert texts(older.transcript) == [f"run_a/{i}" for i in range((rev + 1) * 3)]
    assert store.load("run_a", 3).snapshot == latest.snapshot


def test_entries_are_appended_from_entries_from(store: CheckpointStore) -> None:
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=2), 0, notes("r", 0, 2))
    # Revision 1 adds nothing: the transcript is unchanged.
    store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=2), 2, [])
    store.write_checkpoint("r", 2, snapshot("r", 2, transcript_len=5), 2, notes("r", 2, 3))
    assert texts(store.load("r").transcript) == [f"r/{i}" for i in range(5)]
    assert texts(store.load("r", 1).transcript) == ["r/0", "r/1"]
    # A resumed run rewrites from its snapshot's length: entries past it are replaced.
    store.write_checkpoint(
        "r",
        3,
        snapshot("r", 3, transcript_len=6),
        4,
        [SystemNote(text="again/4"), SystemNote(text="again/5")],
    )
    assert texts(store.load("r").transcript) == ["r/0", "r/1", "r/2", "r/3", "again/4", "again/5"]
    assert texts(store.load("r", 0).transcript) == ["r/0", "r/1"]


def test_journal_is_kept_until_a_boundary_with_an_empty_plan(store: CheckpointStore) -> None:
    store.write_checkpoint(
        "r", 0, snapshot("r", 0, transcript_len=1, plan=["c1.0", "c1.1"]), 0, notes("r", 0, 1)
    )
    store.journal("r", result("c1.0", "first"))
    store.flush()
    loaded = store.load("r")
    assert list(loaded.journal) == ["c1.0"]
    assert loaded.journal["c1.0"] == result("c1.0", "first")
    # A checkpoint whose plan is still open keeps the journal...
    store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=1, plan=["c1.0", "c1.1"]), 1, [])
    store.journal("r", result("c1.1", "second"))
    assert sorted(store.load("r").journal) == ["c1.0", "c1.1"]
    # ...older revisions never carry it (it belongs to the latest state)...
    assert store.load("r", 0).journal == {}
    # ...and the boundary after the plan (its results now in the transcript) clears it.
    store.write_checkpoint(
        "r",
        2,
        snapshot("r", 2, transcript_len=3),
        1,
        [result("c1.0", "first"), result("c1.1", "second")],
    )
    assert store.load("r").journal == {}


def test_inbox_messages_after_the_snapshot_last_seq_in_order(store: CheckpointStore) -> None:
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
    for seq in range(4):
        store.append_message("r", message(seq))
    # Nothing applied yet: every message is pending.
    assert [m.seq for m in store.load("r").messages] == [0, 1, 2, 3]
    store.write_checkpoint(
        "r", 1, snapshot("r", 1, transcript_len=2, last_seq=1), 0, [message(0), message(1)]
    )
    loaded = store.load("r")
    assert loaded.messages == [message(2), message(3)]
    assert [e.seq for e in loaded.transcript if isinstance(e, UserMessage)] == [0, 1]
    # An older revision is history: no pending inbox.
    assert store.load("r", 0).messages == []


def test_reload_is_load_for_any_held_prefix_of_the_transcript(store: CheckpointStore) -> None:
    # A woken run hands back the transcript it held when it parked: the store may skip those
    # entries, but what it returns is what `load` returns (docs/durability.md, "Passivation").
    write_revisions(store, "r", 3, per=2)
    store.journal("r", result("c1.0", "late"))
    store.append_message("r", message(0))
    store.flush()
    full = store.load("r")
    assert len(full.transcript) == 6
    for held in (0, 1, 5, 6):
        got = store.reload("r", list(full.transcript[:held]))
        assert got.snapshot == full.snapshot
        assert list(got.transcript) == list(full.transcript)
        assert got.journal == full.journal == {"c1.0": result("c1.0", "late")}
        assert got.messages == full.messages == [message(0)]
    # A held list longer than the stored transcript is not this revision's: it is not trusted.
    longer = [*full.transcript, SystemNote(text="never stored")]
    assert texts(store.reload("r", longer).transcript) == texts(full.transcript)
    with pytest.raises(SteerableError) as info:
        store.reload("nope", [])
    assert info.value.code is ErrorCode.NOT_FOUND


def test_revisions_lists_every_revision_oldest_first(store: CheckpointStore) -> None:
    write_revisions(store, "r", 3)
    store.write_checkpoint(
        "r", 3, snapshot("r", 3, transcript_len=6, state=RunState.FINISHED, updated_at=9.0), 6, []
    )
    infos = store.revisions("r")
    assert [(i.run_id, i.revision, i.state, i.transcript_len) for i in infos] == [
        ("r", 0, RunState.RUNNING, 2),
        ("r", 1, RunState.RUNNING, 4),
        ("r", 2, RunState.RUNNING, 6),
        ("r", 3, RunState.FINISHED, 6),
    ]
    assert [i.updated_at for i in infos] == [0.0, 1.0, 2.0, 9.0]


def test_runs_lists_every_run_at_its_latest_revision(store: CheckpointStore) -> None:
    assert store.runs() == []
    write_revisions(store, "run_b", 2)
    store.write_checkpoint(
        "run_a",
        0,
        snapshot("run_a", 0, transcript_len=0, task="other", parent_run_id="run_b"),
        0,
        [],
    )
    store.write_checkpoint(
        "run_a",
        1,
        snapshot(
            "run_a",
            1,
            transcript_len=0,
            task="other",
            parent_run_id="run_b",
            state=RunState.WAITING,
        ),
        0,
        [],
    )
    runs = store.runs()
    assert [(r.run_id, r.state, r.revision, r.task, r.agent, r.parent_run_id) for r in runs] == [
        ("run_a", RunState.WAITING, 1, "other", "agent", "run_b"),
        ("run_b", RunState.RUNNING, 1, "the task", "agent", None),
    ]


def test_unknown_runs_and_revisions_are_not_found(store: CheckpointStore) -> None:
    write_revisions(store, "r", 2)
    for call in (
        lambda: store.load("nope"),
        lambda: store.load("r", 2),
        lambda: store.load("r", 99),
        lambda: store.revisions("nope"),
    ):
        with pytest.raises(SteerableError) as info:
            call()
        assert info.value.code is ErrorCode.NOT_FOUND
    # A message for a run with no checkpoint yet does not make the run loadable.
    store.append_message("ghost", message(0))
    with pytest.raises(SteerableError) as ghost:
        store.load("ghost")
    assert ghost.value.code is ErrorCode.NOT_FOUND


def test_flush_and_close_are_idempotent(store: CheckpointStore) -> None:
    write_revisions(store, "r", 2)
    assert store.flush() is True
    assert store.flush(timeout=5.0) is True
    store.close()
    store.close()
    assert store.flush() is True  # after close: nothing left to wait for


def test_many_writer_threads_lose_nothing(store: CheckpointStore) -> None:
    threads, runs_per_thread, revisions = 8, 6, 15
    barrier = threading.Barrier(threads)
    failures: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            barrier.wait(WAIT)
            for rev in range(revisions):
                for k in range(runs_per_thread):
                    run_id = f"run_{t:02d}_{k:02d}"
                    store.write_checkpoint(
                        run_id,
                        rev,
                        snapshot(run_id, rev, transcript_len=rev + 1, last_seq=rev - 1, plan=["c"]),
                        rev,
                        notes(run_id, rev, 1),
                    )
                    store.journal(run_id, result("c", f"{run_id}@{rev}"))
                    store.append_message(run_id, message(rev))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(WAIT)
    assert not failures
    assert store.flush(timeout=WAIT)
    runs = store.runs()
    assert len(runs) == threads * runs_per_thread
    for summary in runs:
        run_id = summary.run_id
        assert summary.revision == revisions - 1
        loaded = store.load(run_id)
        assert texts(loaded.transcript) == [f"{run_id}/{i}" for i in range(revisions)]
        journaled = loaded.journal["c"]
        assert isinstance(journaled, ToolResult)
        assert journaled.value == f"{run_id}@{revisions - 1}"
        # last_seq of the latest snapshot is revisions - 2: exactly the last message pends.
        assert [m.seq for m in loaded.messages] == [revisions - 1]
        assert [i.revision for i in store.revisions(run_id)] == list(range(revisions))


# --------------------------------------------------------------------------- SqliteStore only


def test_sqlite_store_is_exported_from_steerable_actors() -> None:
    # docs/contract.md "Running": `from steerable.actors import Runtime, SqliteStore`.
    import steerable.actors

    assert getattr(steerable.actors, "SqliteStore", None) is SqliteStore


def test_durable_flags() -> None:
    assert MemoryStore.durable is False
    assert SqliteStore.durable is True


def test_sqlite_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "folder" / "runs.db"
    first = SqliteStore(path)
    write_revisions(first, "r", 3)
    first.write_checkpoint("r", 3, snapshot("r", 3, transcript_len=6, plan=["c"]), 6, [])
    first.journal("r", result("c"))
    first.append_message("r", message(0))
    first.close()
    second = SqliteStore(path)
    try:
        loaded = second.load("r")
        assert loaded.snapshot.revision == 3
        assert texts(loaded.transcript) == [f"r/{i}" for i in range(6)]
        assert list(loaded.journal) == ["c"]
        assert loaded.messages == [message(0)]
        # The same process may go on writing revisions of a reopened run.
        second.write_checkpoint("r", 4, snapshot("r", 4, transcript_len=7), 6, notes("r", 6, 1))
        assert texts(second.load("r").transcript)[-1] == "r/6"
        assert [r.revision for r in second.runs()] == [4]
    finally:
        second.close()


def test_sqlite_reload_reads_only_the_entries_past_the_held_prefix(tmp_path: Path) -> None:
    # Entry 0 damaged on disk: `load` refuses it, `reload` with entry 0 held never reads it.
    store = SqliteStore(tmp_path / "runs.db")
    try:
        write_revisions(store, "r", 2, per=2)
        held = list(store.load("r").transcript[:3])
        store.flush()
        with sqlite3.connect(tmp_path / "runs.db") as conn:
            conn.execute("UPDATE entries SET crc=crc+1 WHERE run_id='r' AND idx=0")
        with pytest.raises(SteerableError) as info:
            store.load("r")
        assert info.value.code is ErrorCode.CHECKPOINT_CORRUPT
        assert texts(store.reload("r", held).transcript) == [f"r/{i}" for i in range(4)]
    finally:
        store.close()


def test_sqlite_refuses_a_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),)
        )
    conn.close()
    with pytest.raises(SteerableError) as info:
        SqliteStore(path)
    assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert str(SCHEMA_VERSION + 1) in info.value.error.message
    # The same version (or an older one) still opens.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
    conn.close()
    SqliteStore(path).close()


def test_sqlite_writes_after_close_are_refused(tmp_path: Path) -> None:
    sqlite_store = SqliteStore(tmp_path / "runs.db")
    sqlite_store.close()
    with pytest.raises(SteerableError):
        sqlite_store.append_message("r", message(0))


def _check_whole(path: Path, runs: int) -> tuple[int, int]:
    """Every stored revision of every run loads with its complete transcript."""
    reader = SqliteStore(path)
    try:
        summaries = reader.runs()
        assert len(summaries) <= runs
        checked = 0
        for summary in summaries:
            infos = reader.revisions(summary.run_id)
            assert [i.revision for i in infos] == list(range(len(infos)))
            assert infos[-1].revision == summary.revision
            for info in infos:
                loaded = reader.load(summary.run_id, info.revision)
                n = loaded.snapshot.transcript_len
                assert n == (info.revision + 1) * 2
                assert texts(loaded.transcript) == [f"{summary.run_id}/{i}" for i in range(n)]
                checked += 1
        return len(summaries), checked
    finally:
        reader.close()


def test_sqlite_writer_killed_mid_transaction_leaves_no_half_written_checkpoint(
    tmp_path: Path,
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    path = tmp_path / "runs.db"
    runs = 6
    total_checked = 0
    for kill in range(5):
        proc = subprocess.Popen(
            [sys.executable, str(DRIVERS / "store_writer.py"), str(path), str(runs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            # Let it commit a random number of batches, then kill it wherever it stands.
            for _ in range(rng.randint(1, 4)):
                line = proc.stdout.readline()
                assert line.startswith("flushed"), (seed, line, proc.stderr)
            proc.send_signal(signal.SIGKILL)
            proc.wait(WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(WAIT)
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, f"seed={seed} kill={kill}"
        found, checked = _check_whole(path, runs)
        assert found == runs, f"seed={seed} kill={kill}"
        total_checked += checked
        # The next writer starts over from revision 0: remove the file.
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    assert total_checked > 0
