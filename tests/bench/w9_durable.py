"""W9: durable steering, `send()` throughput into live runs.

Four runs are busy in a tool (waiting on an event); 1 or 4 host threads send messages
(mode "queue", round-robin over the runs) as fast as `send()` returns. With `SqliteStore` each
message is committed before `send()` returns. Figure: messages accepted per second. Then the
tools are released and every run must see all its messages at its next boundary and finish.
Also with the in-memory store (not durable). Floors: raw sqlite3 INSERT + COMMIT per message
(WAL, synchronous=NORMAL, one thread), and a `queue.Queue` with a consumer thread.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from typing import Any

import msgpack

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import Finish, Plan, RunState, RunView, SteerableError, ToolCall

from ._common import (
    NO_POSTGRES,
    Result,
    cpu_note,
    drop_postgres_schema,
    expect,
    metric,
    not_available,
    postgres_dsn,
    postgres_schema,
    sqlite_available,
    sqlite_store,
    temp_dir,
)

RUNS = 4
_release = threading.Event()


@tool
def hold(ctx: ToolContext) -> str:
    """Keep the run busy until the bench releases it (or the call is cancelled)."""
    while not _release.wait(0.05):
        ctx.raise_if_cancelled()
    return "released"


class CountingAgent:
    """Plans one `hold` call; then finishes with the number of messages it was given."""

    name = "w9"

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        if self.calls == 1:
            return Plan(steps=(ToolCall(name="hold"),))
        return Finish(output=len(view.delivered))


def messages_for(quick: bool) -> int:
    """Messages per measurement: 4,000 (quick: 200)."""
    return 200 if quick else 4000


def _send_all(rt: Runtime, total: int, senders: int) -> float:
    _release.clear()
    handles = [rt.start("w9", agent=CountingAgent()) for _ in range(RUNS)]
    deadline = time.monotonic() + 10
    while any(h.state is not RunState.RUNNING for h in handles):
        expect(time.monotonic() < deadline, "W9: runs did not start")
        time.sleep(0.005)
    time.sleep(0.05)  # the tools are running
    per_sender = total // senders
    errors: list[BaseException] = []

    def send(k: int) -> None:
        try:
            for i in range(per_sender):
                handles[(k + i) % RUNS].send(f"message {k}/{i}", mode="queue")
        except (SteerableError, OSError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = per_sender * senders / (time.perf_counter() - t0)
    expect(not errors, f"W9: send() failed: {errors[:1]}")
    _release.set()
    outs = [h.result(timeout=60) for h in handles]
    expect(all(o.state is RunState.FINISHED for o in outs), f"W9: {[o.state for o in outs]}")
    delivered = sum(o.metrics.messages_delivered for o in outs)
    expect(delivered == per_sender * senders, f"W9: {delivered} of {total} messages delivered")
    return rate


def _measure(store_factory: Any, quick: bool) -> dict[str, Any]:
    total = messages_for(quick)
    reps = 1 if quick else 3
    metrics = {}
    for senders in (1, 4):
        rates = []
        for rep in range(reps + (0 if quick else 1)):
            with Runtime(store=store_factory(), tools=[hold]) as rt:
                rate = _send_all(rt, total if rep or quick else total // 4, senders)
            if rep or quick:
                rates.append(rate)
        metrics[f"msgs_per_s_{senders}_sender{'s' if senders > 1 else ''}"] = metric(
            rates, "msg/s", better="higher"
        )
    return metrics


def case_sqlite(quick: bool) -> Result:
    """send() into runs backed by SqliteStore (each message committed before it returns)."""
    if not sqlite_available():
        return not_available("steerable.actors.SqliteStore does not exist yet")
    with temp_dir() as d:
        counter = iter(range(1000))
        metrics = _measure(lambda: sqlite_store(d / f"w9-{next(counter)}.db"), quick)
    return {"metrics": metrics, "config": "SqliteStore(tmp file), 4 busy runs", "info": cpu_note()}


def case_memory(quick: bool) -> Result:
    """send() into runs with the default MemoryStore."""
    metrics = _measure(lambda: None, quick)
    return {"metrics": metrics, "config": "MemoryStore, 4 busy runs", "info": cpu_note()}


def case_floors(quick: bool) -> Result:
    """Floors: raw sqlite3 INSERT+COMMIT per message; a queue.Queue with a consumer thread."""
    total = messages_for(quick)
    body = msgpack.packb({"kind": "user", "seq": 0, "content": "message 0/0", "mode": "queue"})
    sqlite_rates = []
    with temp_dir() as d:
        for rep in range(2 if quick else 4):
            conn = sqlite3.connect(d / f"floor-{rep}.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE inbox (run_id TEXT, seq INTEGER, message BLOB, "
                "PRIMARY KEY (run_id, seq)) WITHOUT ROWID"
            )
            t0 = time.perf_counter()
            for i in range(total):
                conn.execute("BEGIN")
                conn.execute("INSERT INTO inbox VALUES (?,?,?)", (f"run{i % RUNS}", i, body))
                conn.execute("COMMIT")
            sqlite_rates.append(total / (time.perf_counter() - t0))
            conn.close()
    queue_rates = []
    for _ in range(2 if quick else 4):
        inbox: queue.Queue[Any] = queue.Queue()

        def consume(inbox: queue.Queue[Any] = inbox) -> None:
            while inbox.get() is not None:
                pass

        consumer = threading.Thread(target=consume)
        consumer.start()
        t0 = time.perf_counter()
        for i in range(total):
            inbox.put((i, body))
        queue_rates.append(total / (time.perf_counter() - t0))
        inbox.put(None)
        consumer.join()
    return {
        "metrics": {
            "sqlite_commit_per_msg": metric(sqlite_rates[1:], "msg/s", better="higher"),
            "queue_put": metric(queue_rates[1:], "msg/s", better="higher"),
        }
    }


def case_postgres(quick: bool) -> Result:
    """send() into runs backed by PostgresStore (each message committed before it returns)."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    from steerable.actors import PostgresStore

    schema = postgres_schema("w9")
    try:
        metrics = _measure(lambda: PostgresStore(dsn, schema=schema), quick)
    finally:
        drop_postgres_schema(schema)
    return {
        "metrics": metrics,
        "config": "PostgresStore(local socket), 4 busy runs",
        "info": cpu_note(),
    }


def case_floors_postgres(quick: bool) -> Result:
    """Floor: INSERT + COMMIT per message on the same server (psycopg, 1 and 4 threads)."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    import psycopg

    total = messages_for(quick)
    body = msgpack.packb({"kind": "user", "seq": 0, "content": "message 0/0", "mode": "queue"})
    schema = postgres_schema("w9floor")
    rates: dict[int, list[float]] = {1: [], 4: []}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}".encode())
            conn.execute(
                f"CREATE TABLE {schema}.inbox (run_id text, seq bigint, message bytea, "
                "PRIMARY KEY (run_id, seq))".encode()
            )
        for threads in (1, 4):
            for rep in range(2 if quick else 4):
                conns = [psycopg.connect(dsn, autocommit=True) for _ in range(threads)]
                per = total // threads

                def insert(k: int, run: str, conns: list[Any] = conns, per: int = per) -> None:
                    c = conns[k]
                    for i in range(per):
                        with c.transaction():
                            c.execute(
                                f"INSERT INTO {schema}.inbox VALUES (%s,%s,%s)".encode(),
                                (run, i, body),
                            )

                workers = [
                    threading.Thread(target=insert, args=(k, f"run{k}-{rep}-{threads}"))
                    for k in range(threads)
                ]
                t0 = time.perf_counter()
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                rates[threads].append(per * threads / (time.perf_counter() - t0))
                for c in conns:
                    c.close()
    finally:
        drop_postgres_schema(schema)
    return {
        "metrics": {
            "pg_commit_per_msg": metric(rates[1][1:], "msg/s", better="higher"),
            "pg_commit_per_msg_4": metric(rates[4][1:], "msg/s", better="higher"),
        }
    }


CASES = {
    "sqlite": case_sqlite,
    "memory": case_memory,
    "floors": case_floors,
    "postgres": case_postgres,
    "floors_postgres": case_floors_postgres,
}
