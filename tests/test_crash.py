"""The crash loop (R21 in docs/requirements.md; docs/contract.md, durable inbox): runs driven
against a store (a SQLite file; and, the same loop, a PostgreSQL schema per iteration) by a
subprocess that is killed with SIGKILL at random points, then resumed by new processes, many
times over.

Each iteration uses a fresh database. A `start` process (tests/crash_drivers/crash_driver.py)
starts runs whose agent makes key-honouring writes, waits for user messages the driver sends,
then finishes. It is killed: after a random delay, inside a tool (before or after the tool
recorded its effect), right after a `send()` returned, or inside a checkpoint's transaction
(before COMMIT). Zero to two `resume` processes are killed the same way; a last `resume`
process runs to the end. After every kill, every stored revision of every run must load.

At the end: every run is FINISHED; each idempotency key's effect was recorded at most once and
belongs to a write of the final transcripts (no key reused for a different write); every
message whose `send()` returned before a kill is in its run's final transcript exactly once,
with its seq, and the transcript's messages are in seq order with none duplicated.

The default number of iterations keeps this file under a minute; set
`STEERABLE_CRASH_ITERATIONS=<n>` for a long manual run (and `STEERABLE_CRASH_SEED=<seed>` to
replay a failing one: the seed is printed in every failure message).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import SqliteStore
from steerable.protocol import RunState, ToolResult, UserMessage

if TYPE_CHECKING:
    from tests.pg_kit import IterationSchemas, pg_store
else:
    from pg_kit import IterationSchemas, pg_store

DRIVER = Path(__file__).parent / "crash_drivers" / "crash_driver.py"
ITERATIONS = int(os.environ.get("STEERABLE_CRASH_ITERATIONS", "16"))
RUNS, WRITES, MESSAGES = 3, 4, 3
PROCESS_WAIT = 120.0  # fail-instead-of-hang bound for one driver process


def store_arg(work: Path) -> str:
    """The drivers' DB argument for an iteration's folder (the PostgreSQL case: `pg:SCHEMA`)."""
    return str(work / "runs.db")


def open_store(db: Path) -> Any:
    """The checks' store on the database `db` (tests/test_crash_processes.py points it at
    PostgreSQL)."""
    return SqliteStore(db)


@dataclass
class Figures:
    iterations: int = 0
    processes: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    messages_checked: int = 0
    effects_checked: int = 0
    revisions_checked: int = 0


def kill_plan(rng: random.Random) -> str:
    """How a killed process dies (the parent's random timer applies to all of them)."""
    kind = rng.choice(["timer", "tool", "tool", "send", "checkpoint"])
    if kind == "tool":
        # Half the tool kills hit the first plans' calls, where a plan checkpoint may still
        # be in the store's writer queue when its call runs.
        last = RUNS * 2 if rng.random() < 0.5 else RUNS * WRITES
        return f"tool:{rng.randint(1, last)}:{rng.choice(['before', 'after'])}"
    if kind == "send":
        return f"send:{rng.randint(1, RUNS * MESSAGES)}"
    if kind == "checkpoint":
        return f"checkpoint:{rng.randint(1, RUNS * 8)}"
    return "none"


def run_driver(
    work: Path, mode: str, seed: int, kill: str, delay: float | None, context: str
) -> str:
    """Run one driver process; kill it after `delay` seconds unless it ended. Its outcome."""
    with open(work / "driver.log", "a", encoding="utf-8") as log:
        log.write(f"--- {mode} kill={kill} delay={delay}\n")
        log.flush()
        ready_r, ready_w = os.pipe()
        proc = subprocess.Popen(
            [
                sys.executable,
                str(DRIVER),
                store_arg(work),
                str(work / "effects.txt"),
                str(work / "sent.txt"),
                mode,
                str(seed),
                str(RUNS),
                str(WRITES),
                str(MESSAGES),
                kill,
            ],
            stdout=log,
            stderr=log,
            pass_fds=(ready_w,),
            env={**os.environ, "STEERABLE_READY_FD": str(ready_w)},
        )
        os.close(ready_w)
        # The kill delay counts from the driver's "ready" byte (or its exit: EOF), so a slow
        # interpreter start on a loaded machine does not eat the window.
        with os.fdopen(ready_r, "rb") as ready:
            select.select([ready], [], [], PROCESS_WAIT)
        try:
            proc.wait(PROCESS_WAIT if delay is None else delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(PROCESS_WAIT)
            return "timer"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(PROCESS_WAIT)
    if proc.returncode == -signal.SIGKILL:
        return kill.split(":", maxsplit=1)[0]
    text = (work / "driver.log").read_text(encoding="utf-8")
    assert proc.returncode == 0, f"{context}: driver failed ({proc.returncode}):\n{text[-4000:]}"
    return "completed"


def check_revisions(db: Path, context: str) -> int:
    """Every stored revision of every run loads, its transcript whole. Returns how many."""
    store = open_store(db)
    try:
        checked = 0
        for summary in store.runs():
            infos = store.revisions(summary.run_id)
            assert [i.revision for i in infos] == list(range(len(infos))), context
            assert infos[-1].revision == summary.revision, context
            latest = store.load(summary.run_id).transcript
            for info in infos:
                loaded = store.load(summary.run_id, info.revision)
                assert len(loaded.transcript) == info.transcript_len, context
                if loaded.snapshot.revision < infos[-1].revision:
                    # History only grows: an older revision's transcript is a prefix.
                    assert loaded.transcript == latest[: info.transcript_len], context
                checked += 1
        return checked
    finally:
        store.close()


def read_lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line]


def check_final(work: Path, context: str, figures: Figures) -> None:
    """Terminal runs, messages exactly once in order, effects at most once and accounted for."""
    effects = read_lines(work / "effects.txt")
    keys = Counter(line[0] for line in effects)
    dup_effects = [k for k, n in keys.items() if n > 1]
    assert not dup_effects, f"{context}: effects recorded twice: {dup_effects}"
    effect_nonce = {line[0]: line[3] for line in effects}
    sent: dict[str, list[tuple[int, str]]] = {}
    for run_id, seq, text in read_lines(work / "sent.txt"):
        sent.setdefault(run_id, []).append((int(seq), text))
    store = open_store(work / "runs.db")
    try:
        runs = store.runs()
        stored_ids = {r.run_id for r in runs}
        assert set(sent) <= stored_ids, f"{context}: messages sent to runs that were lost"
        result_keys: list[str] = []
        for summary in runs:
            assert summary.state is RunState.FINISHED, f"{context}: {summary}"
            transcript = store.load(summary.run_id).transcript
            messages = [(m.seq, m.content) for m in transcript if isinstance(m, UserMessage)]
            seqs = [seq for seq, _ in messages]
            assert seqs == sorted(set(seqs)), f"{context}: {summary.run_id} order {messages}"
            texts = [text for _, text in messages]
            assert texts == [f"{summary.run_id}:m{k}" for k in range(MESSAGES)], (
                f"{context}: {summary.run_id} messages {messages}"
            )
            for item in sent.get(summary.run_id, []):
                assert messages.count(item) == 1, f"{context}: sent {item} not once: {messages}"
                figures.messages_checked += 1
            writes = [r for r in transcript if isinstance(r, ToolResult)]
            assert len(writes) == WRITES, f"{context}: {summary.run_id} writes {writes}"
            for result in writes:
                assert result.ok, f"{context}: {result}"
                word, key, nonce, *recorded = str(result.value).split()
                assert word in ("wrote", "dup"), f"{context}: {result}"
                assert key in effect_nonce, f"{context}: no effect for {result}"
                if word == "dup":
                    # A re-dispatch of the same call: the same write, the same arguments.
                    assert recorded == [nonce], (
                        f"{context}: key {key} reused for a different write "
                        f"(asked nonce {nonce}, recorded {recorded})"
                    )
                result_keys.append(key)
        repeated = [k for k, n in Counter(result_keys).items() if n > 1]
        assert not repeated, f"{context}: one key answered several calls: {repeated}"
        orphans = set(effect_nonce) - set(result_keys)
        assert not orphans, f"{context}: effects of writes no transcript knows: {orphans}"
        figures.runs += len(runs)
        figures.effects_checked += len(effect_nonce)
    finally:
        store.close()


def one_iteration(work: Path, rng: random.Random, context: str, figures: Figures) -> None:
    for generation in range(1 + rng.randint(0, 2)):
        mode = "start" if generation == 0 else "resume"
        kill = kill_plan(rng)
        delay = rng.uniform(0.3, 1.2)
        how = run_driver(work, mode, rng.randrange(2**32), kill, delay, context)
        figures.processes += 1
        figures.kills[how] += 1
        figures.revisions_checked += check_revisions(
            work / "runs.db", f"{context} gen {generation}"
        )
    how = run_driver(work, "resume", rng.randrange(2**32), "none", None, context)
    figures.processes += 1
    assert how == "completed", context
    figures.revisions_checked += check_revisions(work / "runs.db", f"{context} final")
    check_final(work, context, figures)


@pytest.mark.slow
def test_crash_loop(tmp_path: Path) -> None:
    crash_loop(tmp_path)


@pytest.mark.slow
def test_crash_loop_on_postgres(
    tmp_path: Path, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loop on PostgreSQL: a fresh schema per iteration."""
    schema = IterationSchemas(pg_schema)
    monkeypatch.setattr(sys.modules[__name__], "store_arg", lambda work: f"pg:{schema(work)}")
    monkeypatch.setattr(sys.modules[__name__], "open_store", lambda db: pg_store(schema(db.parent)))
    try:
        crash_loop(tmp_path, max(1, ITERATIONS // 2))  # a server round trip per write: slower
        assert schema.runs() > 0  # it ran on PostgreSQL
    finally:
        schema.drop()


def crash_loop(tmp_path: Path, iterations: int = ITERATIONS) -> None:
    seed = int(os.environ.get("STEERABLE_CRASH_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    figures = Figures()
    started = time.monotonic()
    failures: list[str] = []
    for iteration in range(iterations):
        work = tmp_path / f"iteration-{iteration}"
        work.mkdir()
        context = f"seed={seed} iteration={iteration} (logs: {work / 'driver.log'})"
        try:
            one_iteration(work, rng, context, figures)
        except AssertionError as exc:  # keep going: report every failing iteration at the end
            failures.append(str(exc).splitlines()[0][:500])
        figures.iterations += 1
    elapsed = time.monotonic() - started
    summary = (
        f"crash loop: seed={seed} iterations={figures.iterations} failed={len(failures)} "
        f"processes={figures.processes} kills={dict(figures.kills)} runs={figures.runs} "
        f"messages_checked={figures.messages_checked} effects_checked={figures.effects_checked} "
        f"revisions_checked={figures.revisions_checked} seconds={elapsed:.1f}"
    )
    print(summary)
    assert not failures, "\n".join([summary, *failures])
    assert figures.runs > 0
    assert figures.messages_checked > 0
    assert sum(n for how, n in figures.kills.items() if how != "completed") > 0
