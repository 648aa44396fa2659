"""Replay, revisions and fork (R21, R23): history read back without executing anything, and a
new run started from a past revision.

Replay runs in a fresh runtime whose tools, agent and hooks fail the test if they are called:
a replay reads the store and nothing else. A fork gets a new run id, records where it came
from (`RunSnapshot.forked_from`), keeps the origin's transcript up to the revision, gives its
writes new idempotency keys and asks again for every approval.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import MemoryStore, Runtime, SqliteStore, Tool, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    ForkOrigin,
    HookName,
    RunEvent,
    RunState,
    RunView,
    SteerableError,
    ToolResult,
    UserMessage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


class Writes:
    """A write tool `w` and an approval-required write `pay`, recording every execution."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str, str]] = []  # (tool, run_id, call_id, key)
        writes = self

        @tool(side_effect="write")
        def w(n: int, ctx: ToolContext) -> str:
            with writes.lock:
                writes.calls.append(("w", ctx.run_id, ctx.call_id, ctx.idempotency_key))
            return f"wrote {n}"

        @tool(side_effect="write", requires_approval=True)
        def pay(n: int, ctx: ToolContext) -> str:
            with writes.lock:
                writes.calls.append(("pay", ctx.run_id, ctx.call_id, ctx.idempotency_key))
            return f"paid {n}"

        @tool(side_effect="none")
        def read(q: str) -> str:
            return q.upper()

        self.tools: list[Tool[Any, Any]] = [w, pay, read]

    def of(self, run_id: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [(name, cid, key) for name, rid, cid, key in self.calls if rid == run_id]


def forbidden_tools() -> list[Tool[Any, Any]]:
    """The same tools, failing the test if a replay ever calls one."""

    def boom(name: str) -> str:
        raise AssertionError(f"replay called tool {name}")

    @tool(side_effect="write")
    def w(n: int, ctx: ToolContext) -> str:
        return boom("w")

    @tool(side_effect="write", requires_approval=True)
    def pay(n: int, ctx: ToolContext) -> str:
        return boom("pay")

    @tool(side_effect="none")
    def read(q: str) -> str:
        return boom("read")

    return [w, pay, read]


class Forbidden:
    """An agent that fails the test if it is asked to decide."""

    name = "a"

    def __init__(self) -> None:
        self.called = threading.Event()

    def decide(self, view: RunView) -> Any:
        self.called.set()
        raise AssertionError("replay called the agent")


def origin_agent() -> ScriptedAgent:
    return ScriptedAgent(
        [
            plan(call("w", n=1), call("read", q="x")),
            AskUser(question="which?"),
            plan(call("pay", n=2)),
            Finish(output="origin done"),
        ],
        name="a",
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
def origin(db: Path) -> tuple[str, Writes]:
    """A finished run with writes, an AskUser answer and an approved payment, in `db`."""
    writes = Writes()
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        handle = rt.start("pay the bill", agent=origin_agent())
        wait_state(handle, RunState.WAITING)
        handle.send("the blue one")
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        (request,) = handle.pending_approvals()
        assert handle.approve(request.call_id)
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
    return handle.run_id, writes


def plan_revision(store: Any, run_id: str, tool_name: str) -> int:
    """The revision checkpointed when the plan calling `tool_name` was made (before dispatch)."""
    for info in store.revisions(run_id):
        snap = store.load(run_id, info.revision).snapshot
        if any(pc.name == tool_name for pc in snap.plan):
            return int(info.revision)
    raise AssertionError(f"no revision with a plan calling {tool_name}")


# --------------------------------------------------------------------------- revisions


def test_revisions_list_every_checkpoint_of_a_run(db: Path) -> None:
    writes = Writes()
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        handle = rt.start("t", agent=ScriptedAgent([plan(call("read", q="a"))], name="a"))
        outcome = handle.result(timeout=WAIT)
        checkpoints = [
            e.data["revision"] for e in handle.events() if e.kind is EventKind.CHECKPOINT
        ]
        infos = rt.revisions(handle.run_id)
    assert [i.revision for i in infos] == checkpoints == list(range(outcome.revision + 1))
    assert {i.run_id for i in infos} == {handle.run_id}
    assert infos[-1].state is RunState.FINISHED
    assert all(i.state is RunState.RUNNING for i in infos[:-1])
    lengths = [i.transcript_len for i in infos]
    assert lengths == sorted(lengths)
    assert infos[-1].transcript_len == 3  # plan, its result, the finish
    with Runtime(store=SqliteStore(db)) as rt2, pytest.raises(SteerableError) as info:
        rt2.revisions("run_unknown")
    assert info.value.code is ErrorCode.NOT_FOUND


# --------------------------------------------------------------------------- replay


def test_replay_at_each_revision_executes_nothing(db: Path, origin: tuple[str, Writes]) -> None:
    run_id, writes = origin
    executed = len(writes.calls)
    agent = Forbidden()
    hooked: list[RunEvent] = []
    with Runtime(store=SqliteStore(db), tools=forbidden_tools(), agents={"a": agent}) as rt:
        for name in HookName:
            rt.on(name, hooked.append)
        final = rt.replay(run_id)
        infos = rt.revisions(run_id)
        replays = [rt.replay(run_id, info.revision) for info in infos]
        stats = rt.statistics()
    assert not agent.called.is_set()
    assert hooked == []
    assert len(writes.calls) == executed
    assert stats["runs_started"] == 0
    assert stats["workers_busy"] == 0
    assert final.revision == infos[-1].revision
    assert final.outcome is not None
    assert final.outcome.state is RunState.FINISHED
    assert final.outcome.output == "origin done"
    for info, replay in zip(infos, replays, strict=True):
        assert replay.run_id == run_id
        assert replay.revision == info.revision
        assert replay.snapshot.revision == info.revision
        assert replay.snapshot.state is info.state
        assert len(replay.transcript) == info.transcript_len
        # Each revision's transcript is a prefix of the final one.
        assert replay.transcript == final.transcript[: info.transcript_len]
        assert (replay.outcome is not None) is info.state.is_terminal


def test_replay_reconstructs_the_transcript_and_derives_the_events(
    db: Path, origin: tuple[str, Writes]
) -> None:
    run_id, _ = origin
    with Runtime(store=SqliteStore(db), tools=forbidden_tools()) as rt:
        replay = rt.replay(run_id)
    kinds = [type(e).__name__ for e in replay.transcript]
    assert kinds == [
        "DecisionEntry",  # plan w, read
        "ToolResult",
        "ToolResult",
        "DecisionEntry",  # ask user
        "UserMessage",
        "DecisionEntry",  # plan pay
        "ToolResult",
        "DecisionEntry",  # finish
    ]
    entries = replay.transcript
    assert isinstance(entries[1], ToolResult)
    assert (entries[1].tool, entries[1].value) == ("w", "wrote 1")
    assert isinstance(entries[2], ToolResult)
    assert (entries[2].tool, entries[2].value) == ("read", "X")
    assert isinstance(entries[4], UserMessage)
    assert (entries[4].seq, entries[4].content) == (0, "the blue one")
    assert isinstance(entries[6], ToolResult)
    assert entries[6].value == "paid 2"
    assert isinstance(entries[7], DecisionEntry)
    assert entries[7].decision.kind == "finish"

    events = replay.events
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.run_id for e in events} == {run_id}
    assert events[0].kind is EventKind.RUN_STARTED
    assert events[0].data["task"] == "pay the bill"
    assert events[-1].kind is EventKind.RUN_ENDED
    assert events[-1].data["state"] == "finished"
    per_entry = [e.kind for e in events[1:-1]]
    assert per_entry == [
        EventKind.REASONING_FINISHED,
        EventKind.TOOL_FINISHED,
        EventKind.TOOL_FINISHED,
        EventKind.REASONING_FINISHED,
        EventKind.MESSAGE_DELIVERED,
        EventKind.REASONING_FINISHED,
        EventKind.TOOL_FINISHED,
        EventKind.REASONING_FINISHED,
    ]
    assert events[2].data["tool"] == "w"
    assert events[5].data["seq"] == 0


def test_replay_of_a_memory_store_run_calls_nothing_in_the_same_runtime() -> None:
    agent = ScriptedAgent([plan(call("read", q="a")), Finish(output=1)], name="a")
    writes = Writes()
    with Runtime(store=MemoryStore(), tools=writes.tools) as rt:
        handle = rt.start("t", agent=agent)
        handle.result(timeout=WAIT)
        calls = agent.calls
        for info in rt.revisions(handle.run_id):
            rt.replay(handle.run_id, info.revision)
        with pytest.raises(SteerableError) as info_:
            rt.replay(handle.run_id, 999)
        stats = rt.statistics()
    assert info_.value.code is ErrorCode.NOT_FOUND
    assert agent.calls == calls
    assert stats["runs_started"] == 1


# --------------------------------------------------------------------------- fork


def test_fork_from_a_mid_run_revision_is_a_new_run_with_new_write_keys(
    db: Path, origin: tuple[str, Writes]
) -> None:
    run_id, writes = origin
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        revision = plan_revision(rt.store, run_id, "w")
        before = rt.replay(run_id, revision)
        origin_revisions = rt.revisions(run_id)
        agent = ScriptedAgent([], then=Finish(output="fork done"), name="a")
        fork = rt.fork(run_id, revision, agent=agent)
        assert fork.run_id != run_id
        started = wait_event(fork, EventKind.RUN_STARTED)
        assert started.data["forked_from"] == {"run_id": run_id, "revision": revision}
        outcome = fork.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "fork done"
        stored = rt.store.load(fork.run_id)
        assert rt.revisions(run_id) == origin_revisions  # the origin is untouched
    assert stored.snapshot.forked_from == ForkOrigin(run_id=run_id, revision=revision)
    assert stored.snapshot.run_id == fork.run_id
    # The origin's history up to the revision is copied into the fork.
    view = agent.views[0]
    assert list(view.transcript[: len(before.transcript)]) == list(before.transcript)
    assert list(stored.transcript[: len(before.transcript)]) == list(before.transcript)
    # The write without a result at that revision runs again, as a new write with a new key.
    (origin_w,) = [c for c in writes.of(run_id) if c[0] == "w"]
    (fork_w,) = writes.of(fork.run_id)
    assert fork_w[0] == "w"
    assert fork_w[1] == origin_w[1]  # the same call of the same plan
    assert fork_w[2] != origin_w[2]  # ... but a new idempotency key (R4, R23)
    assert fork_w[2].startswith("idem_")
    results = {r.tool: r for r in view.transcript if isinstance(r, ToolResult)}
    assert results["w"].ok


def test_a_fork_asks_again_for_approvals(db: Path, origin: tuple[str, Writes]) -> None:
    run_id, writes = origin
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        revision = plan_revision(rt.store, run_id, "pay")
        agent = ScriptedAgent([], then=Finish(output="forked"), name="a")
        fork = rt.fork(run_id, revision, agent=agent)
        requested = wait_event(fork, EventKind.APPROVAL_REQUESTED)
        wait_state(fork, RunState.WAITING)
        (request,) = fork.pending_approvals()
        assert request.call_id == requested.data["call_id"]
        assert request.tool == "pay"
        assert request.run_id == fork.run_id
        assert writes.of(fork.run_id) == []  # approved in the origin, not in the fork
        assert agent.calls == 0
        assert fork.approve(request.call_id) is True
        outcome = fork.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    ((name, _, key),) = writes.of(fork.run_id)
    (origin_pay,) = [c for c in writes.of(run_id) if c[0] == "pay"]
    assert name == "pay"
    assert key != origin_pay[2]


def test_fork_of_an_unknown_revision_is_not_found(db: Path, origin: tuple[str, Writes]) -> None:
    run_id, writes = origin
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        with pytest.raises(SteerableError) as info:
            rt.fork(run_id, 999, agent=ScriptedAgent(name="a"))
        assert info.value.code is ErrorCode.NOT_FOUND
        with pytest.raises(SteerableError) as unknown:
            rt.fork("run_unknown", agent=ScriptedAgent(name="a"))
        assert unknown.value.code is ErrorCode.NOT_FOUND
        assert rt.statistics()["runs_started"] == 0


def test_a_fork_of_a_waiting_revision_waits_for_its_own_answer(
    db: Path, origin: tuple[str, Writes]
) -> None:
    run_id, writes = origin
    with Runtime(store=SqliteStore(db), tools=writes.tools) as rt:
        waiting = [i for i in rt.revisions(run_id) if i.state is RunState.WAITING]
        assert waiting
        agent = ScriptedAgent([], then=Finish(output="other answer"), name="a")
        fork = rt.fork(run_id, waiting[0].revision, agent=agent)
        wait_state(fork, RunState.WAITING)
        assert fork.send("the red one") == 0
        outcome = fork.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    messages = [m.content for m in agent.views[0].transcript if isinstance(m, UserMessage)]
    assert messages == ["the red one"]  # the origin's later answer is not part of the fork
