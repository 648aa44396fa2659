"""What only `PostgresStore` has: the optional extra, its schema (version, migrations, a foreign
schema refused), many hosts opening one database at once, connection failures as typed errors,
and the wake thread (LISTEN/NOTIFY, a lost notification delivered by the polling fallback, a
killed listener connection re-listened and rescanned). The contract it shares with the other
stores is tests/test_stores.py and tests/test_ownership.py (parametrized).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import PostgresStore, Runtime
from steerable.actors._stores.postgres_listen import LISTEN_APPLICATION
from steerable.actors._stores.postgres_schema import SCHEMA_VERSION
from steerable.actors.testing import wait_event
from steerable.protocol import ErrorCode, EventKind, RunState, SteerableError

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.pg_kit import admin, pg_store, require_dsn, terminate_backends
    from tests.test_ownership import asking_agent
    from tests.test_stores import message, notes, snapshot, texts, write_revisions
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import admin, pg_store, require_dsn, terminate_backends
    from test_ownership import asking_agent
    from test_stores import message, notes, snapshot, texts, write_revisions

WAIT = 30.0  # fail-instead-of-hang bound


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


# --------------------------------------------------------------------------- the extra


def test_importing_steerable_actors_does_not_import_psycopg() -> None:
    done = _python(
        "import sys, steerable.actors as a; "
        "assert a.PostgresStore.__name__ == 'PostgresStore'; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_the_extra_postgres_store_says_what_to_install() -> None:
    done = _python(
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "from steerable.actors import PostgresStore\n"
        "try:\n"
        "    PostgresStore('postgresql:///nowhere')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'steerable[postgres]'" in done.stdout


def test_durable_and_fencing() -> None:
    assert PostgresStore.durable is True
    assert PostgresStore.fences is True


# --------------------------------------------------------------------------- the schema


def test_a_second_store_object_reads_what_the_first_wrote(pg_schema: str) -> None:
    first = pg_store(pg_schema)
    write_revisions(first, "r", 3)
    first.write_checkpoint("r", 3, snapshot("r", 3, transcript_len=6, plan=["c"]), 6, [])
    first.append_message("r", message(0))
    first.close()
    second = pg_store(pg_schema)
    try:
        loaded = second.load("r")
        assert loaded.snapshot.revision == 3
        assert texts(loaded.transcript) == [f"r/{i}" for i in range(6)]
        assert loaded.messages == [message(0)]
        second.write_checkpoint("r", 4, snapshot("r", 4, transcript_len=7), 6, notes("r", 6, 1))
        assert texts(second.load("r").transcript)[-1] == "r/6"
        assert [r.revision for r in second.runs()] == [4]
    finally:
        second.close()


def test_reload_reads_only_the_entries_past_the_held_prefix(pg_schema: str) -> None:
    # Entry 0 damaged in the database: `load` refuses it, `reload` with entry 0 held in memory
    # never reads it (what makes waking a long run cost its new entries only).
    store = pg_store(pg_schema)
    try:
        write_revisions(store, "r", 2, per=2)
        held = list(store.load("r").transcript[:3])
        admin(f"UPDATE {pg_schema}.entries SET crc=crc+1 WHERE run_id='r' AND idx=0")
        with pytest.raises(SteerableError) as info:
            store.load("r")
        assert info.value.code is ErrorCode.CHECKPOINT_CORRUPT
        assert texts(store.reload("r", held).transcript) == [f"r/{i}" for i in range(4)]
        with pytest.raises(SteerableError) as info:
            store.reload("r", [])
        assert info.value.code is ErrorCode.CHECKPOINT_CORRUPT
    finally:
        store.close()


def test_a_newer_schema_is_refused_and_the_same_version_opens(pg_schema: str) -> None:
    pg_store(pg_schema).close()
    admin(
        f"UPDATE {pg_schema}.meta SET value=%s WHERE key='schema_version'",
        (str(SCHEMA_VERSION + 1),),
    )
    with pytest.raises(SteerableError) as info:
        pg_store(pg_schema)
    assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert str(SCHEMA_VERSION + 1) in info.value.error.message
    admin(
        f"UPDATE {pg_schema}.meta SET value=%s WHERE key='schema_version'", (str(SCHEMA_VERSION),)
    )
    pg_store(pg_schema).close()


def test_a_schema_holding_another_applications_tables_is_refused_unchanged(
    pg_schema: str,
) -> None:
    admin(f"CREATE SCHEMA {pg_schema}")
    admin(f"CREATE TABLE {pg_schema}.orders (id int PRIMARY KEY)")
    with pytest.raises(SteerableError) as info:
        pg_store(pg_schema)
    assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert info.value.error.details["reason"] == "foreign"
    tables = admin(
        "SELECT table_name FROM information_schema.tables WHERE table_schema=%s", (pg_schema,)
    )
    assert tables == [("orders",)]


def test_hosts_starting_together_create_the_schema_once(pg_schema: str) -> None:
    barrier = threading.Barrier(4)
    opened: list[PostgresStore] = []
    failures: list[BaseException] = []

    def open_one() -> None:
        try:
            barrier.wait(WAIT)
            opened.append(pg_store(pg_schema))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    try:
        assert not failures
        assert len(opened) == 4
        assert admin(f"SELECT value FROM {pg_schema}.meta") == [(str(SCHEMA_VERSION),)]
    finally:
        for store in opened:
            store.close()


def test_a_bad_schema_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="schema"):
        PostgresStore(require_dsn(), schema="Robert'); DROP TABLE runs;--")


def test_a_task_with_nul_is_listed_and_loaded(pg_schema: str) -> None:
    store = pg_store(pg_schema)
    try:
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0, task="a\x00b"), 0, [])
        assert store.load("r").snapshot.task == "a\x00b"  # the blob keeps it exactly
        assert store.runs()[0].task == "a\ufffdb"  # the listing column cannot hold NUL
    finally:
        store.close()


# --------------------------------------------------------------------------- failures


def test_an_unreachable_server_is_store_unavailable_without_the_password(tmp_path: object) -> None:
    started = time.monotonic()
    with pytest.raises(SteerableError) as info:
        PostgresStore(
            "postgresql://steerable:s3cret-pw@/steerable?host=/nonexistent-dir", write_timeout=0.5
        )
    assert info.value.code is ErrorCode.STORE_UNAVAILABLE
    assert "s3cret-pw" not in repr(info.value.error)
    assert time.monotonic() - started < WAIT


def test_writes_after_close_are_refused(pg_schema: str) -> None:
    store = pg_store(pg_schema)
    store.close()
    store.close()
    with pytest.raises(SteerableError):
        store.append_message("r", message(0))


def test_a_retried_send_with_the_same_message_id_is_one_message(pg_schema: str) -> None:
    store = pg_store(pg_schema)
    try:
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        first = store.submit_op("r", message(0, "hello"), "req-1")
        again = store.submit_op("r", message(0, "hello"), "req-1")
        other = store.submit_op("r", message(0, "other"))
        assert first == again == (0, 0)
        assert other == (0, 1)
        assert [getattr(m, "content", None) for m in store.load("r").messages] == [
            "hello",
            "other",
        ]
        with pytest.raises(ValueError, match="message_id"):
            store.submit_op("r", message(0), "bad\x00id")
    finally:
        store.close()


def test_concurrent_sends_to_an_unowned_run_get_distinct_seqs(pg_schema: str) -> None:
    # Every sender reads the same MAX(seq) at once; the losers of the unique index retry
    # (postgres_own.submit_op) instead of failing as store_unavailable.
    store = pg_store(pg_schema)
    senders, each = 6, 5
    start = threading.Barrier(senders)
    got: dict[str, int | None] = {}
    same: list[int | None] = []
    failed: list[BaseException] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        try:
            start.wait(WAIT)
            for i in range(each):
                _, seq = store.submit_op("r", message(0, f"m{n}-{i}"), f"id-{n}-{i}")
                with lock:
                    got[f"m{n}-{i}"] = seq
            _, seq = store.submit_op("r", message(0, "shared"), "shared-id")
            with lock:
                same.append(seq)
        except BaseException as exc:  # reported by the assertion below
            with lock:
                failed.append(exc)

    try:
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        threads = [threading.Thread(target=send, args=(n,)) for n in range(senders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not failed, failed
        total = senders * each + 1
        assert len(got) == senders * each
        assert len(set(same)) == 1
        assert len(same) == senders
        assert sorted([*got.values(), same[0]]) == list(range(total))  # type: ignore[type-var]
        stored = store.load("r").messages
        assert len(stored) == total
        for m in stored:
            content = getattr(m, "content", None)
            assert m.seq == (same[0] if content == "shared" else got[str(content)])
    finally:
        store.close()


# --------------------------------------------------------------------------- the wake thread


def _waiting_run(rt: Runtime) -> str:
    handle = rt.start("t", agent=asking_agent())
    wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
    rt.store.flush()
    return handle.run_id


def test_a_notify_wakes_the_owner_well_before_the_poll_interval(pg_schema: str) -> None:
    with (
        Runtime(store=pg_store(pg_schema, poll_interval=30.0)) as owner,
        Runtime(store=pg_store(pg_schema, poll_interval=30.0)) as other,
    ):
        run_id = _waiting_run(owner)
        handle = owner.handle(run_id)  # taken while it lives (an ended run has no live handle)
        sent = time.monotonic()
        other.send(run_id, "hello")
        assert handle.result(WAIT).output == ["hello"]
        assert time.monotonic() - sent < 30.0  # the NOTIFY did it, not the 30 s poll


def test_a_lost_notify_is_delivered_by_the_poll(pg_schema: str) -> None:
    poll = 0.5
    with (
        Runtime(store=pg_store(pg_schema, poll_interval=poll)) as owner,
        Runtime(store=pg_store(pg_schema)) as other,
    ):
        run_id = _waiting_run(owner)
        handle = owner.handle(run_id)
        other.store.channel = "steerable_ops_nobody"  # type: ignore[attr-defined]  # lost
        sent = time.monotonic()
        seq = other.send(run_id, "hello")
        assert seq >= 0
        assert handle.result(WAIT).output == ["hello"]
        assert time.monotonic() - sent < poll + WAIT / 10  # within the poll (load margin)


def test_a_killed_listener_re_listens_and_rescans(pg_schema: str) -> None:
    with (
        Runtime(store=pg_store(pg_schema, poll_interval=30.0)) as owner,
        Runtime(store=pg_store(pg_schema)) as other,
    ):
        store = owner.store
        assert isinstance(store, PostgresStore)
        watcher = store._watchers[0]
        assert watcher.listening.wait(WAIT)
        run_id = _waiting_run(owner)
        handle = owner.handle(run_id)
        assert terminate_backends(LISTEN_APPLICATION) >= 1  # both runtimes' listeners
        other.send(run_id, "while the listener was down")  # its NOTIFY may reach nobody
        assert handle.result(WAIT).output == ["while the listener was down"]
        deadline = time.monotonic() + WAIT
        while watcher.reconnects < 1 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert watcher.reconnects >= 1
        assert watcher.listening.wait(WAIT)


# --------------------------------------------------------------------------- stored events


def _record(seq: int, kind: EventKind = EventKind.CHECKPOINT) -> tuple[Any, ...]:
    return (seq, kind, None, float(seq), {"n": seq}, "r", None)


def test_stored_events_follow_the_documented_contract(pg_schema: str) -> None:
    store = pg_store(pg_schema)
    other = pg_store(pg_schema)
    try:
        with pytest.raises(SteerableError) as unknown:
            store.events("r")
        assert unknown.value.code is ErrorCode.NOT_FOUND
        assert store.next_event_seq("r") == 0
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        assert store.events("r") == []  # a known run with no event yet
        store.event_retention = 5
        store.append_events("r", "ab" * 16, [_record(i) for i in range(4)])
        store.append_events("r", "ab" * 16, [_record(i) for i in range(3, 8)])  # 3 again
        assert [e.seq for e in store.events("r")] == [3, 4, 5, 6, 7]  # the last 5 kept
        store.flush()
        events = other.events("r")  # another host reads them once committed
        assert [e.seq for e in events] == [3, 4, 5, 6, 7]  # the last 5 kept
        assert events[0].trace_id == "ab" * 16
        assert events[0].data == {"n": 3}
        assert events[0].kind is EventKind.CHECKPOINT
        assert [e.seq for e in other.events("r", start=5, limit=2)] == [5, 6]
        assert other.next_event_seq("r") == 8
        assert other.run_state("r") is RunState.RUNNING
    finally:
        store.close()
        other.close()


def test_a_fenced_out_store_stores_no_events(pg_schema: str) -> None:
    from steerable.actors._stores.lease import Owner

    first, second = pg_store(pg_schema), pg_store(pg_schema)
    fenced: list[str] = []
    first.add_fence_listener(fenced.append)
    try:
        a, b = Owner.new(), Owner.new()
        first.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        first.flush()
        first.claim("r", a, 30.0)
        second.claim("r", b, 30.0, force=True)
        first.append_events("r", "ab" * 16, [_record(0)])
        first.flush()
        assert fenced == ["r"]
        assert second.events("r") == []
    finally:
        first.close()
        second.close()
