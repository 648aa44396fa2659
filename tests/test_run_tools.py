"""Tool execution inside a run: parallelism and its bound (R17), isolation (R7), error results
(R5), retries (R16), async tools, contained BaseExceptions (T7) and the ToolContext (R4, R19).

Integration tests through the public API with real threads; they synchronise on Gates,
threading primitives and run events, never on sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from steerable.actors import RetryableToolError, Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound

FAST_RETRY = RetryPolicy(max_retries=3, backoff=0.01, multiplier=2.0, jitter=False)


def _results(view: RunView) -> list[ToolResult]:
    results = [r for r in view.last_results if isinstance(r, ToolResult)]
    assert len(results) == len(view.last_results)
    return results


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


# ---------------------------------------------------------------------- parallelism


def test_plan_runs_in_parallel_bounded_by_max_parallel_tools() -> None:
    gate = Gate()
    lock = threading.Lock()
    active = 0
    peak = 0

    @tool
    def bounded(ctx: ToolContext, value: str = "") -> Any:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            return gate.enter(ctx, value)
        finally:
            with lock:
                active -= 1

    steps = [call("bounded", value=f"v{i}") for i in range(6)]
    agent = ScriptedAgent([plan(*steps)])
    with Runtime(tools=[bounded]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(max_parallel_tools=2))
        # two calls block at once: they run concurrently
        gate.wait_started(2)
        gate.release()
        outcome = handle.result(timeout=WAIT)
        events = list(handle.events())
    assert outcome.state is RunState.FINISHED
    assert len(gate.contexts) == 6
    assert peak == 2
    # the runtime never had more than two calls of the plan in flight
    running = most = 0
    for event in events:
        if event.kind is EventKind.TOOL_STARTED:
            running += 1
            most = max(most, running)
        elif event.kind is EventKind.TOOL_FINISHED:
            running -= 1
    assert most == 2
    assert [r.value for r in _results(agent.views[1])] == [f"v{i}" for i in range(6)]


def test_third_call_waits_for_a_free_slot() -> None:
    gate = Gate()
    agent = ScriptedAgent([plan(call("g", value="a"), call("g", value="b"), call("g", value="c"))])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(max_parallel_tools=2))
        gate.wait_started(2)
        # a user message is handled after everything the supervisor did before: once it is
        # accepted, the dispatch decisions of the plan so far are all visible as events
        handle.send("sync point")
        accepted = wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        started = 0
        for event in handle.events(timeout=WAIT):
            if event.seq >= accepted.seq:
                break
            started += event.kind is EventKind.TOOL_STARTED
        assert started == 2
        assert len(gate.contexts) == 2
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(gate.contexts) == 3


def test_results_come_back_in_step_order_not_completion_order() -> None:
    gate = Gate()
    agent = ScriptedAgent([plan(call("slow", value="first"), call("echo", text="second"))])
    with Runtime(tools=[gate.tool("slow"), echo]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)
        fast_done = wait_event(handle, EventKind.TOOL_FINISHED)
        assert fast_done.data["tool"] == "echo"  # the second step finished first
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    results = _results(agent.views[1])
    assert [r.tool for r in results] == ["slow", "echo"]
    assert [r.value for r in results] == ["first", "second"]


# ---------------------------------------------------------------------- isolation and errors


def test_a_failing_call_neither_fails_the_run_nor_cancels_its_siblings() -> None:
    gate = Gate()

    @tool
    def boom() -> str:
        raise ValueError("kaput")

    agent = ScriptedAgent([plan(call("boom"), call("slow")), Finish(output="recovered")])
    with Runtime(tools=[boom, gate.tool("slow")]) as rt:
        handle = rt.start("t", agent=agent)
        (ctx,) = gate.wait_started(1)
        failed = wait_event(handle, EventKind.TOOL_FINISHED, lambda e: e.data["tool"] == "boom")
        assert failed.data["ok"] is False
        assert not ctx.cancelled  # the sibling is untouched
        assert handle.state is RunState.RUNNING
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "recovered"
    boom_result, slow_result = _results(agent.views[1])
    assert not boom_result.ok
    assert boom_result.error is not None
    assert boom_result.error.code is ErrorCode.HANDLER_ERROR
    assert "kaput" in boom_result.error.message
    assert boom_result.error.details["exception"] == "ValueError"
    assert slow_result.ok
    assert slow_result.value == "released"


def test_unknown_tool_and_invalid_arguments_are_error_results_not_steps() -> None:
    agent = ScriptedAgent(
        [
            plan(
                call("nope", x=1),
                call("echo", text=["not", "a", "string"]),
                call("echo"),
                call("echo", text="fine"),
            )
        ]
    )
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    unknown, bad_type, missing, fine = _results(agent.views[1])
    assert unknown.error is not None
    assert unknown.error.code is ErrorCode.UNKNOWN_TOOL
    assert unknown.attempts == 0
    assert bad_type.error is not None
    assert bad_type.error.code is ErrorCode.INVALID_ARGUMENTS
    assert bad_type.error.details["errors"][0]["loc"] == ["text"]
    assert missing.error is not None
    assert missing.error.code is ErrorCode.INVALID_ARGUMENTS
    assert fine.ok
    assert fine.value == "fine"
    assert outcome.metrics.steps == 1  # never-executed calls are not tool steps (R27)
    assert outcome.metrics.tool_errors == 3


def test_tool_exception_becomes_a_handler_error_result() -> None:
    @tool
    def divide(a: int, b: int) -> float:
        return a / b

    agent = ScriptedAgent([plan(call("divide", a=1, b=0))])
    with Runtime(tools=[divide]) as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert not result.ok
    assert result.error is not None
    assert result.error.code is ErrorCode.HANDLER_ERROR
    assert result.error.retryable is False
    assert result.error.details["exception"] == "ZeroDivisionError"
    assert result.attempts == 1


# ---------------------------------------------------------------------- retries (R16)


@pytest.mark.parametrize("side_effect", ["none", "idempotent"])
def test_retryable_failure_is_retried_with_backoff_and_the_same_key(side_effect: str) -> None:
    seen: list[tuple[str, str, int]] = []

    @tool(side_effect=side_effect)
    def flaky(ctx: ToolContext) -> str:
        seen.append((ctx.call_id, ctx.idempotency_key, ctx.attempt))
        if ctx.attempt < 3:
            raise RetryableToolError("busy", details={"try": ctx.attempt})
        return "third time lucky"

    agent = ScriptedAgent([plan(call("flaky"))])
    with Runtime(tools=[flaky]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(retry=FAST_RETRY))
        outcome = handle.result(timeout=WAIT)
        retries = [e for e in handle.events() if e.kind is EventKind.TOOL_RETRY]
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert result.ok
    assert result.value == "third time lucky"
    assert result.attempts == 3
    assert [attempt for _, _, attempt in seen] == [1, 2, 3]
    assert len({call_id for call_id, _, _ in seen}) == 1
    assert len({key for _, key, _ in seen}) == 1  # same idempotency key on every attempt
    assert [e.data["attempt"] for e in retries] == [2, 3]
    # backoff * multiplier ** (n - 1), jitter off
    assert [e.data["delay"] for e in retries] == pytest.approx([0.01, 0.02])
    assert outcome.metrics.retries == 2
    assert outcome.metrics.steps == 1  # attempts within one step


def test_retries_are_bounded_and_the_last_error_is_the_result() -> None:
    attempts: list[int] = []

    @tool(side_effect="idempotent")
    def down(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise RetryableToolError("still down")

    agent = ScriptedAgent([plan(call("down"))])
    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False))
    with Runtime(tools=[down]) as rt:
        outcome = rt.start("t", agent=agent, config=config).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert attempts == [1, 2, 3]
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.HANDLER_ERROR
    assert result.error.retryable is True
    assert result.attempts == 3


def test_write_tools_are_never_retried() -> None:
    attempts: list[int] = []

    @tool(side_effect="write")
    def send(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise RetryableToolError("smtp hiccup")

    agent = ScriptedAgent([plan(call("send"))])
    with Runtime(tools=[send]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(retry=FAST_RETRY))
        outcome = handle.result(timeout=WAIT)
        kinds = [e.kind for e in handle.events()]
    assert attempts == [1]
    assert EventKind.TOOL_RETRY not in kinds
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.retryable is True
    assert result.attempts == 1
    assert outcome.metrics.retries == 0


def test_non_retryable_failure_is_not_retried() -> None:
    attempts: list[int] = []

    @tool
    def fails(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise RuntimeError("permanent")

    agent = ScriptedAgent([plan(call("fails"))])
    with Runtime(tools=[fails]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(retry=FAST_RETRY)).result(
            timeout=WAIT
        )
    assert attempts == [1]
    assert outcome.metrics.retries == 0


# ---------------------------------------------------------------------- async tools


def test_async_def_tools_run_and_return() -> None:
    @tool
    async def fetch(url: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"url": url, "status": 200}

    agent = ScriptedAgent([plan(call("fetch", url="u1"), call("fetch", url="u2"))])
    with Runtime(tools=[fetch]) as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert [r.value for r in _results(agent.views[1])] == [
        {"url": "u1", "status": 200},
        {"url": "u2", "status": 200},
    ]


def test_hundred_async_tools_await_one_event_concurrently() -> None:
    count = 100
    release = asyncio.Event()
    lock = threading.Lock()
    entered: list[str] = []
    all_in = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    @tool
    async def waiter(i: int) -> int:
        with lock:
            entered.append(threading.current_thread().name)
            loops.append(asyncio.get_running_loop())
            if len(entered) == count:
                all_in.set()
        await release.wait()
        return i

    agent = ScriptedAgent([plan(*(call("waiter", i=i) for i in range(count)))])
    config = RunConfig(max_parallel_tools=count, max_steps=count)
    with Runtime(tools=[waiter]) as rt:
        handle = rt.start("t", agent=agent, config=config)
        # all 100 are awaiting at once: none can finish before the event is set
        assert all_in.wait(WAIT), f"only {len(entered)} of {count} async tools started"
        assert handle.state is RunState.RUNNING
        loops[0].call_soon_threadsafe(release.set)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert [r.value for r in _results(agent.views[1])] == list(range(count))
    assert len(set(entered)) == 1  # one event loop thread, not 100 worker threads


# ---------------------------------------------------------------------- contained BaseExceptions


def _raiser(exc: BaseException) -> Any:
    def raise_it() -> str:
        raise exc

    return raise_it


def _async_raiser(exc: BaseException) -> Any:
    async def raise_it() -> str:
        await asyncio.sleep(0)
        raise exc

    return raise_it


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (SystemExit(3), ErrorCode.HANDLER_ERROR),
        (KeyboardInterrupt(), ErrorCode.HANDLER_ERROR),
        (asyncio.CancelledError(), ErrorCode.CANCELLED),
    ],
    ids=["SystemExit", "KeyboardInterrupt", "CancelledError"],
)
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_base_exceptions_from_tools_are_contained(
    exc: BaseException, code: ErrorCode, flavour: str
) -> None:
    body = _raiser(exc) if flavour == "sync" else _async_raiser(exc)
    bad = tool(name="bad")(body)
    gate = Gate()
    bystander = ScriptedAgent([plan(call("slow")), Finish(output="bystander done")])
    agent = ScriptedAgent([plan(call("bad")), Finish(output="survived")])
    with Runtime(tools=[bad, gate.tool("slow"), echo]) as rt:
        other = rt.start("other", agent=bystander)
        gate.wait_started(1)
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
        # the runtime keeps serving: the run already in flight, and a new one
        gate.release()
        assert other.result(timeout=WAIT).state is RunState.FINISHED
        later = rt.start("later", agent=ScriptedAgent([plan(call("echo", text="x"))]))
        assert later.result(timeout=WAIT).state is RunState.FINISHED
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "survived"
    (result,) = _results(agent.views[1])
    assert not result.ok
    assert result.error is not None
    assert result.error.code is code


# ---------------------------------------------------------------------- the ToolContext (R4, R19)


def test_tool_context_fields() -> None:
    contexts: list[ToolContext] = []
    lock = threading.Lock()

    @tool(side_effect="write", timeout=7.0)
    def write(n: int, ctx: ToolContext) -> int:
        with lock:
            contexts.append(ctx)
        return n

    agent = ScriptedAgent(
        [plan(call("write", n=1), call("write", n=2)), plan(call("write", n=3))],
    )
    with Runtime(tools=[write]) as rt:
        handle = rt.start("t", agent=agent, session_id="s-1", task_id="task-1")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(contexts) == 3
    for ctx in contexts:
        assert ctx.run_id == handle.run_id
        assert ctx.trace_id == handle.trace_id
        assert ctx.tool == "write"
        assert ctx.attempt == 1
        assert ctx.deadline is not None
        remaining = ctx.remaining()
        assert remaining is not None
        assert 0.0 <= remaining <= 7.0
        assert not ctx.cancelled
        assert ctx.idempotency_key not in (handle.run_id, "s-1", "task-1", handle.trace_id)
    # distinct per call, even for the same tool with the same arguments pattern
    assert len({c.call_id for c in contexts}) == 3
    assert len({c.idempotency_key for c in contexts}) == 3
    # the results the agent saw carry the same call ids
    seen = {r.call_id for view in agent.views[1:] for r in _results(view)}
    assert seen == {c.call_id for c in contexts}


def test_tool_context_deadline_is_the_tool_timeout_else_the_step_timeout() -> None:
    from steerable.actors import ManualClock

    clock = ManualClock(start=500.0)
    deadlines: dict[str, float | None] = {}

    @tool(timeout=7.0)
    def own(ctx: ToolContext) -> str:
        deadlines["own"] = ctx.deadline
        return "a"

    @tool
    def default(ctx: ToolContext) -> str:
        deadlines["default"] = ctx.deadline
        return "b"

    agent = ScriptedAgent([plan(call("own"), call("default"))])
    with Runtime(tools=[own, default], clock=clock) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(step_timeout=30.0)).result(
            timeout=WAIT
        )
    assert outcome.state is RunState.FINISHED
    assert deadlines == {"own": 507.0, "default": 530.0}
