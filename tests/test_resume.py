"""Resume (R3, R4, R21, R22, R24): a stored run continues in a new process or a new runtime.

Covered: the same run id at revision + 1; calls without a recorded result re-dispatched with
their original idempotency key when the tool is none/idempotent/key-honouring, a plain write
answered with `side_effect_unknown`; pending approvals keeping their call id across a restart;
accepted but undelivered messages delivered exactly once, in order; capability and host
fingerprint checks (`capability_mismatch`, `checkpoint_incompatible`, `override=True`); terminal
runs; damaged rows (`checkpoint_corrupt`, harming no other run) and a newer format.

"New process" tests run `tests/crash_drivers/resume_driver.py` in a subprocess, SIGKILL it with
its tools in flight, and resume in this process. "In process" tests shut a runtime down with
`cancel_runs=False` and resume on a new runtime over the same database file.
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

from steerable.actors import Runtime, SqliteStore, Tool, ToolContext, tool
from steerable.actors._engine.mux import Dispatcher, MuxActor
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    ApprovalDecision,
    AskUser,
    Compatibility,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunState,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.driver_kit (explicit package bases)
    from tests.driver_kit import run_driver
else:
    from driver_kit import run_driver
from steerable.protocol._codec import FORMAT_VERSION, MAGIC

DRIVER = Path(__file__).parent / "crash_drivers" / "resume_driver.py"
WAIT = 10.0  # generous fail-instead-of-hang bound


# --------------------------------------------------------------------------- tools


class Recorder:
    """The driver's tools (same names, side effects and signatures), recording every call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str]] = []
        recorder = self

        def record(name: str, ctx: ToolContext) -> str:
            with recorder.lock:
                recorder.calls.append((name, ctx.call_id, ctx.idempotency_key))
            return f"{name} done"

        @tool(side_effect="none")
        def look(ctx: ToolContext, q: str = "") -> str:
            return record("look", ctx)

        @tool(side_effect="idempotent")
        def upsert(ctx: ToolContext, q: str = "") -> str:
            return record("upsert", ctx)

        @tool(side_effect="write", honors_idempotency_key=True)
        def keyed(ctx: ToolContext, q: str = "") -> str:
            return record("keyed", ctx)

        @tool(side_effect="write")
        def plain(ctx: ToolContext, q: str = "") -> str:
            return record("plain", ctx)

        @tool(side_effect="write", requires_approval=True)
        def pay(ctx: ToolContext, q: str = "") -> str:
            return record("pay", ctx)

        self.tools: list[Tool[Any, Any]] = [look, upsert, keyed, plain, pay]

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _, _ in self.calls]


def results(view: RunView) -> dict[str, ToolResult]:
    return {r.call_id: r for r in view.transcript if isinstance(r, ToolResult)}


def user_messages(view: RunView) -> list[tuple[int, str]]:
    return [(m.seq, m.content) for m in view.transcript if isinstance(m, UserMessage)]


def finisher(name: str = "driver") -> ScriptedAgent:
    return ScriptedAgent([], then=Finish(output="resumed"), name=name)


# --------------------------------------------------------------------------- the driver


@dataclass
class Driven:
    """What the killed driver reported."""

    run_id: str = ""
    revision: int = -1
    started: dict[str, tuple[str, str]] = field(default_factory=dict)
    """tool -> (call_id, idempotency_key) of its in-flight call."""
    approvals: list[str] = field(default_factory=list)
    sent: list[tuple[int, str]] = field(default_factory=list)


def drive(db: Path, steps: list[str], *args: str) -> Driven:
    """Run the driver until it is ready (or kills itself), SIGKILL it, return its report."""
    driven = Driven()

    def on_line(line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "started":
            name, call_id, key = rest.split()
            driven.started[name] = (call_id, key)
        elif word == "approval":
            driven.approvals.append(rest)
        elif word == "sent":
            seq, _, text = rest.partition(" ")
            driven.sent.append((int(seq), text))
        elif word == "run":
            run_id, revision = rest.split()
            driven.run_id, driven.revision = run_id, int(revision)

    stderr = run_driver([str(DRIVER), str(db), ",".join(steps), *args], on_line)
    assert driven.run_id, stderr
    return driven


# --------------------------------------------------------------------------- new process


def test_resume_in_a_new_process_keeps_the_run_id_and_continues_at_revision_plus_one(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db, ["keyed"])
    assert driven.revision >= 0
    recorder = Recorder()
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        assert rt.unfinished() == [driven.run_id]
        handle = rt.resume(driven.run_id, agent=finisher())
        assert handle.run_id == driven.run_id
        started = wait_event(handle, EventKind.RUN_STARTED)
        assert started.data["resumed_from"] == driven.revision
        first = wait_event(handle, EventKind.CHECKPOINT)
        assert first.data["revision"] == driven.revision + 1
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "resumed"
        assert outcome.run_id == driven.run_id
        revisions = [r.revision for r in rt.revisions(driven.run_id)]
        assert revisions == list(range(outcome.revision + 1))
        assert rt.unfinished() == []


def test_calls_of_none_idempotent_and_key_honouring_tools_rerun_with_their_original_keys(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db, ["look", "upsert", "keyed"])
    assert sorted(driven.started) == ["keyed", "look", "upsert"]
    recorder = Recorder()
    agent = finisher()
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        outcome = rt.resume(driven.run_id, agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert sorted(recorder.calls) == sorted(
        (name, call_id, key) for name, (call_id, key) in driven.started.items()
    )
    seen = results(agent.views[0])
    assert {r.tool: (r.ok, r.value) for r in seen.values()} == {
        "look": (True, "look done"),
        "upsert": (True, "upsert done"),
        "keyed": (True, "keyed done"),
    }


def test_a_plain_write_without_a_result_gives_the_agent_side_effect_unknown(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db, ["plain", "look"])
    plain_call, plain_key = driven.started["plain"]
    recorder = Recorder()
    agent = finisher()
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        outcome = rt.resume(driven.run_id, agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    # The write may already have happened: it must not run again.
    assert recorder.names() == ["look"]
    seen = results(agent.views[0])[plain_call]
    assert not seen.ok
    assert seen.error is not None
    assert seen.error.code is ErrorCode.SIDE_EFFECT_UNKNOWN
    assert seen.error.details["idempotency_key"] == plain_key


def test_a_pending_approval_survives_a_restart_with_its_call_id(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db, ["pay", "look"])
    assert len(driven.approvals) == 1
    (call_id,) = driven.approvals
    recorder = Recorder()
    agent = finisher()
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        handle = rt.resume(driven.run_id, agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        assert [r.call_id for r in handle.pending_approvals()] == [call_id]
        assert handle.pending_approvals()[0].tool == "pay"
        assert handle.approve(call_id) is True
        assert handle.approve(call_id) is False  # settled already
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert sorted(recorder.names()) == ["look", "pay"]  # the approved call ran once
    assert next(c for c in recorder.calls if c[0] == "pay")[1] == call_id
    assert agent.calls == 1  # not asked again before the approval was settled


def test_accepted_but_undelivered_messages_are_delivered_once_in_order_after_resume(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db, ["keyed"], "--send", "first", "--send", "second", "--send", "third")
    assert driven.sent == [(0, "first"), (1, "second"), (2, "third")]
    recorder = Recorder()
    agent = ScriptedAgent([AskUser(question="more?")], then=Finish(output="ok"), name="driver")
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        handle = rt.resume(driven.run_id, agent=agent)
        wait_state(handle, RunState.WAITING)
        assert handle.send("fourth") == 3  # seqs continue after the stored ones
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    first = agent.views[0]
    assert [(m.seq, m.content) for m in first.delivered] == driven.sent
    assert user_messages(agent.views[-1]) == [*driven.sent, (3, "fourth")]
    assert recorder.names() == ["keyed"]


def test_a_message_sent_right_after_start_survives_a_crash_before_the_first_checkpoint(
    tmp_path: Path,
) -> None:
    # send() returned, so the message was accepted: the run must be resumable and get it.
    db = tmp_path / "runs.db"
    driven = drive(db, ["look"], "--early-send", "hello")
    assert driven.sent == [(0, "hello")]
    recorder = Recorder()
    agent = ScriptedAgent([], then=Finish(output="ok"), name="driver")
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt:
        assert rt.unfinished() == [driven.run_id]
        outcome = rt.resume(driven.run_id, agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert user_messages(agent.views[-1]) == [(0, "hello")]


class HeldWriter(SqliteStore):
    """A SqliteStore whose writer thread stalls on the first checkpoint holding a plan."""

    def __init__(self, path: Path) -> None:
        self.hold = threading.Event()
        self.held = threading.Event()
        super().__init__(path)

    def _apply_checkpoint(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        revision: int,
        snapshot: Any,
        *rest: Any,
        **kwargs: Any,
    ) -> SteerableError | None:
        if snapshot["plan"] and not self.hold.is_set():
            self.held.set()
            self.hold.wait(WAIT)
        return super()._apply_checkpoint(conn, run_id, revision, snapshot, *rest, **kwargs)


def test_a_write_does_not_start_before_the_checkpoint_holding_its_key_is_stored(
    tmp_path: Path,
) -> None:
    # docs/contract.md: the checkpoint after a decision is written once its calls are keyed, before
    # dispatch. If a write ran while that checkpoint was still in the writer's queue, a crash
    # would lose the plan but not the effect: the resumed agent decides again and its new
    # call c1.0 gets the same key as the executed one (found by tests/test_crash.py).
    started = threading.Event()

    @tool(side_effect="write", honors_idempotency_key=True)
    def w(ctx: ToolContext) -> str:
        started.set()
        return "written"

    store = HeldWriter(tmp_path / "runs.db")
    with Runtime(store=store, tools=[w]) as rt:
        handle = rt.start("t", agent=ScriptedAgent([plan(call("w"))], then=Finish(output="ok")))
        try:
            assert store.held.wait(WAIT)  # the plan's checkpoint is not committed yet
            early = started.wait(0.5)  # bounded: a correct runtime never sets it here
        finally:
            store.hold.set()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert started.is_set()
    assert not early, "the write ran before the checkpoint holding its key was stored"


# --------------------------------------------------------------------------- in process


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def test_resume_in_process_after_a_shutdown_that_keeps_runs(tmp_path: Path, gate: Gate) -> None:
    db = tmp_path / "runs.db"
    keys: list[tuple[str, str]] = []

    @tool(side_effect="write", honors_idempotency_key=True)
    def keyed(ctx: ToolContext) -> str:
        keys.append((ctx.call_id, ctx.idempotency_key))
        return str(gate.enter(ctx))

    agent = ScriptedAgent([plan(call("keyed"))], name="a")
    rt = Runtime(store=SqliteStore(db), tools=[keyed])
    try:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)
        assert handle.send("steer") == 0
        revision = handle.revision
    finally:
        rt.shutdown(cancel_runs=False)
    with pytest.raises(SteerableError) as ended:
        handle.result(timeout=WAIT)
    assert ended.value.code is ErrorCode.RUN_ENDED
    assert len(keys) == 1
    gate.release()
    agent2 = ScriptedAgent([], then=Finish(output="ok"), name="a")
    with Runtime(store=SqliteStore(db), tools=[keyed]) as rt2:
        assert rt2.unfinished() == [handle.run_id]
        resumed = rt2.resume(handle.run_id, agent=agent2)
        assert resumed.run_id == handle.run_id
        first = wait_event(resumed, EventKind.CHECKPOINT)
        assert first.data["revision"] == revision + 1
        outcome = resumed.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert keys[1] == keys[0]  # re-dispatched with its original key
    assert len(keys) == 2
    view = agent2.views[0]
    assert [(m.seq, m.content) for m in view.delivered] == [(0, "steer")]
    assert user_messages(view) == [(0, "steer")]


@pytest.mark.parametrize("approved", [True, False])
def test_a_pending_approval_survives_an_in_process_restart(tmp_path: Path, approved: bool) -> None:
    db = tmp_path / "runs.db"
    recorder = Recorder()
    agent = ScriptedAgent([Plan(steps=[ToolCall(name="pay", arguments={"q": "x"})])], name="a")
    rt = Runtime(store=SqliteStore(db), tools=recorder.tools)
    try:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        (request,) = handle.pending_approvals()
    finally:
        rt.shutdown(cancel_runs=False)
    agent2 = ScriptedAgent([], then=Finish(output="ok"), name="a")
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt2:
        resumed = rt2.resume(handle.run_id, agent=agent2)
        wait_event(resumed, EventKind.APPROVAL_REQUESTED)
        assert [r.call_id for r in resumed.pending_approvals()] == [request.call_id]
        settled = (
            resumed.approve(request.call_id)
            if approved
            else resumed.deny(request.call_id, reason="no")
        )
        assert settled is True
        outcome = resumed.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    seen = results(agent2.views[0])[request.call_id]
    if approved:
        assert [c[:2] for c in recorder.calls] == [("pay", request.call_id)]  # once
        assert seen.ok
    else:
        assert recorder.calls == []
        assert seen.error is not None
        assert seen.error.code is ErrorCode.APPROVAL_DENIED


class Stall(MuxActor):
    """Holds its dispatcher thread until released: no supervisor handles a message meanwhile."""

    def __init__(
        self, *, dispatcher: Dispatcher, entered: threading.Event, release: threading.Event
    ) -> None:
        super().__init__(dispatcher=dispatcher)
        self.entered = entered
        self.release = release

    def on_receive(self, message: Any) -> Any:
        self.entered.set()
        self.release.wait(WAIT)  # a fail-instead-of-hang bound; the test sets it
        return None


@pytest.mark.parametrize("approved", [True, False])
def test_pending_approvals_are_known_when_resume_returns(tmp_path: Path, approved: bool) -> None:
    # Issue 10, defect 3: a host that resumes and approves at once (before the resumed run
    # re-announces its approvals) must neither see [] nor lose the approval.
    db = tmp_path / "runs.db"
    recorder = Recorder()
    agent = ScriptedAgent([Plan(steps=[ToolCall(name="pay", arguments={"q": "x"})])], name="a")
    rt = Runtime(store=SqliteStore(db), tools=recorder.tools)
    try:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        (request,) = handle.pending_approvals()
    finally:
        rt.shutdown(cancel_runs=False)
    agent2 = ScriptedAgent([], then=Finish(output="ok"), name="a")
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt2:
        # The only dispatcher thread is held, so the resumed supervisor handles nothing until
        # the asserts below are done: what they see was filled in by resume() itself.
        entered, release = threading.Event(), threading.Event()
        stall = Stall.start(dispatcher=rt2.services.dispatcher, entered=entered, release=release)
        try:
            stall.tell("hold")
            assert entered.wait(WAIT)
            resumed = rt2.resume(handle.run_id, agent=agent2)
            assert [(r.call_id, r.tool) for r in resumed.pending_approvals()] == [
                (request.call_id, "pay")
            ]
            settled = (
                resumed.approve(request.call_id)
                if approved
                else resumed.deny(request.call_id, reason="no")
            )
            assert settled is True
            assert resumed.pending_approvals() == []
            assert resumed.approve(request.call_id) is False  # settled already
        finally:
            release.set()
            stall.stop()
        outcome = resumed.result(timeout=WAIT)
        assert resumed.pending_approvals() == []  # the re-announced request was not re-added
    assert outcome.state is RunState.FINISHED
    seen = results(agent2.views[0])[request.call_id]
    if approved:
        assert [c[:2] for c in recorder.calls] == [("pay", request.call_id)]  # once
        assert seen.ok
    else:
        assert recorder.calls == []
        assert seen.error is not None
        assert seen.error.code is ErrorCode.APPROVAL_DENIED


# --------------------------------------------------------------------------- compatibility


@tool(side_effect="none")
def probe(q: str) -> str:
    return q


def _parked(db: Path, tools: list[Tool[Any, Any]], **start: Any) -> str:
    """Start a run that asks the user, wait until it waits, stop the runtime keeping it."""
    rt = Runtime(store=SqliteStore(db), tools=tools)
    try:
        handle = rt.start("t", agent=ScriptedAgent([AskUser(question="?")], name="a"), **start)
        wait_state(handle, RunState.WAITING)
        return handle.run_id
    finally:
        rt.shutdown(cancel_runs=False)


class VersionTwo(ScriptedAgent):
    version = "2"


def _changed_schema() -> Tool[Any, Any]:
    @tool(side_effect="none")
    def probe(q: int) -> str:
        return str(q)

    return probe


def _changed_side_effect() -> Tool[Any, Any]:
    @tool(side_effect="idempotent")
    def probe(q: str) -> str:
        return q

    return probe


MISMATCHES: dict[str, tuple[Callable[[], list[Tool[Any, Any]]], type[ScriptedAgent], str]] = {
    "tool removed": (list, ScriptedAgent, "probe"),
    "schema changed": (lambda: [_changed_schema()], ScriptedAgent, "probe"),
    "side effect changed": (lambda: [_changed_side_effect()], ScriptedAgent, "probe"),
    "agent version changed": (lambda: [probe], VersionTwo, "'a'"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_an_incompatible_capability_snapshot_is_refused_unless_overridden(
    tmp_path: Path, case: str
) -> None:
    db = tmp_path / "runs.db"
    run_id = _parked(db, [probe])
    tools, agent_class, named = MISMATCHES[case]
    with Runtime(store=SqliteStore(db), tools=tools()) as rt:
        with pytest.raises(SteerableError) as refused:
            rt.resume(run_id, agent=agent_class([], then=Finish(output="ok"), name="a"))
        assert refused.value.code is ErrorCode.CAPABILITY_MISMATCH
        differences = refused.value.error.details["differences"]
        assert isinstance(differences, list)
        assert len(differences) == 1
        assert named in differences[0]
        assert rt.unfinished() == [run_id]  # refused: nothing launched, nothing changed
        agent = agent_class([], then=Finish(output="ok"), name="a")
        handle = rt.resume(run_id, agent=agent, override=True)
        assert handle.run_id == run_id
        wait_state(handle, RunState.WAITING)
        handle.send("answer")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert user_messages(agent.views[0]) == [(0, "answer")]


def test_different_host_fingerprints_are_checkpoint_incompatible(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    started = Compatibility(task_version="1", policy="p", input_artifacts={"a.txt": "h1"})
    run_id = _parked(db, [probe], compatibility=started)
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt:
        with pytest.raises(SteerableError) as refused:
            rt.resume(
                run_id,
                agent=ScriptedAgent([], name="a"),
                compatibility=started.model_copy(
                    update={"task_version": "2", "input_artifacts": {"a.txt": "h2"}}
                ),
            )
        assert refused.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
        differences = refused.value.error.details["differences"]
        assert len(differences) == 2
        assert any("task_version" in d for d in differences)
        assert any("input artifacts" in d for d in differences)
        # The same fingerprints resume.
        handle = rt.resume(
            run_id,
            agent=ScriptedAgent([], then=Finish(output="ok"), name="a"),
            compatibility=started,
        )
        wait_state(handle, RunState.WAITING)
        handle.send("go")
        assert handle.result(timeout=WAIT).state is RunState.FINISHED


def test_different_host_fingerprints_resume_with_override(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    run_id = _parked(db, [probe], compatibility=Compatibility(task_version="1"))
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt:
        handle = rt.resume(
            run_id,
            agent=ScriptedAgent([], then=Finish(output="ok"), name="a"),
            compatibility=Compatibility(task_version="2"),
            override=True,
        )
        wait_state(handle, RunState.WAITING)
        handle.send("go")
        assert handle.result(timeout=WAIT).state is RunState.FINISHED


class Untouchable:
    """An agent that fails the test if it is ever asked to decide."""

    name = "a"

    def decide(self, view: RunView) -> Any:
        raise AssertionError("the agent of a terminal run was called")


def test_resuming_a_terminal_run_returns_its_outcome(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt:
        handle = rt.start("t", agent=ScriptedAgent([Finish(output={"answer": 42})], name="a"))
        outcome = handle.result(timeout=WAIT)
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt2:
        assert rt2.unfinished() == []
        again = rt2.resume(handle.run_id, agent=Untouchable())
        assert again.result(timeout=WAIT) == outcome
        assert again.state is RunState.FINISHED
        assert again.revision == outcome.revision


def test_resuming_an_unknown_run_is_not_found(tmp_path: Path) -> None:
    with Runtime(store=SqliteStore(tmp_path / "runs.db")) as rt:
        with pytest.raises(SteerableError) as info:
            rt.resume("run_nope", agent=ScriptedAgent())
        assert info.value.code is ErrorCode.NOT_FOUND


# --------------------------------------------------------------------------- bad data


def _flip(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[len(data) // 2] ^= 0x10
    return bytes(data)


def _truncate(blob: bytes) -> bytes:
    return blob[: len(blob) // 2]


DAMAGE: dict[str, tuple[str, str, Callable[[bytes], bytes]]] = {
    # name: (table, blob column, damage)
    "bit flipped in an entry": ("entries", "entry", _flip),
    "entry truncated": ("entries", "entry", _truncate),
    "bit flipped in a revision": ("revisions", "snapshot", _flip),
    "revision truncated": ("revisions", "snapshot", _truncate),
    "bit flipped in the run row": ("runs", "static", _flip),
}


def _two_parked_runs(db: Path) -> tuple[str, str]:
    rt = Runtime(store=SqliteStore(db), tools=[probe])
    try:
        ids = []
        for _ in range(2):
            agent = ScriptedAgent([plan(call("probe", q="x")), AskUser(question="?")], name="a")
            handle = rt.start("t", agent=agent)
            wait_state(handle, RunState.WAITING)
            ids.append(handle.run_id)
        return ids[0], ids[1]
    finally:
        rt.shutdown(cancel_runs=False)


def _damage(db: Path, run_id: str, table: str, column: str, fn: Callable[[bytes], bytes]) -> None:
    """Damage one blob of `run_id` in place (its stored checksum is left as it was)."""
    where = {
        "entries": "run_id=? AND idx=0",
        "revisions": "run_id=? AND revision=(SELECT MAX(revision) FROM revisions WHERE run_id=?)",
        "runs": "run_id=?",
    }[table]
    params = (run_id, run_id) if table == "revisions" else (run_id,)
    conn = sqlite3.connect(db)
    try:
        with conn:
            (blob,) = conn.execute(f"SELECT {column} FROM {table} WHERE {where}", params).fetchone()
            conn.execute(f"UPDATE {table} SET {column}=? WHERE {where}", (fn(blob), *params))
    finally:
        conn.close()


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_row_is_checkpoint_corrupt_and_harms_no_other_run(
    tmp_path: Path, case: str
) -> None:
    db = tmp_path / "runs.db"
    damaged, healthy = _two_parked_runs(db)
    table, column, fn = DAMAGE[case]
    _damage(db, damaged, table, column, fn)
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt:
        assert sorted(rt.unfinished()) == sorted([damaged, healthy])
        with pytest.raises(SteerableError) as corrupt:
            rt.resume(damaged, agent=Untouchable())
        assert corrupt.value.code is ErrorCode.CHECKPOINT_CORRUPT
        with pytest.raises(SteerableError) as again:
            rt.replay(damaged)
        assert again.value.code is ErrorCode.CHECKPOINT_CORRUPT
        # The other run, in the same file, loads and resumes as if nothing happened.
        assert len(rt.replay(healthy).transcript) == 3
        agent = ScriptedAgent([], then=Finish(output="fine"), name="a")
        handle = rt.resume(healthy, agent=agent)
        wait_state(handle, RunState.WAITING)
        handle.send("go on")
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "fine"
        assert rt.unfinished() == [damaged]  # still there, still refused, never "repaired"


def test_a_newer_format_version_fails_loudly(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    newer, healthy = _two_parked_runs(db)
    conn = sqlite3.connect(db)
    try:
        with conn:
            (latest, blob) = conn.execute(
                "SELECT revision, snapshot FROM revisions WHERE run_id=? "
                "ORDER BY revision DESC LIMIT 1",
                (newer,),
            ).fetchone()
            assert blob.startswith(MAGIC)
            version, kind, body = msgpack.unpackb(blob[len(MAGIC) :], raw=False)
            assert version == FORMAT_VERSION
            future = MAGIC + msgpack.packb([FORMAT_VERSION + 1, kind, body], use_bin_type=True)
            # A well-formed row (its checksum holds) from a newer steerable.
            conn.execute(
                "UPDATE revisions SET snapshot=?, crc=? WHERE run_id=? AND revision=?",
                (future, zlib.crc32(future), newer, latest),
            )
    finally:
        conn.close()
    with Runtime(store=SqliteStore(db), tools=[probe]) as rt:
        with pytest.raises(SteerableError) as info:
            rt.resume(newer, agent=Untouchable())
        assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
        assert str(FORMAT_VERSION + 1) in info.value.error.message
        handle = rt.resume(healthy, agent=ScriptedAgent([], then=Finish(output="ok"), name="a"))
        wait_state(handle, RunState.WAITING)
        handle.send("go")
        assert handle.result(timeout=WAIT).state is RunState.FINISHED


def test_an_approval_stored_before_the_stop_is_not_pending_after_resume(tmp_path: Path) -> None:
    # The decision was accepted (stored) but the run stopped before applying it: the resumed
    # run applies it, so the table resume() fills must not offer the call again.
    db = tmp_path / "runs.db"
    recorder = Recorder()
    agent = ScriptedAgent([Plan(steps=[ToolCall(name="pay", arguments={"q": "x"})])], name="a")
    rt = Runtime(store=SqliteStore(db), tools=recorder.tools)
    try:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        (request,) = handle.pending_approvals()
    finally:
        rt.shutdown(cancel_runs=False)
    store = SqliteStore(db)
    try:
        store.append_message(
            handle.run_id, ApprovalDecision(seq=0, call_id=request.call_id, approved=True)
        )
    finally:
        store.close()
    agent2 = ScriptedAgent([], then=Finish(output="ok"), name="a")
    with Runtime(store=SqliteStore(db), tools=recorder.tools) as rt2:
        entered, release = threading.Event(), threading.Event()
        stall = Stall.start(dispatcher=rt2.services.dispatcher, entered=entered, release=release)
        try:
            stall.tell("hold")
            assert entered.wait(WAIT)
            resumed = rt2.resume(handle.run_id, agent=agent2)
            assert resumed.pending_approvals() == []
            assert resumed.approve(request.call_id) is False
        finally:
            release.set()
            stall.stop()
        outcome = resumed.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert [c[:2] for c in recorder.calls] == [("pay", request.call_id)]  # once
