"""Steering (R20, docs/contract.md): `send` into the run's ordered inbox, queue and
interrupt delivery, the run's default mode, seq order exactly once under concurrent senders,
sends to ended runs, and AskUser waits.

Real threads; synchronised on Gates, barriers and run events.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from steerable.actors import RunHandle, Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    SteerableError,
    SteeringMode,
    ToolResult,
    UserMessage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def _results(view: RunView) -> list[ToolResult]:
    return [r for r in view.last_results if isinstance(r, ToolResult)]


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A cooperative Gate, released when the test ends whatever happened."""
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def test_send_returns_increasing_seq(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g"))])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)
        seqs = [handle.send(f"m{i}") for i in range(5)]
        gate.release()
        handle.result(timeout=WAIT)
    assert seqs == [0, 1, 2, 3, 4]


def test_queue_mode_is_delivered_at_the_next_boundary_without_disturbing_tools(
    gate: Gate,
) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        (ctx,) = gate.wait_started(1)
        seq = handle.send("also check Y", mode="queue")
        accepted = wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        assert accepted.data == {"seq": seq, "mode": "queue"}
        assert not ctx.cancelled  # the running tool is not disturbed
        assert agent.calls == 1  # not delivered before the plan's results are in
        gate.release()
        outcome = handle.result(timeout=WAIT)
        events = list(handle.events())
    assert outcome.state is RunState.FINISHED
    view = agent.views[1]
    assert [(m.seq, m.content, m.mode) for m in view.delivered] == [
        (seq, "also check Y", SteeringMode.QUEUE)
    ]
    (result,) = _results(view)
    assert result.ok
    assert result.value == "released"
    # the message is in the transcript after the plan's results, before the next decision
    assert isinstance(view.transcript[-1], UserMessage)
    assert view.transcript[-1].content == "also check Y"
    kinds = [e.kind for e in events]
    assert kinds.index(EventKind.EXECUTE_FINISHED) < kinds.index(EventKind.MESSAGE_DELIVERED)
    assert outcome.metrics.messages_delivered == 1


def test_interrupt_cancels_in_flight_calls_and_delivers_at_once(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g", value="a"), call("g", value="b")), Finish(output="ok")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        contexts = gate.wait_started(2)
        seq = handle.send("stop that, do Z", mode="interrupt")
        # never released: the interrupt alone moves the run on
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert gate.stopped.is_set()  # the cooperative calls really stopped
    assert len(gate.finished) == 2
    assert all(ctx.cancelled for ctx in contexts)
    view = agent.views[1]
    assert [(m.seq, m.content, m.mode) for m in view.delivered] == [
        (seq, "stop that, do Z", SteeringMode.INTERRUPT)
    ]
    results = _results(view)
    assert len(results) == 2
    for result in results:
        assert not result.ok
        assert result.error is not None
        assert result.error.code is ErrorCode.CANCELLED
        assert result.error.details["reason"] == "interrupt"


def test_an_interrupted_tool_that_returns_is_recorded_cancelled_with_its_value() -> None:
    # Issue 10, defect 4: the tool sees `ctx.cancelled` and returns "cut" instead of raising.
    started = threading.Event()

    @tool
    def cut(ctx: ToolContext) -> str:
        """Wait to be interrupted, then return what was done so far."""
        started.set()
        assert ctx.wait(WAIT), "never interrupted"
        assert ctx.cancelled
        return "cut"

    agent = ScriptedAgent([plan(call("cut")), Finish(output="ok")])
    with Runtime(tools=[cut]) as rt:
        handle = rt.start("t", agent=agent)
        assert started.wait(WAIT)
        handle.send("stop that", mode="interrupt")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert not result.ok
    assert result.value is None
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.error.details["reason"] == "interrupt"
    assert result.error.details["value"] == "cut"


def test_interrupt_cancels_calls_not_yet_started(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g", value="a"), call("g", value="b")), Finish(output="ok")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(max_parallel_tools=1))
        gate.wait_started(1)
        handle.send("change of plan", mode="interrupt")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(gate.contexts) == 1  # the second call never ran
    codes = [r.error.code if r.error else None for r in _results(agent.views[1])]
    assert codes == [ErrorCode.CANCELLED, ErrorCode.CANCELLED]


def test_interrupt_abandons_a_call_that_ignores_cancellation_after_the_grace() -> None:
    stubborn = Gate(cooperative=False)
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    try:
        with Runtime(tools=[stubborn.tool("g")]) as rt:
            handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.05))
            stubborn.wait_started(1)
            handle.send("now", mode="interrupt")
            outcome = handle.result(timeout=WAIT)
            assert not stubborn.stopped.is_set()
            assert rt.statistics()["workers_abandoned"] == 1
            stubborn.release()
    finally:
        stubborn.release()
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.error.details["abandoned"] is True


def test_the_runs_default_mode_comes_from_its_config(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(steering=SteeringMode.INTERRUPT))
        (ctx,) = gate.wait_started(1)
        handle.send("no mode given")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert ctx.cancelled
    (message,) = agent.views[1].delivered
    assert message.mode is SteeringMode.INTERRUPT
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED


def test_default_mode_queue_leaves_tools_running(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)  # RunConfig().steering is queue
        (ctx,) = gate.wait_started(1)
        handle.send("no mode given")
        wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        assert not ctx.cancelled
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert agent.views[1].delivered[0].mode is SteeringMode.QUEUE


def test_concurrent_senders_arrive_in_seq_order_exactly_once(gate: Gate) -> None:
    senders, per_sender = 4, 25
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    barrier = threading.Barrier(senders)
    sent: dict[int, str] = {}
    lock = threading.Lock()
    failures: list[BaseException] = []

    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)

        def sender(n: int) -> None:
            try:
                barrier.wait(WAIT)
                for i in range(per_sender):
                    content = f"sender{n}-{i}"
                    seq = handle.send(content)
                    with lock:
                        sent[seq] = content
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert not failures
        gate.release()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    total = senders * per_sender
    assert sorted(sent) == list(range(total))  # every seq handed out once
    delivered = [m for view in agent.views for m in view.delivered]
    assert [m.seq for m in delivered] == list(range(total))  # in order, exactly once
    assert {m.seq: m.content for m in delivered} == sent
    # each sender's own messages keep their order
    for n in range(senders):
        mine = [m.content for m in delivered if m.content.startswith(f"sender{n}-")]
        assert mine == [f"sender{n}-{i}" for i in range(per_sender)]
    in_transcript = [e for e in agent.views[-1].transcript if isinstance(e, UserMessage)]
    assert [m.seq for m in in_transcript] == list(range(total))


def test_send_to_an_ended_run_raises_run_ended() -> None:
    with Runtime() as rt:
        handle = rt.start("t", agent=ScriptedAgent([Finish(output="done")]))
        handle.result(timeout=WAIT)
        with pytest.raises(SteerableError) as info:
            handle.send("too late")
    assert info.value.code is ErrorCode.RUN_ENDED


def test_ask_user_waits_and_the_next_message_resumes() -> None:
    agent = ScriptedAgent([AskUser(question="which colour?"), Finish(output="ok")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        waiting = wait_event(
            handle, EventKind.STATE_CHANGED, lambda e: e.data.get("to") == "waiting"
        )
        assert waiting.data["waiting_for"] == "user"
        assert waiting.data["question"] == "which colour?"
        assert agent.calls == 1
        seq = handle.send("blue")
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    view = agent.views[1]
    assert [(m.seq, m.content) for m in view.delivered] == [(seq, "blue")]
    decisions = [e for e in view.transcript if isinstance(e, DecisionEntry)]
    assert isinstance(decisions[0].decision, AskUser)


def test_ask_user_with_a_message_already_queued_does_not_wait() -> None:
    # the message arrives while the model is deciding to ask: it answers the question
    in_decide = threading.Event()
    go = threading.Event()

    def ask(view: RunView) -> AskUser:
        in_decide.set()
        assert go.wait(WAIT)
        return AskUser(question="anything else?")

    agent = ScriptedAgent([ask, Finish(output="ok")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent)
        assert in_decide.wait(WAIT)
        handle.send("yes, this")
        wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        go.set()
        outcome = handle.result(timeout=WAIT)
        states = [e.data["to"] for e in handle.events() if e.kind is EventKind.STATE_CHANGED]
    assert outcome.state is RunState.FINISHED
    assert "waiting" not in states
    assert [m.content for m in agent.views[1].delivered] == ["yes, this"]


def test_interrupt_while_the_model_thinks_discards_its_answer() -> None:
    in_decide = threading.Event()
    go = threading.Event()
    ran: list[str] = []

    def thinking(view: RunView) -> Plan:
        in_decide.set()
        assert go.wait(WAIT)
        return plan(call("never"))

    agent = ScriptedAgent([thinking, Finish(output="redirected")])

    def never() -> str:
        ran.append("never")
        return "x"

    with Runtime(tools=[never]) as rt:
        handle = rt.start("t", agent=agent)
        assert in_decide.wait(WAIT)
        handle.send("forget it", mode="interrupt")
        wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        go.set()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "redirected"
    assert ran == []  # the stale plan was never run
    assert [m.content for m in agent.views[1].delivered] == ["forget it"]


def test_a_tool_can_interrupt_another_run_and_wait_for_it(gate: Gate) -> None:
    # A tool's own tells are never held back until it returns (docs/decisions/0002): the
    # interrupt reaches the other run while this tool still waits for that run's outcome.
    others: list[RunHandle] = []

    @tool(side_effect="none")
    def steer_other() -> str:
        others[0].send("stop now", mode="interrupt")
        return others[0].result(timeout=WAIT).state.value

    other = ScriptedAgent([plan(call("g")), Finish(output="stopped")])
    outer = ScriptedAgent([plan(call("steer_other")), Finish(output="done")])
    with Runtime(tools=[gate.tool("g"), steer_other]) as rt:
        others.append(rt.start("inner", agent=other))
        gate.wait_started(1)
        outcome = rt.start("outer", agent=outer).result(timeout=WAIT)
        assert others[0].result(timeout=WAIT).state is RunState.FINISHED
    assert outcome.state is RunState.FINISHED
    steered = _results(outer.views[1])
    assert [(r.ok, r.value) for r in steered] == [(True, "finished")]
    assert gate.stopped.is_set()  # the inner run's call was interrupted, not released
