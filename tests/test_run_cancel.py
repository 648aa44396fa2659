"""Cancellation (R18, T3, T5): at once on cooperative work, after a grace period on work that
ignores it (abandoned), while waiting for a person, exactly once, never over a terminal state,
with the on_cancel and on_finish hooks.

Real threads; synchronised on Gates, barriers and run events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from steerable.actors import ManualClock, RetryableToolError, Runtime, ToolContext, tool
from steerable.actors.testing import (
    Gate,
    HookRecorder,
    ScriptedAgent,
    call,
    plan,
    wait_event,
    wait_state,
)
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    HookName,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunState,
    RunView,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def _hooks(recorder: HookRecorder) -> dict[HookName | str, Callable[[RunEvent], object]]:
    # HookRecorder.hooks() is typed dict[HookName, ...], which mypy refuses for start(hooks=)
    typed: dict[HookName | str, Callable[[RunEvent], object]] = {}
    for name, callback in recorder.hooks().items():
        typed[name] = callback
    return typed


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A cooperative Gate, released when the test ends whatever happened."""
    g = Gate()
    try:
        yield g
    finally:
        g.release()


@pytest.fixture
def stubborn() -> Iterator[Gate]:
    """A Gate that ignores cancellation (a tool that never checks), released at the end."""
    g = Gate(cooperative=False)
    try:
        yield g
    finally:
        g.release()


def test_cancel_stops_a_cooperative_tool_at_once(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="never")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        (ctx,) = gate.wait_started(1)
        assert handle.cancel("user pressed stop") is True
        assert ctx.cancelled  # signalled on the cancelling thread, before any message
        outcome = handle.result(timeout=WAIT)
        # the tool had really stopped when the outcome was published
        assert gate.stopped.is_set()
        assert gate.finished == [ctx.call_id]
    assert outcome.state is RunState.CANCELLED
    assert handle.state is RunState.CANCELLED
    assert outcome.output is None
    assert agent.calls == 1
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.CANCELLED
    assert outcome.error.details["reason"] == "user pressed stop"
    assert outcome.error.details["abandoned"] == []


def test_cancel_abandons_a_non_cooperative_tool_after_the_grace(stubborn: Gate) -> None:
    agent = ScriptedAgent([plan(call("g"))])
    with Runtime(tools=[stubborn.tool("g")]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.05))
        (ctx,) = stubborn.wait_started(1)
        assert handle.cancel("stop") is True
        outcome = handle.result(timeout=WAIT)
        assert not stubborn.stopped.is_set()  # still blocked: the run did not wait for it
        assert rt.statistics()["workers_abandoned"] == 1
        stubborn.release()
        assert stubborn.stopped.wait(WAIT)
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.CANCELLED
    assert outcome.error.details["abandoned"] == [ctx.call_id]


def test_cancel_while_the_model_thinks_abandons_decide_after_the_grace() -> None:
    in_decide = threading.Event()
    hold = threading.Event()

    def thinking(view: RunView) -> Finish:
        in_decide.set()
        hold.wait(WAIT)
        return Finish(output="too late")

    agent = ScriptedAgent([thinking])
    try:
        with Runtime() as rt:
            handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.05))
            assert in_decide.wait(WAIT)
            assert handle.cancel() is True
            outcome = handle.result(timeout=WAIT)
            hold.set()  # decide returns a Finish now: it must not overwrite CANCELLED
    finally:
        hold.set()
    assert outcome.state is RunState.CANCELLED
    assert handle.state is RunState.CANCELLED
    assert handle.result(timeout=WAIT) == outcome


def test_cancel_while_waiting_for_the_user() -> None:
    agent = ScriptedAgent([AskUser(question="?")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        assert handle.cancel("gave up") is True
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert outcome.error.details["reason"] == "gave up"


def test_cancel_while_waiting_for_an_approval() -> None:
    ran: list[str] = []

    @tool(side_effect="write", requires_approval=True)
    def pay(amount: int) -> str:
        ran.append("pay")
        return "paid"

    agent = ScriptedAgent([plan(call("pay", amount=5))])
    with Runtime(tools=[pay]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        (request,) = handle.pending_approvals()
        assert handle.cancel() is True
        outcome = handle.result(timeout=WAIT)
        assert handle.pending_approvals() == []
        assert handle.approve(request.call_id) is False
    assert outcome.state is RunState.CANCELLED
    assert ran == []


def test_cancel_during_a_retry_backoff_ends_at_once() -> None:
    clock = ManualClock()
    attempts: list[int] = []

    @tool(side_effect="idempotent")
    def flaky(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise RetryableToolError("later")

    agent = ScriptedAgent([plan(call("flaky"))])
    config = RunConfig(
        retry=RetryPolicy(max_retries=5, backoff=30.0, max_backoff=30.0, jitter=False)
    )
    with Runtime(tools=[flaky], clock=clock) as rt:
        handle = rt.start("t", agent=agent, config=config)
        wait_event(handle, EventKind.TOOL_RETRY)  # the retry waits for time that never comes
        assert handle.cancel() is True
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    assert attempts == [1]


def test_cancel_returns_true_once_then_false(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g"))])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        other = rt.handle(handle.run_id)  # a second handle on the same run
        gate.wait_started(1)
        assert handle.cancel() is True
        assert handle.cancel() is False  # already being cancelled
        assert other.cancel() is False
        outcome = handle.result(timeout=WAIT)
        assert handle.cancel() is False  # terminal
        assert other.cancel() is False
    assert outcome.state is RunState.CANCELLED


def test_concurrent_cancels_take_effect_exactly_once(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g"))])
    cancellers = 8
    barrier = threading.Barrier(cancellers)
    answers: list[bool] = []
    lock = threading.Lock()
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)

        def cancel() -> None:
            barrier.wait(WAIT)
            answer = handle.cancel("race")
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=cancel) for _ in range(cancellers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        outcome = handle.result(timeout=WAIT)
        cancelled_events = [e for e in handle.events() if e.kind is EventKind.RUN_CANCELLED]
    assert sorted(answers) == [False] * (cancellers - 1) + [True]
    assert outcome.state is RunState.CANCELLED
    assert len(cancelled_events) == 1


def test_terminal_states_are_never_overwritten() -> None:
    with Runtime() as rt:
        handle = rt.start("t", agent=ScriptedAgent([Finish(output="done")]))
        outcome = handle.result(timeout=WAIT)
        assert handle.cancel("too late") is False
        assert handle.state is RunState.FINISHED
        assert handle.result(timeout=WAIT) == outcome
        events = list(handle.events())
    assert outcome.state is RunState.FINISHED
    assert events[-1].kind is EventKind.RUN_ENDED
    assert EventKind.RUN_CANCELLED not in [e.kind for e in events]
    ended = [e for e in events if e.kind is EventKind.RUN_ENDED]
    assert len(ended) == 1
    states = [e.data["to"] for e in events if e.kind is EventKind.STATE_CHANGED]
    assert states[-1] == "finished"
    assert states.count("finished") == 1


def test_on_cancel_and_on_finish_hooks_fire(gate: Gate) -> None:
    recorder = HookRecorder()
    agent = ScriptedAgent([plan(call("g"))])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent, hooks=_hooks(recorder))
        gate.wait_started(1)
        handle.cancel("hooked")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    names = recorder.names()
    assert names.count(HookName.ON_CANCEL) == 1
    assert names.count(HookName.ON_FINISH) == 1
    assert names.index(HookName.ON_CANCEL) < names.index(HookName.ON_FINISH)
    assert names[-1] is HookName.ON_FINISH
    events = dict(recorder.events)
    assert events[HookName.ON_CANCEL].run_id == handle.run_id
    assert events[HookName.ON_CANCEL].data["reason"] == "hooked"
    assert events[HookName.ON_FINISH].data["state"] == "cancelled"
