"""Hostile values (issue 18, docs/reliability.md "Hostile values"): what the codec cannot store
is refused where it enters, for that call or run alone; both stores accept and refuse the same;
recorded values are immutable; results are converted in bounded time; duplicate tool names,
host calls with bad arguments and `shutdown()` from a runtime thread are typed refusals.

Real runtimes, synchronised on run states, events and gates; the SQLite cases use tmp_path.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import CheckpointStore, MemoryStore, Runtime, SqliteStore, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    ToolCall,
    ToolResult,
    UserMessage,
)
from steerable.protocol.codec import MAX_VALUE_BYTES, MAX_VALUE_DEPTH, check_storable

if TYPE_CHECKING:  # mypy resolves the kit as tests.machine_kit (explicit package bases)
    from tests.machine_kit import Run
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from machine_kit import Run

WAIT = 10.0  # generous fail-instead-of-hang bound


def nested(depth: int) -> list[Any]:
    """A list nested `depth` deep."""
    root: list[Any] = []
    inner = root
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return root


# Values no store can keep, as a model or a careless agent might hand them over.
UNSTORABLE: dict[str, Callable[[], Any]] = {
    "int >= 2**64": lambda: 2**64,
    "int < -2**63": lambda: -(2**63) - 1,
    "bytes not utf-8": lambda: b"\xff\xfe",
    "a lock": threading.Lock,
    "too deep": lambda: nested(MAX_VALUE_DEPTH + 5),
    "lone surrogate": lambda: "\ud800",
    "surrogate key": lambda: {"\udcff": 1},
    "a generator": lambda: (i for i in range(3)),
}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    """Each contract test runs on both stores."""
    if request.param == "memory":
        yield MemoryStore()
    else:
        yield SqliteStore(tmp_path / "runs.db")


@tool
def echo(x: Any = None) -> str:
    """Accept anything (the codec, not the tool, must refuse what cannot be stored)."""
    return "echoed"


def _first_results(agent: ScriptedAgent) -> list[ToolResult]:
    return [r for r in agent.views[1].last_results if isinstance(r, ToolResult)]


# ---------------------------------------------------------------- item 2: entry validation


@pytest.mark.parametrize("name", sorted(UNSTORABLE))
def test_an_unstorable_argument_fails_that_call_alone_on_both_stores(
    store: CheckpointStore, name: str
) -> None:
    bad = ScriptedAgent(
        [plan(call("echo", x=UNSTORABLE[name]()), call("echo", x="fine"))],
        then=Finish(output="bad done"),
    )
    good = ScriptedAgent([plan(call("echo", x=1))], then=Finish(output="good done"))
    with Runtime(store=store, tools=[echo]) as rt:
        h_bad = rt.start("bad", agent=bad)
        h_good = rt.start("good", agent=good)
        out_bad, out_good = h_bad.result(timeout=WAIT), h_good.result(timeout=WAIT)
        # The store still serves everyone: a third run, and both replays.
        later = rt.start("later", agent=ScriptedAgent([], then=Finish(output=3)))
        assert later.result(timeout=WAIT).state is RunState.FINISHED
        replay_bad = rt.replay(h_bad.run_id)
        replay_good = rt.replay(h_good.run_id)
    assert (out_bad.state, out_bad.output) == (RunState.FINISHED, "bad done")
    assert (out_good.state, out_good.output) == (RunState.FINISHED, "good done")
    first, second = _first_results(bad)
    assert not first.ok
    assert first.error is not None
    assert first.error.code is ErrorCode.INVALID_ARGUMENTS
    assert "echo" in first.error.message
    assert second.ok
    assert second.value == "echoed"
    # Recorded without the value: the decision keeps the call, with no arguments.
    decision = replay_bad.transcript[0]
    assert decision.kind == "decision"
    assert isinstance(decision.decision, Plan)
    steps = decision.decision.steps
    assert isinstance(steps[0], ToolCall)
    assert steps[0].arguments == {}
    assert isinstance(steps[1], ToolCall)
    assert steps[1].arguments == {"x": "fine"}
    assert [e.kind for e in replay_good.transcript].count("tool_result") == 1


def test_a_validator_that_makes_an_unstorable_value_fails_that_call(
    store: CheckpointStore,
) -> None:
    @tool
    def count(n: int) -> int:
        return n

    agent = ScriptedAgent([plan(call("count", n="99999999999999999999999"))])
    with Runtime(store=store, tools=[count]) as rt:
        out = rt.start("big", agent=agent).result(timeout=WAIT)
    assert out.state is RunState.FINISHED
    (result,) = _first_results(agent)
    assert result.error is not None
    assert result.error.code is ErrorCode.INVALID_ARGUMENTS
    assert "validated arguments" in result.error.message


@pytest.mark.parametrize(
    "decision",
    [
        AskUser(question="\ud800?"),
        Plan(steps=(ToolCall(name="echo"),), thought="\udfff"),
        Finish(output=2**64),
        Finish(output=nested(MAX_VALUE_DEPTH + 5)),
        Finish(output=itertools.count()),
        {"kind": "ask_user", "question": "x\ud800"},
    ],
    ids=["question", "thought", "big-int-output", "deep-output", "iterator-output", "dict"],
)
def test_an_unstorable_decision_ends_that_run_invalid_decision(
    store: CheckpointStore, decision: Any
) -> None:
    with Runtime(store=store, tools=[echo]) as rt:
        bad = rt.start("bad", agent=ScriptedAgent([decision]))
        good = rt.start("good", agent=ScriptedAgent([plan(call("echo"))], then=Finish(output=1)))
        out = bad.result(timeout=WAIT)
        assert good.result(timeout=WAIT).state is RunState.FINISHED
        stored = rt.replay(bad.run_id)
    assert out.state is RunState.ERROR
    assert [e.code for e in out.errors] == [ErrorCode.INVALID_DECISION]
    assert stored.outcome is None or stored.outcome.state is RunState.ERROR


@pytest.mark.parametrize(
    ("task", "raised"),
    [
        (None, TypeError),
        (42, TypeError),
        (b"bytes", TypeError),
        ("lone \ud800", ValueError),
        ("x" * (MAX_VALUE_BYTES + 1), ValueError),
    ],
    ids=["none", "int", "bytes", "surrogate", "too-large"],
)
def test_start_refuses_a_task_no_store_could_keep(
    store: CheckpointStore, task: Any, raised: type[Exception]
) -> None:
    with Runtime(store=store) as rt:
        with pytest.raises(raised, match="task"):
            rt.start(task, agent=ScriptedAgent())
        with pytest.raises(TypeError, match="session_id"):
            rt.start("t", agent=ScriptedAgent(), session_id=7)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="task_id"):
            rt.start("t", agent=ScriptedAgent(), task_id="\ud800")
        with pytest.raises(TypeError, match="RunConfig"):
            rt.start("t", agent=ScriptedAgent(), config={"max_steps": 1})  # type: ignore[arg-type]
        assert rt.statistics()["runs_started"] == 0
        assert rt.start("ok", agent=ScriptedAgent()).result(timeout=WAIT).state is (
            RunState.FINISHED
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"max_steps": 2**64},
        {"max_model_calls": 2**63},
        {"token_budget": 2**70},
        {"max_children": 2**64},
        {"step_timeout": float("nan")},
        {"total_timeout": float("nan")},
        {"cancel_grace": float("nan")},
    ],
    ids=lambda f: next(iter(f)),
)
def test_run_config_refuses_what_a_checkpoint_cannot_store(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        RunConfig(**fields)


def test_the_largest_counts_a_config_takes_are_stored_and_the_run_ends(
    store: CheckpointStore,
) -> None:
    # The largest int a config accepts must be stored, and result() must return.
    config = RunConfig(max_steps=2**63 - 1, max_model_calls=2**63 - 1, token_budget=2**63 - 1)
    with Runtime(store=store, tools=[echo]) as rt:
        handle = rt.start("big", agent=ScriptedAgent([plan(call("echo"))]), config=config)
        out = handle.result(timeout=WAIT)
        assert [e.kind for e in rt.replay(handle.run_id).transcript].count("tool_result") == 1
    assert out.state is RunState.FINISHED
    assert handle.done()


@pytest.mark.parametrize(
    ("content", "raised"),
    [(5, TypeError), (None, TypeError), (b"x", TypeError), ("\ud800", ValueError)],
    ids=["int", "none", "bytes", "surrogate"],
)
def test_send_refuses_content_no_store_could_keep_and_uses_no_seq(
    store: CheckpointStore, content: Any, raised: type[Exception]
) -> None:
    agent = ScriptedAgent([AskUser(question="?")], then=Finish(output="bye"))
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        with pytest.raises(raised, match="content"):
            handle.send(content)
        assert handle.send("hello") == 0  # the refused send took no seq
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
    assert [m.content for m in agent.views[1].delivered] == ["hello"]


def test_both_stores_refuse_the_same_records_and_stay_usable(store: CheckpointStore) -> None:
    bad_result = ToolResult(call_id="c1", tool="t", ok=True, value=2**64)
    bad_message = UserMessage(seq=0, content="\ud800")
    with pytest.raises(ValueError, match="integer"):
        store.journal("run_x", bad_result)
    with pytest.raises(ValueError, match="not valid Unicode"):
        store.append_message("run_x", bad_message)
    store.journal("run_x", ToolResult(call_id="c1", tool="t", ok=True, value=1))
    store.append_message("run_x", UserMessage(seq=0, content="fine"))
    assert store.flush(WAIT)
    store.close()


def test_the_sqlite_writer_isolates_a_write_the_codec_refuses(tmp_path: Path) -> None:
    # A checkpoint that slips past the entry points fails alone: the batch it shares with
    # another run's checkpoint commits, and the store keeps accepting writes.
    store = SqliteStore(tmp_path / "runs.db")
    try:
        runs = {rid: Run(run_id=rid).start() for rid in ("run_bad", "run_good")}
        snapshots = {rid: run.machine.snapshot() for rid, run in runs.items()}
        poison = ToolResult(call_id="c", tool="t", ok=True, value=2**64)
        stored: list[str] = []
        store.write_checkpoint("run_bad", 0, snapshots["run_bad"], 0, [poison], lambda: None)
        store.write_checkpoint(
            "run_good", 0, snapshots["run_good"], 0, [], lambda: stored.append("good")
        )
        assert store.flush(WAIT)
        assert stored == ["good"]
        assert store.load("run_good").snapshot.run_id == "run_good"
        with pytest.raises(Exception, match="no run"):
            store.load("run_bad")
        store.write_checkpoint("run_bad", 0, snapshots["run_bad"], 0, [])
        assert store.load("run_bad").snapshot.run_id == "run_bad"
    finally:
        store.close()


def test_check_storable_is_bounded_by_the_size_not_the_value() -> None:
    with pytest.raises(ValueError, match="larger than"):
        check_storable(range(10**15))
    with pytest.raises(ValueError, match="larger than"):
        check_storable([0] * 10**7, max_bytes=1000)
    with pytest.raises(TypeError, match="iterator"):
        check_storable({"a": [itertools.count()]})
    assert check_storable({"a": [1, "two", None, 2.5, True]}) > 0


# ---------------------------------------------------------------- item 3: validate, then claim


def test_deny_with_a_bad_reason_raises_and_leaves_the_approval_pending() -> None:
    payments: list[int] = []

    @tool(side_effect="write", requires_approval=True)
    def pay(amount: int) -> str:
        payments.append(amount)
        return "paid"

    agent = ScriptedAgent([plan(call("pay", amount=5))], then=Finish(output="done"))
    with Runtime(tools=[pay]) as rt:
        handle = rt.start("pay", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        (request,) = handle.pending_approvals()
        for reason, raised in ((None, TypeError), (3, TypeError), ("\ud800", ValueError)):
            with pytest.raises(raised, match="reason"):
                handle.deny(request.call_id, reason=reason)  # type: ignore[arg-type]
            assert [r.call_id for r in handle.pending_approvals()] == [request.call_id]
        with pytest.raises(TypeError, match="call_id"):
            handle.approve(7)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="reason"):
            handle.cancel(reason=None)  # type: ignore[arg-type]
        assert handle.deny(request.call_id, reason="not today")
        out = handle.result(timeout=WAIT)
    assert out.state is RunState.FINISHED
    assert payments == []
    (result,) = _first_results(agent)
    assert result.error is not None
    assert result.error.code is ErrorCode.APPROVAL_DENIED


def test_cancel_with_a_bad_reason_raises_and_a_later_cancel_works() -> None:
    gate = Gate()
    with Runtime(tools=[gate.tool()]) as rt:
        handle = rt.start("t", agent=ScriptedAgent([plan(call("gate"))]))
        gate.wait_started()
        with pytest.raises(TypeError, match="reason"):
            handle.cancel(reason=42)  # type: ignore[arg-type]
        assert handle.state is RunState.RUNNING
        assert handle.cancel("really")
        assert handle.result(timeout=WAIT).state is RunState.CANCELLED


# ---------------------------------------------------------------- item 8: bounded results


def test_a_tool_returning_an_infinite_iterator_or_a_huge_value_gets_handler_error(
    store: CheckpointStore,
) -> None:
    @tool
    def forever() -> Any:
        return itertools.count()

    @tool
    def generator() -> Any:
        return (i for i in range(3))

    @tool
    def huge() -> list[int]:
        return [0] * 5_000_000

    @tool
    def endless_range() -> range:
        return range(10**18)

    names = ["forever", "generator", "huge", "endless_range"]
    agent = ScriptedAgent([plan(*(call(n) for n in names))], then=Finish(output="alive"))
    with Runtime(store=store, tools=[forever, generator, huge, endless_range]) as rt:
        out = rt.start("t", agent=agent).result(timeout=WAIT)
    assert (out.state, out.output) == (RunState.FINISHED, "alive")
    results = _first_results(agent)
    assert [r.tool for r in results] == names
    for r in results:
        assert r.error is not None, r
        assert r.error.code is ErrorCode.HANDLER_ERROR, r
    assert "iterator" in results[0].error.message  # type: ignore[union-attr]
    assert "iterator" in results[1].error.message  # type: ignore[union-attr]


# ---------------------------------------------------------------- item 9: immutable records


def test_an_agent_cannot_change_what_was_recorded(store: CheckpointStore) -> None:
    @tool
    def fetch(x: str = "") -> dict[str, Any]:
        return {"items": [1, 2], "meta": {"k": "v"}}

    attempts: list[str] = []
    mine: dict[str, Any] = {"x": "original"}

    def mutate(view: RunView) -> Any:
        (result,) = view.last_results
        assert isinstance(result, ToolResult)
        assert result.ok
        changes: tuple[tuple[str, Callable[[], object]], ...] = (
            ("value[k]=", lambda: result.value.__setitem__("extra", 1)),
            ("items.append", lambda: result.value["items"].append(3)),
            ("meta.update", lambda: result.value["meta"].update(k="changed")),
            ("del", lambda: result.value.__delitem__("items")),
        )
        for name, change in changes:
            try:
                change()
            except TypeError:
                attempts.append(name)
        mine["x"] = "changed after returning"  # the agent's own dict, returned last time
        return Finish(output="ok")

    decision = {"kind": "plan", "steps": [{"kind": "tool", "name": "fetch", "arguments": mine}]}
    agent = ScriptedAgent([decision, mutate])
    with Runtime(store=store, tools=[fetch]) as rt:
        handle = rt.start("t", agent=agent)
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        replay = rt.replay(handle.run_id)
    assert attempts == ["value[k]=", "items.append", "meta.update", "del"]
    entry, result = replay.transcript[0], replay.transcript[1]
    assert isinstance(result, ToolResult)
    assert result.value == {"items": [1, 2], "meta": {"k": "v"}}
    assert entry.kind == "decision"
    (step,) = entry.decision.steps  # type: ignore[union-attr]
    assert isinstance(step, ToolCall)
    assert step.arguments == {"x": "original"}


def test_a_plan_cannot_be_changed_after_it_is_returned() -> None:
    arguments = {"x": [1]}
    step = ToolCall(name="echo", arguments=arguments)
    arguments["x"].append(2)  # the caller's own list: the record took a copy
    assert step.arguments == {"x": [1]}
    with pytest.raises(TypeError, match="immutable"):
        step.arguments["x"].append(3)
    with pytest.raises(TypeError, match="immutable"):
        step.arguments["y"] = 1
    assert step.arguments == {"x": [1]}
    assert Finish(output={"a": [1]}).output == {"a": [1]}


# ---------------------------------------------------------------- item 10: duplicate names


def test_two_tools_with_one_name_are_refused_naming_both() -> None:
    @tool(name="dup")
    def first() -> str:
        return "1"

    @tool(name="dup")
    def second() -> str:
        return "2"

    with pytest.raises(ValueError, match=r"two tools named 'dup'.*first.*second"):
        Runtime(tools=[first, second])
    with Runtime(tools=[first]) as rt:
        with pytest.raises(ValueError, match=r"two tools named 'dup'"):
            rt.start("t", agent=ScriptedAgent(), tools=[first, second])
        # Replacing a runtime tool by name for one run stays allowed (documented).
        agent = ScriptedAgent([plan(call("dup"))])
        assert rt.start("t", agent=agent, tools=[second]).result(timeout=WAIT).state is (
            RunState.FINISHED
        )
    assert [r.value for r in _first_results(agent)] == ["2"]
    with Runtime(tools=[first, first]) as rt:  # the same tool twice is one tool
        assert list(rt.tools) == ["dup"]


# ---------------------------------------------------------------- item 11: shutdown


def test_shutdown_from_a_tool_a_hook_or_a_decide_is_refused_at_once() -> None:
    box: dict[str, Runtime] = {}
    refusals: list[str] = []

    @tool
    def stop_it() -> str:
        box["rt"].shutdown()
        return "stopped?"

    def hook(event: Any) -> None:
        try:
            box["rt"].shutdown()
        except RuntimeError as exc:
            refusals.append(str(exc))

    def decide_shutdown(view: RunView) -> Any:
        box["rt"].shutdown()
        return Finish(output="never")

    with Runtime(tools=[stop_it]) as rt:
        box["rt"] = rt
        rt.on("on_finish", hook)
        agent = ScriptedAgent([plan(call("stop_it"))], then=Finish(output="finished"))
        out = rt.start("tool", agent=agent).result(timeout=WAIT)
        decide_out = rt.start("decide", agent=ScriptedAgent([decide_shutdown])).result(WAIT)
        # The runtime still works: nothing was stopped.
        assert rt.start("after", agent=ScriptedAgent()).result(WAIT).state is RunState.FINISHED
    assert out.state is RunState.FINISHED
    (result,) = _first_results(agent)
    assert result.error is not None
    assert result.error.code is ErrorCode.HANDLER_ERROR
    assert "own threads" in result.error.message
    assert decide_out.state is RunState.ERROR
    assert "own threads" in decide_out.errors[0].message
    assert refusals
    assert all("own threads" in r for r in refusals)


def test_a_second_shutdown_returns_only_when_the_first_has_finished() -> None:
    cancelled = threading.Event()
    release = threading.Event()

    @tool(side_effect="none")
    def stubborn(ctx: ToolContext) -> str:
        ctx.cancel_event.wait(WAIT)
        cancelled.set()
        release.wait(WAIT)  # ignores the cancellation: shutdown must wait for its worker
        return "late"

    rt = Runtime(tools=[stubborn], config=RunConfig(cancel_grace=WAIT))
    handle = rt.start("t", agent=ScriptedAgent([plan(call("stubborn"))]))
    wait_event(handle, EventKind.TOOL_STARTED)
    results: dict[str, list[str]] = {}
    order: list[str] = []
    lock = threading.Lock()

    def shut(name: str) -> None:
        left = rt.shutdown(timeout=WAIT)
        with lock:
            results[name] = left
            order.append(name)

    first = threading.Thread(target=shut, args=("first",))
    first.start()
    assert cancelled.wait(WAIT)  # the first shutdown is under way (it cancelled the run)
    second = threading.Thread(target=shut, args=("second",))
    second.start()
    second.join(0.2)
    assert second.is_alive(), "the second shutdown returned before the first finished"
    release.set()
    first.join(WAIT)
    second.join(WAIT)
    assert not first.is_alive()
    assert not second.is_alive()
    assert results["first"] == results["second"] == []
    assert handle.done()


# ---------------------------------------------------------------- item 13: plan cost


def _lines_executed(steps: int) -> int:
    """Lines of the run machine's code (every module of the package) run for one plan of
    `steps` calls (a count of operations, not seconds: deterministic)."""
    from steerable.actors import _machine

    package = str(Path(_machine.__file__).parent)
    run = Run(config=RunConfig(max_steps=steps)).start()
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if not frame.f_code.co_filename.startswith(package):
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        run.decide_next(plan(*(call("read", q=i) for i in range(steps))))
        run.finish_all_calls()
    finally:
        sys.settrace(None)
    assert run.machine.steps == steps
    return count


def test_the_cost_of_a_plan_grows_linearly_with_its_steps() -> None:
    small, large = _lines_executed(250), _lines_executed(2_000)
    # Linear: 8x the steps costs about 8x the lines (quadratic was ~64x).
    assert large < 9 * small, (small, large)
