"""Human approval as a waiting state (docs/requirements.md, docs/contract.md "Approvals"): a call
that requires approval parks, the rest of the plan proceeds, approve runs it once, deny gives
the agent `approval_denied`, and the agent is not asked again until every approval of its plan
is settled (queued user messages wait for that boundary too).

Real threads; synchronised on Gates and run events.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from steerable.actors import Runtime, Tool, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    RunState,
    RunView,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def _results(view: RunView) -> list[ToolResult]:
    return [r for r in view.last_results if isinstance(r, ToolResult)]


class Payments:
    """A write tool that requires approval and records every execution."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[tuple[str, int, str]] = []
        payments = self

        @tool(side_effect="write", requires_approval=True)
        def pay(to: str, amount: int, ctx: ToolContext) -> str:
            with payments.lock:
                payments.ran.append((to, amount, ctx.call_id))
            return f"paid {amount} to {to}"

        self.tool: Tool[Any, Any] = pay


@pytest.fixture
def payments() -> Payments:
    return Payments()


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A cooperative Gate, released when the test ends whatever happened."""
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def test_approval_parks_the_call_while_the_rest_of_the_plan_proceeds(
    payments: Payments, gate: Gate
) -> None:
    agent = ScriptedAgent([plan(call("pay", to="bob", amount=5), call("g")), Finish(output="ok")])
    with Runtime(tools=[payments.tool, gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        waiting = wait_event(
            handle, EventKind.STATE_CHANGED, lambda e: e.data.get("to") == "waiting"
        )
        assert waiting.data["waiting_for"] == "approval"
        (request,) = handle.pending_approvals()
        assert request.tool == "pay"
        assert request.arguments == {"to": "bob", "amount": 5}
        assert request.run_id == handle.run_id
        # the other call of the plan runs meanwhile; the parked one does not
        gate.wait_started(1)
        assert payments.ran == []
        assert handle.approve(request.call_id) is True
        wait_event(
            handle,
            EventKind.TOOL_FINISHED,
            lambda e: e.data["call_id"] == request.call_id,
        )
        assert payments.ran == [("bob", 5, request.call_id)]
        assert handle.pending_approvals() == []
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    pay_result, gate_result = _results(agent.views[1])
    assert pay_result.ok
    assert pay_result.value == "paid 5 to bob"
    assert gate_result.ok
    assert outcome.metrics.steps == 2


def test_an_approved_call_runs_once_whatever_is_sent_again(payments: Payments) -> None:
    agent = ScriptedAgent([plan(call("pay", to="ann", amount=1)), Finish(output="ok")])
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        (request,) = handle.pending_approvals()
        assert handle.approve(request.call_id) is True
        assert handle.approve(request.call_id) is False
        assert handle.deny(request.call_id, reason="changed my mind") is False
        outcome = handle.result(timeout=WAIT)
        assert handle.approve(request.call_id) is False  # after the run ended
    assert outcome.state is RunState.FINISHED
    assert len(payments.ran) == 1


def test_concurrent_approvals_settle_once(payments: Payments) -> None:
    agent = ScriptedAgent([plan(call("pay", to="ann", amount=1)), Finish(output="ok")])
    approvers = 8
    barrier = threading.Barrier(approvers)
    answers: list[bool] = []
    lock = threading.Lock()
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        (request,) = handle.pending_approvals()

        def approve() -> None:
            barrier.wait(WAIT)
            answer = handle.approve(request.call_id)
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=approve) for _ in range(approvers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        outcome = handle.result(timeout=WAIT)
    assert sorted(answers) == [False] * (approvers - 1) + [True]
    assert outcome.state is RunState.FINISHED
    assert len(payments.ran) == 1


def test_deny_gives_the_agent_approval_denied(payments: Payments) -> None:
    agent = ScriptedAgent([plan(call("pay", to="eve", amount=999)), Finish(output="ok")])
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        (request,) = handle.pending_approvals()
        assert handle.deny(request.call_id, reason="too expensive") is True
        assert handle.deny(request.call_id) is False
        assert handle.approve(request.call_id) is False
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED  # a denial is a result, not a run failure
    assert payments.ran == []
    (result,) = _results(agent.views[1])
    assert not result.ok
    assert result.error is not None
    assert result.error.code is ErrorCode.APPROVAL_DENIED
    assert result.error.details["reason"] == "too expensive"
    assert result.call_id == request.call_id
    assert outcome.metrics.steps == 0  # a denied call is not a tool step (R27)


def test_unknown_call_id_is_neither_approved_nor_denied(payments: Payments) -> None:
    agent = ScriptedAgent([plan(call("pay", to="x", amount=1)), Finish(output="ok")])
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        assert handle.approve("no-such-call") is False
        assert handle.deny("no-such-call") is False
        (request,) = handle.pending_approvals()  # the real one is still pending
        assert handle.state is RunState.WAITING
        handle.approve(request.call_id)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(payments.ran) == 1


def test_agent_waits_for_every_approval_and_queued_messages_wait_too(
    payments: Payments,
) -> None:
    agent = ScriptedAgent(
        [plan(call("pay", to="a", amount=1), call("pay", to="b", amount=2)), Finish(output="ok")]
    )
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        first, second = handle.pending_approvals()
        assert (first.arguments["to"], second.arguments["to"]) == ("a", "b")
        assert handle.approve(first.call_id) is True
        wait_event(handle, EventKind.TOOL_FINISHED, lambda e: e.data["call_id"] == first.call_id)
        seq = handle.send("while you wait: use EUR")
        accepted = wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        # everything the run did before taking the message is in the log by now
        reasoning = 0
        for event in handle.events(timeout=WAIT):
            if event.seq >= accepted.seq:
                break
            reasoning += event.kind is EventKind.REASONING_STARTED
        assert reasoning == 1  # only the first model call
        assert agent.calls == 1
        assert handle.state is RunState.WAITING
        assert [r.call_id for r in handle.pending_approvals()] == [second.call_id]
        assert handle.deny(second.call_id, reason="no") is True
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    view = agent.views[1]
    assert [(m.seq, m.content) for m in view.delivered] == [(seq, "while you wait: use EUR")]
    a, b = _results(view)
    assert a.ok
    assert a.value == "paid 1 to a"
    assert b.error is not None
    assert b.error.code is ErrorCode.APPROVAL_DENIED
    assert payments.ran == [("a", 1, first.call_id)]


def test_interrupt_settles_pending_approvals_as_cancelled(payments: Payments) -> None:
    agent = ScriptedAgent([plan(call("pay", to="a", amount=1)), Finish(output="ok")])
    with Runtime(tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        (request,) = handle.pending_approvals()
        handle.send("forget the payment", mode="interrupt")
        outcome = handle.result(timeout=WAIT)
        assert handle.approve(request.call_id) is False
    assert outcome.state is RunState.FINISHED
    assert payments.ran == []
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert [m.content for m in agent.views[1].delivered] == ["forget the payment"]
