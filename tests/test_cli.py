"""The `steerable` commands in this process: JSON shapes, timestamps, exit codes, bad input.

Runs are made with a `Runtime` on a SQLite file, then read and operated with `main([...])`
(the CLI's client runtime lives in this process, so the autouse fixture also checks it leaves
no thread). Operations on runs another process owns: tests/test_cli_processes.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import ManualClock, Runtime, SqliteStore, tool
from steerable.actors._cli.cli import main
from steerable.actors.testing import ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import AskUser, EventKind, Finish, RunState, RunView

WAIT = 30.0
WALL = 1_800_000_000.0


@tool
def echo(text: str) -> str:
    """Returns its text."""
    return text


@tool(side_effect="write", requires_approval=True)
def publish(what: str) -> str:
    """Needs a person's approval."""
    return f"published {what}"


@dataclass
class Runs:
    db: Path
    finished: str
    """A run that planned echo twice (a minute apart on the run's clock), then finished."""
    parked: str
    """A run parked waiting for approval of `call_id` (publish), its runtime shut down."""
    call_id: str


def _later(clock: ManualClock, decision: Any) -> Any:
    def step(view: RunView) -> Any:
        clock.advance(60.0)
        return decision

    return step


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    db = tmp_path_factory.mktemp("cli") / "runs.db"
    clock = ManualClock(wall_start=WALL)
    agent = ScriptedAgent(
        [
            _later(clock, plan(call("echo", text="one"))),
            _later(clock, plan(call("echo", text="two"))),
            _later(clock, Finish(output={"said": "two"})),
        ]
    )
    gate = ScriptedAgent([plan(call("publish", what="notes"))], then=Finish(output="done"))
    rt = Runtime(store=SqliteStore(db), clock=clock, tools=[echo, publish])
    try:
        finished = rt.start("say one, then two", agent=agent)
        assert finished.result(WAIT).state is RunState.FINISHED
        parked = rt.start("publish the notes", agent=gate)
        request = wait_event(parked, EventKind.APPROVAL_REQUESTED, timeout=WAIT)
        wait_state(parked, RunState.WAITING, timeout=WAIT)
    finally:
        rt.shutdown(cancel_runs=False)
    return Runs(db, finished.run_id, parked.run_id, request.data["call_id"])


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    out = capsys.readouterr().out
    return json.loads(out)


# ---------------------------------------------------------------------------------- JSON


def test_runs_json_lists_every_run_with_stable_keys(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--db", str(runs.db), "--json"]) == 0
    document = _json(capsys)
    assert document["db"] == str(runs.db)
    by_id = {run["run_id"]: run for run in document["runs"]}
    assert set(by_id) == {runs.finished, runs.parked}
    assert all(
        set(run) == {"run_id", "parent_run_id", "state", "revision", "agent", "task", "updated_at"}
        for run in document["runs"]
    )
    assert by_id[runs.finished]["state"] == "finished"
    assert by_id[runs.parked]["state"] == "waiting"
    assert by_id[runs.finished]["updated_at"] == WALL + 180.0


def test_show_json_holds_the_snapshot_and_a_dated_transcript(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "--db", str(runs.db), runs.finished, "--json"]) == 0
    shown = _json(capsys)
    assert set(shown) == {
        "run_id",
        "state",
        "waiting_for",
        "revision",
        "task",
        "agent",
        "depth",
        "parent_run_id",
        "forked_from",
        "created_at",
        "updated_at",
        "counters",
        "output",
        "errors",
        "owner",
        "transcript",
    }
    assert (shown["state"], shown["output"], shown["errors"]) == ("finished", {"said": "two"}, [])
    assert shown["owner"]["live"] is False  # its terminal write released the lease
    assert shown["counters"] == {"steps": 2, "model_calls": 3, "tokens": 0, "retries": 0}
    assert shown["created_at"] == WALL
    entries = shown["transcript"]
    assert [e["entry"]["kind"] for e in entries] == [
        "decision",
        "tool_result",
        "decision",
        "tool_result",
        "decision",
    ]
    assert [e["index"] for e in entries] == list(range(5))
    assert entries[1]["summary"] == "result c1.0 echo: ok"
    # Each entry dated by the first checkpoint holding it: the clock moved a minute per decision.
    assert [e["at"] for e in entries] == [WALL + 60, WALL + 60, WALL + 120, WALL + 120, WALL + 180]


def test_show_and_revisions_print_timestamps(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "--db", str(runs.db), runs.finished]) == 0
    out = capsys.readouterr().out
    from steerable.actors._cli.common import stamp

    assert f"created   {stamp(WALL)}   updated {stamp(WALL + 180)}" in out
    assert "owner     -\n" in out  # ended: nobody needs it
    assert f"     1  {stamp(WALL + 60)}  result c1.0 echo: ok" in out
    assert f"     3  {stamp(WALL + 120)}  result c2.0 echo: ok" in out
    assert main(["revisions", "--db", str(runs.db), runs.finished, "--json"]) == 0
    revisions = _json(capsys)
    assert revisions["run_id"] == runs.finished
    rows = revisions["revisions"]
    assert all(set(r) == {"revision", "state", "transcript_len", "updated_at"} for r in rows)
    assert [r["revision"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["state"] == "finished"
    assert rows[-1]["updated_at"] == WALL + 180


def test_replay_events_keep_the_times_they_happened_at(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--db", str(runs.db), runs.finished, "--json"]) == 0
    replay = _json(capsys)
    assert set(replay) == {"run_id", "revision", "events", "outcome"}
    events = replay["events"]
    assert [e["kind"] for e in events] == [
        "run_started",
        "reasoning_finished",
        "tool_finished",
        "reasoning_finished",
        "tool_finished",
        "reasoning_finished",
        "run_ended",
    ]
    assert [e["at"] for e in events] == [WALL, *(WALL + t for t in (60, 60, 120, 120, 180, 180))]
    assert replay["outcome"]["state"] == "finished"
    # An earlier revision is dated by its own checkpoints only.
    assert main(["replay", "--db", str(runs.db), runs.finished, "--revision", "1", "--json"]) == 0
    early = _json(capsys)
    assert early["revision"] == 1
    assert early["outcome"] is None
    assert [e["at"] for e in early["events"]] == [WALL, WALL + 60]


def test_events_json_replays_the_stored_run_from_a_seq(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", "--db", str(runs.db), runs.finished, "--json"]) == 0
    every = _json(capsys)
    assert every["run_id"] == runs.finished
    kinds = [e["kind"] for e in every["events"]]
    assert "run_started" in kinds  # the stored events, or those derived from the checkpoints
    assert kinds[-1] == "run_ended"
    assert [e["seq"] for e in every["events"]] == list(range(len(kinds)))
    assert all(
        set(e) == {"run_id", "trace_id", "seq", "kind", "phase", "at", "data", "parent_run_id"}
        for e in every["events"]
    )
    assert main(["events", "--db", str(runs.db), runs.finished, "--json", "--start", "2"]) == 0
    later = _json(capsys)["events"]
    assert later == [e for e in every["events"] if e["seq"] >= 2]
    # --follow of a run that already ended prints the same events, one JSON line each, and exits.
    assert main(["events", "--db", str(runs.db), runs.finished, "--follow", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == every["events"]


def test_trace_json_says_what_it_wrote(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    assert main(["events", "--db", str(runs.db), runs.finished, "--follow", "--json"]) == 0
    events.write_text(capsys.readouterr().out)
    out = tmp_path / "t.html"
    argv = ["trace", runs.finished, "--db", str(runs.db), "--events", str(events)]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    document = _json(capsys)
    count = len(events.read_text().splitlines())
    assert document == {"run_id": runs.finished, "format": "html", "events": count, "out": str(out)}
    assert out.read_text().count('class="run"') == 1


# ---------------------------------------------------------------------------------- operations


def test_approvals_and_decisions_on_a_parked_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    gate = ScriptedAgent(
        [plan(call("publish", what="a"), call("publish", what="b"))], then=AskUser(question="?")
    )
    with Runtime(store=SqliteStore(db), tools=[publish]) as rt:
        handle = rt.start("publish two", agent=gate)
        wait_state(handle, RunState.WAITING, timeout=WAIT)
        while len(handle.pending_approvals()) < 2:
            wait_event(handle, EventKind.APPROVAL_REQUESTED, timeout=WAIT)
    run_id = handle.run_id
    base = ["--db", str(db), run_id]
    assert main(["approvals", *base, "--json"]) == 0
    pending = _json(capsys)
    assert pending["run_id"] == run_id
    assert [(p["tool"], p["arguments"]) for p in pending["pending"]] == [
        ("publish", {"what": "a"}),
        ("publish", {"what": "b"}),
    ]
    first, second = (p["call_id"] for p in pending["pending"])
    assert main(["show", *base]) == 0
    assert "owner     nobody (parked or orphaned" in capsys.readouterr().out
    assert main(["approve", *base, "c-none", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "run_id": run_id,
        "call_id": "c-none",
        "approved": True,
        "settled": False,
    }
    assert (
        captured.err
        == f"steerable: [refused] call c-none of run {run_id} is not waiting for approval\n"
    )
    assert main(["approve", *base, first]) == 0
    assert capsys.readouterr().out == f"call {first} of {run_id} approved\n"
    assert main(["deny", *base, second, "--reason", "not b"]) == 0
    assert main(["deny", *base, second]) == 1  # decided already (stored for the next owner)
    assert main(["approvals", *base]) == 0
    assert capsys.readouterr().out.endswith(f"0 call(s) of {run_id} waiting for approval\n")
    assert main(["send", *base, "hello", "--json", "--message-id", "m-1"]) == 0
    sent = _json(capsys)
    assert main(["send", *base, "hello again", "--json", "--message-id", "m-1"]) == 0
    assert _json(capsys) == sent  # one message: the same id is the same message
    assert main(["cancel", *base, "--reason", "enough"]) == 0
    store = SqliteStore(db, create=False)
    try:
        stored = store.load(run_id)
    finally:
        store.close()
    assert [m.kind for m in stored.messages] == ["approval", "approval", "user", "cancel"]
    assert stored.snapshot.state is RunState.WAITING  # nobody has resumed it yet


def test_operations_on_an_ended_run_are_refused_with_exit_1(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--db", str(runs.db), runs.finished]
    assert main(["send", *base, "too late"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("steerable: [run_ended]")
    assert len(err.splitlines()) == 1
    assert main(["cancel", *base, "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "run_id": runs.finished,
        "cancelled": False,
        "state": "finished",
    }
    assert captured.err.startswith("steerable: [refused]")
    for verb in ("approve", "deny"):
        assert main([verb, *base, "c1.0"]) == 1
        assert capsys.readouterr().err.startswith("steerable: [refused]")


# ---------------------------------------------------------------------------------- bad input

_ALL = [
    ["runs"],
    ["show", "RUN"],
    ["revisions", "RUN"],
    ["replay", "RUN"],
    ["events", "RUN"],
    ["events", "RUN", "--follow"],
    ["approvals", "RUN"],
    ["trace", "RUN"],
    ["send", "RUN", "hello"],
    ["cancel", "RUN"],
    ["approve", "RUN", "c1.0"],
    ["deny", "RUN", "c1.0"],
]


@pytest.mark.parametrize("argv", _ALL, ids=" ".join)
def test_a_missing_database_is_exit_2_and_never_created(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "typo.db"
    assert main([*argv, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err == f"steerable: [not_found] {db}: no such database\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", _ALL[1:], ids=" ".join)
def test_an_unknown_run_is_exit_2_not_found(
    argv: list[str], runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a if a != "RUN" else "run_nope" for a in argv]
    assert main([*argv, "--db", str(runs.db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("steerable: [not_found]"), err
    assert "run_nope" in err
    assert len(err.splitlines()) == 1


def test_the_environment_names_the_database(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STEERABLE_DB", str(runs.db))
    assert main(["runs", "--json"]) == 0
    assert _json(capsys)["db"] == str(runs.db)


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "RUN", "hello", "--mode", "shout"],
        ["send", "RUN"],
        ["events", "RUN", "--start", "x"],
        ["cancel", "RUN", "--timeout", "soon"],
    ],
    ids=["bad mode", "no text", "bad start", "bad timeout"],
)
def test_malformed_arguments_exit_2_before_anything_is_opened(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--db", str(tmp_path / "runs.db")])
    assert exit_info.value.code == 2
    assert "usage: steerable" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_text_the_store_cannot_keep_is_exit_2_and_nothing_is_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    with Runtime(store=SqliteStore(db)) as rt:
        handle = rt.start("wait", agent=ScriptedAgent(then=AskUser(question="?")))
        wait_state(handle, RunState.WAITING, timeout=WAIT)
    assert main(["send", "--db", str(db), handle.run_id, "bad \udc80 text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("steerable: [invalid_arguments]")
    assert len(err.splitlines()) == 1
    store = SqliteStore(db, create=False)
    try:
        assert store.load(handle.run_id).messages == []
    finally:
        store.close()
