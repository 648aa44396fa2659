"""Ownership across real processes on one SQLite file (docs/durability.md, "Ownership").

Each scenario starts driver processes (tests/crash_drivers/owner_driver.py) and talks to them
over pipes: they report facts line by line, and the test SIGKILLs, SIGSTOPs and SIGCONTs them
on those facts, never on a guess of time. The checks, for every run: one owner at a time
(each run resumed once), the (revision, epoch) sequence stored is monotonic, no tool started
by a fenced-out process after the takeover, every `write` effect at most once per key.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from steerable.actors import SqliteStore
from steerable.protocol import RunState

DRIVER = Path(__file__).parent / "crash_drivers" / "owner_driver.py"
STEER = Path(__file__).parent / "crash_drivers" / "steer_driver.py"
WAIT = 60.0  # fail-instead-of-hang bound for one expected line
TTL = 1.0


def store_arg(work: Path) -> str:
    """The drivers' DB argument (tests/test_postgres_processes.py gives `pg:SCHEMA`)."""
    return str(work / "runs.db")


def open_store(work: Path) -> Any:
    """A store object on the drivers' store."""
    return SqliteStore(work / "runs.db")


def revision_epochs(work: Path, run_id: str) -> list[tuple[int, int]]:
    """(revision, epoch) of every stored revision of `run_id`, by revision."""
    conn = sqlite3.connect(work / "runs.db")
    try:
        return conn.execute(
            "SELECT revision, epoch FROM revisions WHERE run_id=? ORDER BY revision", (run_id,)
        ).fetchall()
    finally:
        conn.close()


class Driver:
    """One driver process and its line protocol."""

    def __init__(
        self, work: Path, role: str, *extra: str, ttl: float = TTL, script: Path = DRIVER
    ) -> None:
        self._log = open(work / f"{role}-{id(self)}.log", "w", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                store_arg(work),
                str(work / "journal.txt"),
                str(ttl),
                role,
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.pid = self.proc.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, first: str) -> list[str]:
        """Lines until one starting with `first` (returned split; earlier ones kept in seen)."""
        while True:
            line = self.lines.get(timeout=WAIT)
            assert line is not None, f"driver {self.pid} exited; saw {self.seen}"
            self.seen.append(line)
            if line.split()[0] == first:
                return line.split()

    def expect_all(self, first: str, count: int) -> list[list[str]]:
        """The first `count` lines starting with `first`, counting those already seen (an
        `ended` may come before the last `adopted`: another run can end meanwhile)."""
        while True:
            found = [line.split() for line in self.seen if line.split()[0] == first]
            if len(found) >= count:
                return found[:count]
            self.expect(first)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        """End the driver: closing its stdin shuts its runtime down (its writes flushed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)
        self._reader.join(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._log.close()


def journal(work: Path) -> list[tuple[int, str, str, str, str, float]]:
    path = work / "journal.txt"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        pid, run_id, tool, call_id, key, at = line.split()
        out.append((int(pid), run_id, tool, call_id, key, float(at)))
    return out


def check_store(work: Path, run_ids: list[str]) -> None:
    """Every run finished; (revision, epoch) monotonic; effects at most once per key."""
    store = open_store(work)
    try:
        for run_id in run_ids:
            assert store.load(run_id).snapshot.state is RunState.FINISHED, run_id
    finally:
        store.close()
    for run_id in run_ids:
        rows = revision_epochs(work, run_id)
        epochs = [epoch for _, epoch in rows]
        assert epochs == sorted(epochs), f"{run_id}: epochs not monotonic {rows}"
    effects = (work / "journal.txt.effects").read_text(encoding="utf-8").split("\n")
    keys = Counter(line.split()[0] for line in effects if line)
    assert all(n == 1 for n in keys.values()), keys
    assert sum(keys.values()) == 2 * len(run_ids)  # two writes per run, each once


def seed(work: Path, runs: int) -> tuple[Driver, list[str]]:
    """A process that starts `runs` runs, each held in its first call."""
    owner = Driver(work, "start", str(runs))
    run_ids = [owner.expect("run")[1] for _ in range(runs)]
    owner.expect("ready")
    return owner, run_ids


def test_four_processes_resuming_unfinished_resume_each_run_exactly_once(
    tmp_path: Path,
) -> None:
    owner, run_ids = seed(tmp_path, 8)
    owner.signal(signal.SIGKILL)  # its leases are live, but its pid is gone
    owner.close()
    workers = [Driver(tmp_path, "resume") for _ in range(4)]
    try:
        for w in workers:
            w.expect("up")
        for w in workers:  # as close to together as a parent can make them
            w.tell("go")
        for w in workers:
            w.expect("done")
        resumed = {line.split()[1] for w in workers for line in w.seen if line[:7] == "resumed"}
        assert resumed == set(run_ids), [w.seen for w in workers]
        for w in workers:
            ended = [line.split() for line in w.seen if line.startswith("ended")]
            assert all(state == "finished" for _, _, state in ended), w.seen
        # One owner per run: "resumed" may also be said of a run another process had just
        # finished (its handle is the stored outcome), but only one process ran its tools.
        runners: dict[str, set[int]] = {}
        for pid, run_id, *_ in journal(tmp_path):
            if pid != owner.pid:
                runners.setdefault(run_id, set()).add(pid)
        assert sorted(runners) == sorted(run_ids)
        assert all(len(pids) == 1 for pids in runners.values()), runners
    finally:
        for w in workers:
            w.close()
    check_store(tmp_path, run_ids)


def test_a_killed_owners_runs_are_adopted_within_the_lease_ttl(tmp_path: Path) -> None:
    owner, run_ids = seed(tmp_path, 3)
    adopter = Driver(tmp_path, "adopt")
    try:
        adopter.expect("up")
        owner.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        owner.close()
        adopted = {}
        for _ in run_ids:
            _, run_id, at = adopter.expect("adopted")
            adopted[run_id] = float(at) - killed_at
        assert sorted(adopted) == sorted(run_ids)
        interval = TTL / 3
        assert max(adopted.values()) <= TTL + interval + 0.5, adopted
        adopter.expect_all("ended", len(run_ids))
    finally:
        adopter.close()
    check_store(tmp_path, run_ids)


def test_a_frozen_owner_is_fenced_out_and_lands_nothing_after_it_thaws(tmp_path: Path) -> None:
    owner, run_ids = seed(tmp_path, 2)
    adopter = Driver(tmp_path, "adopt")
    try:
        adopter.expect("up")
        owner.signal(signal.SIGSTOP)  # frozen with its calls in flight, its lease running out
        stopped_at = time.monotonic()
        adopted_at = []
        for _ in run_ids:
            adopted_at.append(float(adopter.expect("adopted")[2]))
        assert min(adopted_at) - stopped_at >= TTL * 0.5  # a live (frozen) owner is waited out
        assert all(e[2] == "finished" for e in adopter.expect_all("ended", len(run_ids)))
        owner.signal(signal.SIGCONT)
        owner.tell("release")  # the zombie's calls return: it must write and start nothing
        for _ in run_ids:
            owner.expect("lost")
    finally:
        owner.close()
        adopter.close()
    takeover = min(adopted_at)
    late = [entry for entry in journal(tmp_path) if entry[0] == owner.pid and entry[5] >= takeover]
    assert late == [], f"the zombie started tools after the takeover: {late}"
    check_store(tmp_path, run_ids)


def answer(driver: Driver, line: str) -> list[str]:
    """One command's answer line: the next line that is an answer or an error."""
    driver.tell(line)
    while True:
        got = driver.lines.get(timeout=WAIT)
        assert got is not None, f"driver {driver.pid} exited; saw {driver.seen}"
        driver.seen.append(got)
        if got.split()[0] in {"sent", "cancel", "decided", "pending", "state", "error"}:
            return got.split()


def pending_of(steerer: Driver, run_id: str, count: int) -> list[str]:
    """Ask until the run shows `count` pending approvals (it plans them after its messages)."""
    deadline = time.monotonic() + WAIT
    while True:
        calls = answer(steerer, f"pending {run_id}")[1:]
        if len(calls) >= count or time.monotonic() > deadline:
            return calls
        threading.Event().wait(0.02)  # polling a stored state, bounded by the deadline


def test_steer_approve_deny_and_cancel_from_a_process_that_does_not_own_the_run(
    tmp_path: Path,
) -> None:
    owner = Driver(tmp_path, "own", script=STEER)
    steerer = Driver(tmp_path, "steer", script=STEER)
    try:
        owner.expect("up")
        steerer.expect("up")
        owner.tell("start first")
        first = owner.expect("run")[2]
        owner.tell("start second")
        second = owner.expect("run")[2]

        # Three messages from B, one of them retried with its message id: delivered once each.
        seqs = [
            int(answer(steerer, f"send {first} {text} {mid}")[1])
            for text, mid in [("one", "m-1"), ("two", "m-2"), ("two", "m-2"), ("three", "-")]
        ]
        assert seqs[1] == seqs[2]
        assert seqs[0] < seqs[1] < seqs[3]

        # The run then plans two approval-gated writes: B approves one and denies the other.
        calls = pending_of(steerer, first, 2)
        assert len(calls) == 2, calls
        assert answer(steerer, f"approve {first} {calls[0]}") == ["decided", "True"]
        assert answer(steerer, f"deny {first} {calls[1]}") == ["decided", "True"]
        assert answer(steerer, f"approve {first} {calls[0]}") == ["decided", "False"]
        _, run_id, state, output = owner.expect("ended")
        assert (run_id, state) == (first, "finished")
        result = json.loads(output)
        assert result["messages"] == ["one", "two", "three"]
        assert result["results"] == [[calls[0], True], [calls[1], False]]

        # Its events, replayed from the store in B, end with its run_ended.
        steerer.tell(f"events {first}")
        steerer.expect("events-end")
        events = [line.split() for line in steerer.seen if line.startswith("event ")]
        assert [int(seq) for _, seq, _, _ in events] == list(range(len(events)))
        assert events[-1][2] == "run_ended"
        kinds = [kind for _, _, kind, _ in events]
        assert kinds.count("message_delivered") == 3
        assert kinds.count("approval_settled") == 2

        # B cancels the second run; then it is over for B too.
        assert answer(steerer, f"cancel {second}") == ["cancel", "True"]
        _, run_id, state, _ = owner.expect("ended")
        assert (run_id, state) == (second, "cancelled")
        assert answer(steerer, f"cancel {second}") == ["cancel", "False"]
        assert answer(steerer, f"send {second} late -") == ["error", "run_ended"]
        assert answer(steerer, f"state {second}") == ["state", "cancelled"]
    finally:
        steerer.close()
        owner.close()
    published = [entry for entry in journal(tmp_path) if entry[2] == "publish"]
    assert [(pid, run_id, call) for pid, run_id, _, call, _, _ in published] == [
        (owner.pid, first, calls[0])
    ]
