"""The crash loop across processes: worker processes on one database, killed at random points.

Each iteration uses a fresh database. Three worker processes (tests/crash_drivers/
pool_driver.py) run at once, each a `Runtime(adopt_orphans=True, lease_ttl=1)` that adopts
the runs nobody holds and steers every unfinished run from outside with `rt.send(run_id, text,
message_id=text)`; the first starts the runs. The test SIGKILLs a random live worker after a
random delay, a few times per iteration (and workers kill themselves inside a tool, before or
after its effect, or right after a send), replacing each dead worker with a new one; then the
last workers run until every run finished. The workers' tools wait until the first kill is
made (the file `release`), so every iteration kills at least once mid-run. After
every kill, every stored revision of every run must load.

At the end, for every run: FINISHED; every message whose `send()` returned is in its final
transcript exactly once, in seq order (tests/test_crash.py's checks); every `write` effect at
most once per idempotency key and accounted for by the transcript; the epochs its revisions
were written with never decrease; and one owner at a time: ordered by time, the lease epochs
of its tool starts never decrease and each epoch belongs to one process.

The default keeps this file to about half a minute; `STEERABLE_CRASH_CYCLES=<n>` sets the
number of kill cycles (a random worker killed after a random delay; 4 per database) for a
long run (`STEERABLE_CRASH_SEED=<seed>` replays one: the seed is in every
failure message). The loop runs on a SQLite file and on PostgreSQL (a schema per iteration
of the server of $STEERABLE_PG_DSN; the workers stand for hosts sharing it).
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import tests.test_crash as crash
    from tests.pg_kit import IterationSchemas, admin, pg_store
    from tests.test_crash import Figures, check_final, check_revisions, read_lines
else:
    import test_crash as crash
    from pg_kit import IterationSchemas, admin, pg_store
    from test_crash import Figures, check_final, check_revisions, read_lines

DRIVER = Path(__file__).parent / "crash_drivers" / "pool_driver.py"
CYCLES = int(os.environ.get("STEERABLE_CRASH_CYCLES", "8"))
KILLS_PER_ITERATION = 4
WORKERS = 3
RUNS, WRITES, MESSAGES = 3, 4, 3  # as tests/test_crash.py checks them
PROCESS_WAIT = 120.0  # fail-instead-of-hang bound for one iteration's end


def store_arg(work: Path) -> str:
    """The workers' DB argument for an iteration's folder (the PostgreSQL case: `pg:SCHEMA`)."""
    return str(work / "runs.db")


def revision_epochs(work: Path) -> dict[str, list[tuple[int, int]]]:
    """(revision, epoch) of every stored revision, by run and revision."""
    conn = sqlite3.connect(work / "runs.db")
    try:
        out: dict[str, list[tuple[int, int]]] = {}
        for run_id, revision, epoch in conn.execute(
            "SELECT run_id, revision, epoch FROM revisions ORDER BY run_id, revision"
        ).fetchall():
            out.setdefault(run_id, []).append((revision, epoch))
        return out
    finally:
        conn.close()


@dataclass
class Pool:
    work: Path
    rng: random.Random
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    all: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ready: dict[int, int] = field(default_factory=dict)

    def spawn(
        self, kill: str, *, start: bool = False, wait: bool = True
    ) -> subprocess.Popen[bytes]:
        log = open(self.work / "driver.log", "a", encoding="utf-8")  # noqa: SIM115
        log.write(f"--- worker kill={kill} start={start}\n")
        log.flush()
        ready_r, ready_w = os.pipe()
        proc = subprocess.Popen(
            [
                sys.executable,
                str(DRIVER),
                store_arg(self.work),
                str(self.work / "effects.txt"),
                str(self.work / "sent.txt"),
                str(self.rng.randrange(2**32)),
                str(RUNS),
                str(WRITES),
                str(MESSAGES),
                kill,
                *(["start"] if start else []),
            ],
            stdout=log,
            stderr=log,
            pass_fds=(ready_w,),
            env={**os.environ, "STEERABLE_READY_FD": str(ready_w)},
        )
        log.close()
        os.close(ready_w)
        self.ready[proc.pid] = ready_r
        if wait:
            self.wait_ready(proc)
        self.procs.append(proc)
        self.all.append(proc)
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        """Until the worker is up (the first: its runs stored), or it exited."""
        with os.fdopen(self.ready.pop(proc.pid), "rb") as ready:
            select.select([ready], [], [], PROCESS_WAIT)

    def reap(self) -> list[subprocess.Popen[bytes]]:
        """Workers that exited since the last call (killed or done)."""
        dead = [p for p in self.procs if p.poll() is not None]
        self.procs = [p for p in self.procs if p.poll() is None]
        return dead

    def close(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                proc.kill()
            proc.wait(PROCESS_WAIT)


def kill_plan(rng: random.Random) -> str:
    kind = rng.choice(["none", "none", "tool", "tool", "send"])
    if kind == "tool":
        return f"tool:{rng.randint(1, RUNS * 2)}:{rng.choice(['before', 'after'])}"
    if kind == "send":
        return f"send:{rng.randint(1, RUNS * MESSAGES)}"
    return "none"


def check_owners(work: Path, context: str) -> int:
    """Epochs of stored revisions never decrease; tool starts: one owner (epoch) at a time."""
    for run_id, rows in revision_epochs(work).items():
        epochs = [epoch for _, epoch in rows]
        assert epochs == sorted(epochs), f"{context}: {run_id} epochs {rows}"
    starts: dict[str, list[tuple[float, int, int]]] = {}
    for pid, run_id, _call, _key, epoch, at in read_lines(work / "effects.txt.starts"):
        starts.setdefault(run_id, []).append((float(at), int(epoch), int(pid)))
    for run_id, seen in starts.items():
        seen.sort()
        epochs = [epoch for _, epoch, _ in seen]
        assert epochs == sorted(epochs), f"{context}: {run_id} tool starts {seen}"
        owners: dict[int, set[int]] = {}
        for _, held, who in seen:
            owners.setdefault(held, set()).add(who)
        assert all(len(p) == 1 for p in owners.values()), f"{context}: {run_id} {owners}"
    return sum(len(s) for s in starts.values())


def live_revisions(db: Path, context: str) -> int:
    """`check_revisions` while other workers write: its reads are several transactions, so
    a commit between two of them can make them disagree; a stored revision that does not
    load fails every attempt."""
    for _ in range(2):
        try:
            return check_revisions(db, context)
        except AssertionError:
            continue
    return check_revisions(db, context)


def one_iteration(work: Path, rng: random.Random, context: str, figures: Figures) -> int:
    """One database, several kills; returns the kills made."""
    pool = Pool(work, rng)
    kills = 0
    try:
        first = pool.spawn("none", start=True, wait=False)
        for _ in range(WORKERS - 1):
            pool.spawn(kill_plan(rng))
        (work / "go").touch()  # every worker is up: the runs start now
        pool.wait_ready(first)
        figures.processes += WORKERS
        finished = False  # a worker said done: every run is FINISHED, nothing is left to kill
        for _ in range(KILLS_PER_ITERATION):
            if finished:
                break
            victim = rng.choice(pool.procs) if pool.procs else None
            if victim is not None:
                try:
                    victim.wait(rng.uniform(0.02, 0.4))
                except subprocess.TimeoutExpired:
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(PROCESS_WAIT)
                    figures.kills["timer"] += 1
            for dead in pool.reap():
                kills += dead.returncode == -signal.SIGKILL
                if dead.returncode != -signal.SIGKILL:
                    assert dead.returncode == 0, f"{context}: worker failed {dead.returncode}"
                    figures.kills["completed"] += 1
                    finished = True
            figures.revisions_checked += live_revisions(work / "runs.db", context)
            # The workers' `write` calls wait for this file: the first kill is mid-run.
            (work / "release").touch()
            while len(pool.procs) < WORKERS and not finished:
                pool.spawn(kill_plan(rng))
                figures.processes += 1
        deadline = time.monotonic() + PROCESS_WAIT
        done = int(finished)
        while pool.procs or not done:
            assert time.monotonic() < deadline, f"{context}: the workers did not finish"
            for dead in pool.reap():
                if dead.returncode == -signal.SIGKILL:
                    kills += 1
                    figures.kills["self"] += 1
                else:
                    assert dead.returncode == 0, f"{context}: worker failed {dead.returncode}"
                    done += 1
            if not pool.procs and not done:
                pool.spawn("none")  # the last ones were killed by their own plans
                figures.processes += 1
            if pool.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pool.procs[0].wait(0.2)
    finally:
        pool.close()
    assert kills > 0, f"{context}: no worker was killed mid-run"
    figures.revisions_checked += check_revisions(work / "runs.db", f"{context} final")
    check_final(work, context, figures)
    check_owners(work, context)
    return kills


@pytest.mark.slow
def test_crash_loop_across_processes(tmp_path: Path) -> None:
    crash_loop(tmp_path)


@pytest.mark.slow
def test_crash_loop_across_processes_on_postgres(
    tmp_path: Path, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loop with the workers on PostgreSQL: a fresh schema per iteration."""
    schema = IterationSchemas(pg_schema, create=True)  # before the workers race to open it

    def epochs(work: Path) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for run_id, revision, epoch in admin(
            f"SELECT run_id, revision, epoch FROM {schema(work)}.revisions "
            "ORDER BY run_id, revision"
        ):
            out.setdefault(run_id, []).append((revision, epoch))
        return out

    def store(db: Path) -> Any:
        return pg_store(schema(db.parent))

    monkeypatch.setattr(sys.modules[__name__], "store_arg", lambda work: f"pg:{schema(work)}")
    monkeypatch.setattr(sys.modules[__name__], "revision_epochs", epochs)
    monkeypatch.setattr(crash, "open_store", store)
    try:
        crash_loop(tmp_path)
        assert schema.runs() > 0  # it ran on PostgreSQL
    finally:
        schema.drop()


def crash_loop(tmp_path: Path) -> None:
    seed = int(os.environ.get("STEERABLE_CRASH_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    figures = Figures()
    started = time.monotonic()
    failures: list[str] = []
    kills = 0
    for iteration in range(-(-CYCLES // KILLS_PER_ITERATION)):
        work = tmp_path / f"iteration-{iteration}"
        work.mkdir()
        context = f"seed={seed} iteration={iteration} (logs: {work / 'driver.log'})"
        try:
            kills += one_iteration(work, rng, context, figures)
        except AssertionError as exc:  # keep going: report every failing iteration at the end
            failures.append(str(exc).splitlines()[0][:500])
        figures.iterations += 1
    elapsed = time.monotonic() - started
    summary = (
        f"crash loop across processes: seed={seed} iterations={figures.iterations} "
        f"kills={kills} failed={len(failures)} processes={figures.processes} "
        f"how={dict(figures.kills)} runs={figures.runs} "
        f"messages_checked={figures.messages_checked} effects_checked={figures.effects_checked} "
        f"revisions_checked={figures.revisions_checked} seconds={elapsed:.1f}"
    )
    print(summary)
    assert not failures, "\n".join([summary, *failures])
    assert figures.runs > 0
    assert figures.messages_checked > 0
    assert kills > 0
