"""The CLI operates runs other processes own, with real processes (docs/cli.md).

A host process (tests/crash_drivers/cli_host.py) owns one run on a SQLite file; `steerable
send/cancel/approve/deny` run as separate processes on the same file, and `steerable events
--follow` (another process) sees the effect. Each scenario ends with the run in the expected
state, as the host reports it and as the store holds it. A parked run (its host shut down,
nobody holds it) gets the stored operation when a new host resumes it.

Every wait is on a line a process prints, bounded by a generous anti-hang guard.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import SqliteStore
from steerable.protocol import RunState

HOST = Path(__file__).parent / "crash_drivers" / "cli_host.py"
WAIT = 60.0  # fail-instead-of-hang bound for one expected line or one command


class Host:
    """One host process and its line protocol."""

    def __init__(self, db: Path, *argv: str) -> None:
        self._err = open(db.parent / f"host-{id(self)}.log", "w", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(HOST), str(db), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, first: str) -> list[str]:
        """The next line starting with the word `first`, split in at most four parts."""
        while True:
            line = self.lines.get(timeout=WAIT)
            assert line is not None, f"host {self.proc.pid} exited before {first!r}"
            if line.split()[0] == first:
                return line.split(maxsplit=3)

    def ended(self) -> tuple[str, Any]:
        """The run's end as the host saw it: (state, output)."""
        _, _, state, output = self.expect("ended")
        return state, json.loads(output)

    def park(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("park\n")
        self.proc.stdin.flush()
        self.expect("parked")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(WAIT)
        self._reader.join(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._err.close()


@contextlib.contextmanager
def host(db: Path, *argv: str) -> Any:
    h = Host(db, *argv)
    try:
        yield h
    finally:
        h.close()


def _env(db: Path) -> dict[str, str]:
    return {**os.environ, "STEERABLE_DB": str(db)}


def cli(db: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`steerable ARGV...` in its own process on `$STEERABLE_DB=db`."""
    return subprocess.run(
        [sys.executable, "-m", "steerable.actors._cli", *argv],
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


# The CLI as a terminal starts it, whoever starts the tests: Python turns SIGINT into
# KeyboardInterrupt only if SIGINT was not ignored when it started, and a test runner started
# in the background of a script (`cmd &` where job control is off) ignores SIGINT,
# which every child inherits: the Ctrl-C test then hung until its guard.
_AT_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'steerable'; runpy.run_module('steerable.actors._cli', run_name='__main__')"
)


class Follower:
    """`steerable events RUN --follow --json` in its own process, read line by line."""

    def __init__(self, db: Path, run_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _AT_A_TERMINAL, "events", run_id, "--follow", "--json"],
            env=_env(db),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def events(self) -> list[dict[str, Any]]:
        """Every event it printed, once it has exited by itself (the run ended)."""
        out, err = self.proc.communicate(timeout=WAIT)
        assert self.proc.returncode == 0, err
        assert err == ""
        return [json.loads(line) for line in out.splitlines()]

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test: its run may never end
            self.proc.kill()
            self.proc.communicate(timeout=WAIT)
        self.proc.wait(WAIT)


def _stored_state(db: Path, run_id: str) -> RunState:
    store = SqliteStore(db, create=False)
    try:
        return store.load(run_id).snapshot.state
    finally:
        store.close()


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def _delivered(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["content"] for e in events if e["kind"] == "message_delivered"]


def _check_stream(events: list[dict[str, Any]], run_id: str, state: str) -> None:
    """One run's events, in seq order, ending with its run_ended."""
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    assert all(e["run_id"] == run_id for e in events)
    assert all(e["at"] > 0 for e in events)
    assert events[-1]["kind"] == "run_ended"
    assert events[-1]["data"]["state"] == state


# ---------------------------------------------------------------------------------- live owner


def test_send_steers_a_run_another_process_owns_and_follow_sees_it(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(host(db, "start", "chat"))
        run_id = h.expect("run")[1]
        follower = stack.enter_context(Follower(db, run_id))
        first = cli(db, "send", run_id, "hello")
        assert first.returncode == 0, first.stderr
        assert first.stdout == f"message #0 sent to {run_id}\n"
        second = cli(db, "send", run_id, "finish", "--json")
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout) == {"run_id": run_id, "seq": 1}
        assert h.ended() == ("finished", {"said": ["hello", "finish"]})
        events = follower.events()
    _check_stream(events, run_id, "finished")
    assert _delivered(events) == ["hello", "finish"]
    assert _stored_state(db, run_id) is RunState.FINISHED


def test_an_interrupting_send_cancels_the_call_in_flight(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(host(db, "start", "worker"))
        run_id = h.expect("run")[1]
        follower = stack.enter_context(Follower(db, run_id))
        sent = cli(db, "send", run_id, "stop", "--mode", "interrupt")
        assert sent.returncode == 0, sent.stderr
        assert h.ended() == ("finished", {"said": ["stop"], "block": "cancelled"})
        events = follower.events()
    _check_stream(events, run_id, "finished")
    assert _delivered(events) == ["stop"]
    finished = [e["data"] for e in events if e["kind"] == "tool_finished"]
    assert [(d["tool"], d["error"]) for d in finished] == [("block", "cancelled")]


def test_cancel_ends_a_run_another_process_owns(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(host(db, "start", "chat"))
        run_id = h.expect("run")[1]
        follower = stack.enter_context(Follower(db, run_id))
        done = cli(db, "cancel", run_id, "--reason", "no longer needed")
        assert done.returncode == 0, done.stderr
        state, _ = h.ended()
        assert state == "cancelled"
        events = follower.events()
    _check_stream(events, run_id, "cancelled")
    assert _stored_state(db, run_id) is RunState.CANCELLED


def test_ctrl_c_stops_following_with_exit_130_and_no_traceback(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(host(db, "start", "chat"))
        run_id = h.expect("run")[1]
        follower = stack.enter_context(Follower(db, run_id))
        assert follower.proc.stdout is not None
        first = json.loads(follower.proc.stdout.readline())  # it is following now
        assert first["run_id"] == run_id
        follower.proc.send_signal(signal.SIGINT)
        _, err = follower.proc.communicate(timeout=WAIT)
        assert follower.proc.returncode == 130
        assert err == "interrupted\n"
        assert _stored_state(db, run_id) is RunState.WAITING  # following changed nothing


def _pending(db: Path, run_id: str) -> list[dict[str, Any]]:
    listed = cli(db, "approvals", run_id, "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["run_id"] == run_id
    pending: list[dict[str, Any]] = document["pending"]
    return pending


def test_approve_lets_a_gated_call_of_another_process_run(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(host(db, "start", "gate"))
        run_id = h.expect("run")[1]
        follower = stack.enter_context(Follower(db, run_id))
        shown = cli(db, "show", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        owner = json.loads(shown.stdout)["owner"]
        assert (owner["pid"], owner["live"]) == (h.proc.pid, True)
        pending = _pending(db, run_id)
        assert [(p["tool"], p["arguments"]) for p in pending] == [("publish", {"what": "notes"})]
        call_id = pending[0]["call_id"]
        done = cli(db, "approve", run_id, call_id)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"call {call_id} of {run_id} approved\n"
        state, output = h.ended()
        events = follower.events()
    assert (state, output["ok"], output["value"]) == ("finished", True, "published notes")
    _check_stream(events, run_id, "finished")
    finished = [e["data"] for e in events if e["kind"] == "tool_finished"]
    assert [(d["tool"], d["ok"]) for d in finished] == [("publish", True)]


def test_deny_refuses_a_gated_call_of_another_process(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with host(db, "start", "gate") as h:
        run_id = h.expect("run")[1]
        call_id = _pending(db, run_id)[0]["call_id"]
        done = cli(db, "deny", run_id, call_id, "--reason", "not today", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "run_id": run_id,
            "call_id": call_id,
            "approved": False,
            "settled": True,
        }
        state, output = h.ended()
    assert (state, output["ok"], output["error"]) == ("finished", False, "approval_denied")
    assert "not today" in output["message"]
    assert _stored_state(db, run_id) is RunState.FINISHED


# ---------------------------------------------------------------------------------- parked


@pytest.mark.parametrize(
    ("kind", "operation", "expected"),
    [
        ("chat", ("send", "finish"), ("finished", {"said": ["finish"]})),
        ("chat", ("cancel",), ("cancelled", None)),
        ("gate", ("approve",), ("finished", "published notes")),
    ],
    ids=["send", "cancel", "approve"],
)
def test_a_parked_run_gets_the_stored_operation_on_its_next_resume(
    tmp_path: Path, kind: str, operation: tuple[str, ...], expected: tuple[str, Any]
) -> None:
    db = tmp_path / "runs.db"
    with host(db, "start", kind) as h:
        run_id = h.expect("run")[1]
        h.park()
    argv = [operation[0], run_id, *operation[1:]]
    if operation[0] == "approve":
        argv.append(_pending(db, run_id)[0]["call_id"])
    done = cli(db, *argv)
    assert done.returncode == 0, done.stderr  # stored for the run's next owner
    assert _stored_state(db, run_id) is RunState.WAITING  # nobody ran it meanwhile
    with host(db, "resume", run_id, kind) as h:
        h.expect("resumed")
        state, output = h.ended()
    if kind == "gate":
        output = output["value"]
    elif state == "cancelled":
        output = None
    assert (state, output) == expected
    assert _stored_state(db, run_id).value == expected[0]
