"""W10pg and W11pg: cross-host steering and takeover on PostgreSQL (processes stand for hosts).

    python -m tests.bench.w10_postgres [--messages N] [--kills K]   (needs STEERABLE_PG_DSN)

W10pg: process A (`--owner`) owns a run whose agent asks again after every message and prints
`seen <k> <time.monotonic()>` when message k reaches its view; this process (B) sends each with
`rt.send` and notes `time.monotonic()` just before (both processes share the machine's
monotonic clock). Once with the NOTIFY listener as it is, once with A's listener connection
killed before every message (the poll fallback and the rescan after reconnect deliver).
Floor: a bare INSERT + COMMIT with NOTIFY in B, received by a LISTEN connection in A.

W11pg: K times, a driver process (tests/crash_drivers/owner_driver.py) starts 10 runs held in
their first call and is SIGKILLed; an adopting process reports each run adopted; the figure is
kill -> adoption per run, against the lease TTL (1 s here), and every run must be adopted
exactly once. In `just bench` as W10pg and W11pg (the cases below); run alone, it prints the
figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from steerable.actors import PostgresStore, Runtime
from steerable.protocol import AskUser, Finish, RunConfig, RunView

from ._common import (
    NO_POSTGRES,
    Metric,
    Result,
    drop_postgres_schema,
    expect,
    metric,
    not_available,
    postgres_dsn,
    postgres_schema,
)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "crash_drivers" / "owner_driver.py"


class Echo:
    """Asks until it saw `total` messages; prints each as it reaches its view."""

    name = "echo"

    def __init__(self, total: int) -> None:
        self.total = total
        self.seen = 0

    def decide(self, view: RunView) -> Any:
        now = time.monotonic()
        for _ in view.delivered:
            print("seen", self.seen, now, flush=True)
            self.seen += 1
        if self.seen >= self.total:
            return Finish(output=self.seen)
        return AskUser(question="next?")


POLL_INTERVAL = 0.25
"""The owner's polling fallback (the NOTIFY is only a hint): the bound with its listener killed."""

TTL = 1.0


def owner(dsn: str, schema: str, total: int) -> None:
    with Runtime(store=PostgresStore(dsn, schema=schema, poll_interval=POLL_INTERVAL)) as rt:
        config = RunConfig(max_model_calls=total + 10, max_steps=total + 10)
        handle = rt.start("w10", agent=Echo(total), config=config)
        handle._cell.stored.wait(30.0)
        rt.store.flush()
        print("run", handle.run_id, flush=True)
        handle.result(600.0)


def floor(dsn: str, channel: str, total: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}".encode())
        print("ready", flush=True)
        for k, _ in enumerate(conn.notifies(stop_after=total)):
            print("seen", k, time.monotonic(), flush=True)


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


def steering(dsn: str, n: int, kill_listener: bool) -> list[float]:
    import psycopg

    schema = postgres_schema("w10")
    child = [sys.executable, "-m", "tests.bench.w10_postgres"]
    proc = subprocess.Popen(
        [*child, "--owner", dsn, schema, str(n)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    latencies = []
    try:
        run_id = proc.stdout.readline().split()[1]
        with (
            Runtime(store=PostgresStore(dsn, schema=schema)) as rt,
            psycopg.connect(dsn, autocommit=True) as admin,
        ):
            for k in range(n):
                if kill_listener:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name='steerable-listen' AND pid <> pg_backend_pid()"
                    )
                sent = time.monotonic()
                rt.send(run_id, f"m{k}", message_id=f"w10-{k}")
                _, seen_k, at = proc.stdout.readline().split()
                assert int(seen_k) == k
                latencies.append(float(at) - sent)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        drop_postgres_schema(schema)
    return latencies


def steering_floor(dsn: str, n: int) -> list[float]:
    import psycopg

    schema = postgres_schema("w10floor")
    channel = f"{schema}_floor"
    child = [sys.executable, "-m", "tests.bench.w10_postgres"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
        conn.execute(f"CREATE TABLE {schema}.t (k int)".encode())
        proc = subprocess.Popen(
            [*child, "--floor", dsn, channel, str(n)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        out = []
        for k in range(n):
            sent = time.monotonic()
            with conn.transaction():
                conn.execute(f"INSERT INTO {schema}.t VALUES (%s)".encode(), (k,))
                conn.execute("SELECT pg_notify(%s, 'x')", (channel,))
            _, _, at = proc.stdout.readline().split()
            out.append(float(at) - sent)
        proc.wait(60)
        proc.stdout.close()
    drop_postgres_schema(schema)
    return out


def takeover(kills: int, runs: int = 10, ttl: float = 1.0) -> list[float]:
    schema = postgres_schema("w11")
    PostgresStore(postgres_dsn() or "", schema=schema).close()
    work = Path(tempfile.mkdtemp(prefix="w11-"))
    delays: list[float] = []

    def spawn(role: str, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), f"pg:{schema}", str(work / "journal.txt"), str(ttl),
             role, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def until(proc: subprocess.Popen[str], word: str) -> list[str]:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"driver exited before {word!r}"
            if line.split()[0] == word:
                return line.split()

    try:
        for _ in range(kills):
            starter = spawn("start", str(runs))
            ids = [until(starter, "run")[1] for _ in range(runs)]
            until(starter, "ready")
            adopter = spawn("adopt")
            until(adopter, "up")
            starter.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            starter.wait(60)
            seen: dict[str, float] = {}
            ended: set[str] = set()
            assert adopter.stdout is not None
            while len(seen) < runs or len(ended) < runs:  # every run adopted, and finished
                words = adopter.stdout.readline().split()
                assert words, "the adopter exited"
                if words[0] == "adopted":
                    assert words[1] in ids, f"adopted a run of another round: {words[1]}"
                    assert words[1] not in seen, f"adopted twice: {words[1]}"
                    seen[words[1]] = float(words[2]) - killed
                elif words[0] == "ended":
                    ended.add(words[1])
            delays.extend(seen.values())
            adopter.send_signal(signal.SIGKILL)
            adopter.wait(60)
            for proc in (starter, adopter):
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        stream.close()
    finally:
        drop_postgres_schema(schema)
    return delays


def _ms(values: list[float]) -> Metric:
    return metric([v * 1e3 for v in values], "ms")


def case_steerable(quick: bool) -> Result:
    """W10pg: rt.send in B -> the agent's view in A, NOTIFY listener as it is."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    n = 20 if quick else 200
    return {
        "metrics": {"send_to_view_ms": _ms(steering(dsn, n, kill_listener=False))},
        "config": "PostgresStore (local socket), two processes",
    }


def case_listener_killed(quick: bool) -> Result:
    """W10pg with A's listener connection terminated before every message (poll fallback)."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    n = 5 if quick else 30
    return {
        "metrics": {"send_to_view_ms": _ms(steering(dsn, n, kill_listener=True))},
        "config": f"PostgresStore, poll_interval={POLL_INTERVAL}",
    }


def case_floor(quick: bool) -> Result:
    """Floor: INSERT + COMMIT with NOTIFY in B, received by a LISTEN connection in A."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    return {"metrics": {"commit_to_notice_ms": _ms(steering_floor(dsn, 20 if quick else 200))}}


def case_takeover(quick: bool) -> Result:
    """W11pg: the owner of 10 runs SIGKILLed, an adopting process; every run adopted once."""
    if postgres_dsn() is None:
        return not_available(NO_POSTGRES)
    kills, runs = (2, 3) if quick else (50, 10)
    delays = takeover(kills, runs, TTL)
    expect(len(delays) == kills * runs, f"W11pg: {len(delays)} of {kills * runs} runs adopted")
    return {
        "metrics": {
            "takeover_ms": _ms(delays),
            "takeover_per_ttl": metric([d / TTL for d in delays], "x TTL"),
        },
        "config": f"PostgresStore, lease_ttl={TTL}, {kills} kills x {runs} runs",
    }


CASES = {
    "steerable": case_steerable,
    "listener_killed": case_listener_killed,
    "floor": case_floor,
    "takeover": case_takeover,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    dsn = postgres_dsn()
    if dsn is None:
        print("W10pg/W11pg: not available (STEERABLE_PG_DSN is not set)")
        return
    n = args.messages
    for label, values in (
        ("W10pg rt.send B -> agent view A", steering(dsn, n, kill_listener=False)),
        ("W10pg, A's listener killed before each", steering(dsn, max(10, n // 10), True)),
        ("W10pg floor, commit+NOTIFY B -> LISTEN A", steering_floor(dsn, n)),
    ):
        p50, p99 = percentiles(values)
        print(f"{label}: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms ({len(values)} messages)")
    delays = takeover(args.kills)
    p50, p99 = percentiles(delays)
    print(
        f"W11pg SIGKILL -> adopted: p50 {p50:.2f} s, max {max(delays):.2f} s "
        f"({len(delays)} runs, {args.kills} kills; lease TTL 1 s, target <= TTL + 1 s)"
    )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--owner":
        owner(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--floor":
        floor(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
