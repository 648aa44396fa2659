"""RunMachine steering, driven directly: cancellation (R18), queue and interrupt messages (R20,
docs/contract.md "Steering contract"), AskUser and approvals (docs/contract.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from steerable.actors._machine.effects import TimerKind
from steerable.protocol import (
    AgentError,
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    RetryPolicy,
    RunConfig,
    RunState,
    SystemNote,
    ToolResult,
    UserMessage,
    WaitingFor,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.machine_kit (explicit package bases)
    from tests.machine_kit import (
        AbandonWork,
        CancelWork,
        Dispatch,
        Run,
        call,
        plan,
        retryable,
    )
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from machine_kit import (
        AbandonWork,
        CancelWork,
        Dispatch,
        Run,
        call,
        plan,
        retryable,
    )


def cancelled_error(reason: str = "stop") -> AgentError:
    """What a cooperative tool reports when its cancel scope is set."""
    return AgentError.of(ErrorCode.CANCELLED, f"cancelled ({reason})")


# ---------------------------------------------------------------------- cancellation (R18)


def test_cancel_while_reasoning_waits_for_the_model_call_to_report() -> None:
    r = Run(config=RunConfig(cancel_grace=2.0), now=0.0).start()
    mark = r.mark()
    r.cancel("user pressed stop")
    assert r.fx.of(CancelWork, mark) == [CancelWork("model", "user pressed stop")]
    assert r.state() is RunState.RUNNING  # not before in-flight work reports
    assert r.fx.timers[(TimerKind.GRACE, "run")] == (0, 2.0)
    r.decide_next(plan(call("read")))
    assert r.state() is RunState.CANCELLED
    assert r.fx.dispatched == []
    err = r.error
    assert err.code is ErrorCode.CANCELLED
    assert err.details == {"reason": "user pressed stop", "abandoned": []}
    assert (TimerKind.GRACE, "run") not in r.fx.timers


def test_cancel_while_reasoning_abandons_the_model_after_the_grace_period() -> None:
    r = Run().start()
    r.cancel()
    mark = r.mark()
    r.fire(TimerKind.GRACE, "run")
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("model")]
    assert r.state() is RunState.CANCELLED
    assert r.error.details["abandoned"] == ["model"]
    assert r.fx.events_of(EventKind.RUN_CANCELLED)[0].data["abandoned"] == ["model"]
    mark = r.mark()
    r.machine.decided(1, Finish(output="late"), None, None, 0.0, r.now)
    assert r.since(mark) == []


def test_cancel_while_reasoning_then_model_timeout_still_ends_cancelled() -> None:
    """The model timeout fires inside the grace period: the run must not call the model again."""
    cfg = RunConfig(model_timeout=1.0, cancel_grace=5.0, retry=RetryPolicy(jitter=False))
    r = Run(config=cfg, now=0.0).start()
    r.cancel("stop")
    r.fire(TimerKind.MODEL_TIMEOUT, "model")  # at 1.0, inside the grace period (5.0)
    for _ in range(10):  # then every timer still pending, earliest first
        if not r.fx.timers:
            break
        kind, key = min(r.fx.timers, key=lambda k: r.fx.timers[k][1])
        r.fire(kind, key)
    assert len(r.fx.decides) == 1, "a cancelled run called the model again"
    assert r.state() is RunState.CANCELLED
    assert r.error.code is ErrorCode.CANCELLED


def test_cancel_after_an_interrupt_while_reasoning_ends_cancelled() -> None:
    """The interrupt's model grace fires while the run is cancelling: no new model call."""
    r = Run(config=RunConfig(cancel_grace=1.0), now=0.0).start()
    r.send("wait", mode="interrupt")  # GRACE(model) at 1.0
    r.advance(0.5)
    r.cancel("stop")  # GRACE(run) at 1.5
    r.fire(TimerKind.GRACE, "model")
    assert len(r.fx.decides) == 1, "a cancelled run called the model again"
    if (TimerKind.GRACE, "run") in r.fx.timers:
        r.fire(TimerKind.GRACE, "run")
    assert r.state() is RunState.CANCELLED
    assert r.error.details["abandoned"] == ["model"]


def test_cancel_while_a_model_retry_waits_ends_at_once() -> None:
    policy = RetryPolicy(max_retries=2, backoff=1.0, jitter=False)
    r = Run(config=RunConfig(model_timeout=10.0, retry=policy)).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    assert (TimerKind.MODEL_RETRY, "model") in r.fx.timers
    r.cancel()
    assert r.state() is RunState.CANCELLED
    assert r.fx.timers == {}
    assert len(r.fx.decides) == 1


def test_cancel_while_executing_ends_after_in_flight_calls_report() -> None:
    r = Run(config=RunConfig(max_parallel_tools=2)).start()
    r.decide_next(plan(call("read"), call("put"), call("read")))
    mark = r.mark()
    r.cancel("enough")
    assert r.fx.of(CancelWork, mark) == [
        CancelWork("c1.0", "enough"),
        CancelWork("c1.1", "enough"),
    ]
    r.report("c1.0", error=cancelled_error())
    assert r.state() is RunState.RUNNING
    assert r.running_ids() == ["c1.1"]  # the free slot is not refilled
    r.report("c1.1", error=retryable("would be retried otherwise"))
    assert r.state() is RunState.CANCELLED
    assert [j.call_id for j in r.fx.dispatched] == ["c1.0", "c1.1"]
    assert r.fx.events_of(EventKind.TOOL_RETRY) == []
    journaled = {x.call_id: x for x in r.fx.journal_entries}
    never_run = journaled["c1.2"]
    assert never_run.error is not None
    assert never_run.error.code is ErrorCode.CANCELLED
    assert never_run.error.details["abandoned"] is False
    assert r.error.details["abandoned"] == []


def test_cancel_while_executing_abandons_calls_that_do_not_stop() -> None:
    r = Run().start()
    r.decide_next(plan(call("read"), call("put")))
    r.cancel()
    r.report("c1.0", error=cancelled_error())
    mark = r.mark()
    r.fire(TimerKind.GRACE, "run")
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("c1.1")]
    assert r.state() is RunState.CANCELLED
    assert r.error.details["abandoned"] == ["c1.1"]
    res = {x.call_id: x for x in r.fx.journal_entries}["c1.1"]
    assert res.error is not None
    assert res.error.details["abandoned"] is True
    mark = r.mark()
    r.report("c1.1", "late", attempt=1)
    assert r.since(mark) == []


def test_cancel_with_a_retry_pending_cancels_it_at_once() -> None:
    r = Run(config=RunConfig(retry=RetryPolicy(jitter=False))).start()
    r.decide_next(plan(call("read")))
    r.report("c1.0", error=retryable())
    r.cancel()
    assert r.state() is RunState.CANCELLED
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    assert len(r.fx.dispatched) == 1


@pytest.mark.parametrize("waiting", ["user", "approval"])
def test_cancel_while_waiting_ends_at_once(waiting: str) -> None:
    r = Run().start()
    if waiting == "user":
        r.decide_next(AskUser(question="?"))
    else:
        r.decide_next(plan(call("gated")))
    assert r.state() is RunState.WAITING
    r.cancel("bye")
    assert r.state() is RunState.CANCELLED
    assert r.error.details == {"reason": "bye", "abandoned": []}
    assert r.fx.dispatched == []


def test_cancel_after_terminal_and_second_cancel_are_ignored() -> None:
    r = Run().start()
    r.decide_next(plan(call("read")))
    r.cancel("first")
    mark = r.mark()
    r.cancel("second")
    assert r.since(mark) == []
    r.report("c1.0", error=cancelled_error())
    assert r.error.details["reason"] == "first"
    mark = r.mark()
    r.cancel("third")
    assert r.since(mark) == []
    assert len(r.fx.settled_outcomes) == 1


def test_cancel_now_acts_at_once_and_the_stored_request_is_a_no_op() -> None:
    r = Run().start()
    r.decide_next(plan(call("read")))
    mark = r.mark()
    r.machine.cancel_now("stop", r.now)
    assert r.fx.of(CancelWork, mark) == [CancelWork("c1.0", "stop")]
    mark = r.mark()
    r.cancel("stop")  # the CancelRequest stored by the host follows with its seq
    assert r.since(mark) == []
    assert r.machine.last_seq == 0
    r.report("c1.0", error=cancelled_error())
    assert r.state() is RunState.CANCELLED
    assert len(r.fx.events_of(EventKind.RUN_CANCELLED)) == 1
    mark = r.mark()
    r.machine.cancel_now("again", r.now)
    assert r.since(mark) == []


# ---------------------------------------------------------------------- queue messages


def test_queued_message_is_delivered_at_the_next_boundary_not_before() -> None:
    r = Run().start()
    r.decide_next(plan(call("read"), call("put")))
    seq = r.send("also check Y", mode="queue")
    accepted = r.fx.events_of(EventKind.MESSAGE_ACCEPTED)
    assert [e.data for e in accepted] == [{"seq": seq, "mode": "queue"}]
    assert r.fx.events_of(EventKind.MESSAGE_DELIVERED) == []
    r.report("c1.0")
    assert len(r.fx.decides) == 1
    assert r.running_ids() == ["c1.1"]
    assert not any(isinstance(e, UserMessage) for e in r.machine.transcript)
    r.report("c1.1")
    view = r.view
    assert [m.content for m in view.delivered] == ["also check Y"]
    kinds = [type(e) for e in view.transcript]
    assert kinds == [DecisionEntry, ToolResult, ToolResult, UserMessage]
    assert [e.data for e in r.fx.events_of(EventKind.MESSAGE_DELIVERED)] == [
        {"seq": seq, "content": "also check Y", "mode": "queue"}
    ]
    r.decide_next(Finish(output=1))
    assert r.outcome.metrics.messages_delivered == 1


def test_finish_with_a_message_waiting_goes_back_to_the_agent() -> None:
    """A Finish never drops a queued message: the agent decides again with it."""
    r = Run().start()
    r.send("one more thing")
    r.decide_next(Finish(output="done"), verdict=None)
    assert r.state() is RunState.RUNNING
    assert len(r.fx.events_of(EventKind.FINISH_REJECTED)) == 1
    assert [m.content for m in r.view.delivered] == ["one more thing"]
    r.decide_next(Finish(output="done, with it"))
    assert r.outcome.output == "done, with it"


def test_messages_are_delivered_in_seq_order_exactly_once() -> None:
    r = Run().start()
    r.send("one")  # while reasoning
    r.decide_next(plan(call("read")))
    r.send("two")
    r.send("three")
    r.finish_all_calls()
    assert [m.content for m in r.view.delivered] == ["one", "two", "three"]
    r.decide_next(plan(call("read")))
    r.finish_all_calls()
    assert r.view.delivered == ()
    users = [e for e in r.machine.transcript if isinstance(e, UserMessage)]
    assert [m.seq for m in users] == [0, 1, 2]


def test_duplicate_seq_is_ignored() -> None:
    r = Run().start()
    r.decide_next(plan(call("read")))
    msg = UserMessage(seq=0, content="hi")
    r.machine.host(msg, r.now)
    mark = r.mark()
    r.machine.host(msg, r.now)
    r.machine.host(UserMessage(seq=0, content="hi", mode="interrupt"), r.now)
    assert r.since(mark) == []
    r.finish_all_calls()
    assert r.view.delivered == (msg,)


# ---------------------------------------------------------------------- interrupt messages


def test_interrupt_cancels_the_plan_and_delivers_the_message() -> None:
    r = Run(config=RunConfig(max_parallel_tools=2, cancel_grace=3.0), now=0.0).start()
    r.decide_next(plan(call("read"), call("put"), call("gated"), call("read")))
    mark = r.mark()
    r.send("stop, do Z instead", mode="interrupt")
    assert r.fx.of(CancelWork, mark) == [
        CancelWork("c1.0", "interrupt"),
        CancelWork("c1.1", "interrupt"),
    ]
    # Unstarted calls (awaiting approval, or waiting for a slot) are cancelled at once.
    journaled = {x.call_id: x for x in r.fx.journal_entries}
    assert set(journaled) == {"c1.2", "c1.3"}
    for res in journaled.values():
        assert res.error is not None
        assert res.error.code is ErrorCode.CANCELLED
        assert res.error.details["reason"] == "interrupt"
    assert r.fx.timers[(TimerKind.GRACE, "plan")] == (0, 3.0)
    assert len(r.fx.decides) == 1  # not before in-flight calls report
    r.report("c1.1", error=cancelled_error("interrupt"))
    assert r.running_ids() == ["c1.0"]  # no refill while interrupting
    assert len(r.fx.decides) == 1
    r.report("c1.0", error=cancelled_error("interrupt"))
    view = r.view
    assert [m.content for m in view.delivered] == ["stop, do Z instead"]
    assert [x.call_id for x in r.last_results()] == ["c1.0", "c1.1", "c1.2", "c1.3"]
    assert all(x.error is not None for x in r.last_results())
    assert r.fx.events_of(EventKind.EXECUTE_FINISHED)[0].data["interrupted"] is True
    assert (TimerKind.GRACE, "plan") not in r.fx.timers
    assert [j.call_id for j in r.fx.dispatched] == ["c1.0", "c1.1"]
    assert r.machine.steps == 2


def test_an_interrupted_call_that_returns_a_value_is_recorded_cancelled() -> None:
    # Issue 10, defect 4 (docs/steering.md "Tools running"): a cooperative tool that sees the
    # interrupt and returns is recorded as a `cancelled` error, its value kept in the details.
    r = Run().start()
    r.decide_next(plan(call("read")))
    r.send("stop that", mode="interrupt")
    r.report("c1.0", "cut")
    (result,) = r.last_results()
    assert not result.ok
    assert result.value is None
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.error.details["reason"] == "interrupt"
    assert result.error.details["value"] == "cut"
    assert r.fx.events_of(EventKind.TOOL_FINISHED)[0].data["error"] == "cancelled"
    assert r.machine.metrics().tool_errors == 1


def test_a_cancelled_call_that_returns_a_value_is_recorded_cancelled() -> None:
    # docs/steering.md "Cancellation": the results of a cancelled run's calls are `cancelled`.
    r = Run().start()
    r.decide_next(plan(call("read")))
    r.cancel("enough")
    r.report("c1.0", {"partial": 1})
    assert r.state() is RunState.CANCELLED
    (result,) = r.fx.journal_entries
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.error.details["reason"] == "enough"
    assert result.error.details["value"] == {"partial": 1}


def test_interrupt_abandons_calls_that_do_not_stop_within_the_grace() -> None:
    r = Run().start()
    r.decide_next(plan(call("read"), call("put")))
    r.send("change of plan", mode="interrupt")
    r.report("c1.0", error=cancelled_error("interrupt"))
    mark = r.mark()
    r.fire(TimerKind.GRACE, "plan")
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("c1.1")]
    res = r.last_results()[1]
    assert res.error is not None
    assert res.error.code is ErrorCode.CANCELLED
    assert res.error.details["abandoned"] is True
    assert [m.content for m in r.view.delivered] == ["change of plan"]
    assert r.state() is RunState.RUNNING
    mark = r.mark()
    r.report("c1.1", "late", attempt=1)
    assert r.since(mark) == []


def test_interrupt_cancels_a_pending_retry_at_once() -> None:
    r = Run(config=RunConfig(retry=RetryPolicy(jitter=False))).start()
    r.decide_next(plan(call("read")))
    r.report("c1.0", error=retryable())
    r.send("now", mode="interrupt")
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    assert [m.content for m in r.view.delivered] == ["now"]
    assert len(r.fx.dispatched) == 1


def test_interrupt_while_reasoning_discards_the_answer_and_decides_again() -> None:
    r = Run().start()
    mark = r.mark()
    r.send("wait, use the other file", mode="interrupt")
    assert r.fx.of(CancelWork, mark) == [CancelWork("model", "interrupt")]
    assert (TimerKind.GRACE, "model") in r.fx.timers
    r.decide_next(plan(call("write")))  # the stale answer
    assert r.fx.dispatched == []
    req = r.fx.decides[-1]
    assert req.model_call == 2
    assert [m.content for m in req.view.delivered] == ["wait, use the other file"]
    kinds = [type(e) for e in req.view.transcript]
    assert kinds == [SystemNote, UserMessage]  # the discarded decision is not recorded
    assert (TimerKind.GRACE, "model") not in r.fx.timers


def test_interrupt_while_reasoning_abandons_a_model_that_does_not_stop() -> None:
    r = Run().start()
    r.send("hurry", mode="interrupt")
    mark = r.mark()
    r.fire(TimerKind.GRACE, "model")
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("model")]
    req = r.fx.decides[-1]
    assert req.model_call == 2
    assert [m.content for m in req.view.delivered] == ["hurry"]
    mark = r.mark()
    r.machine.decided(1, Finish(output="stale"), None, None, 0.0, r.now)
    assert r.since(mark) == []
    assert r.state() is RunState.RUNNING


def test_interrupt_with_an_approval_pending_stops_waiting_for_it() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated"), call("read")))
    assert r.state() is RunState.WAITING
    r.send("forget it", mode="interrupt")
    assert r.machine.pending_approvals() == []
    settled = r.fx.events_of(EventKind.APPROVAL_SETTLED)
    assert [e.data["approved"] for e in settled] == [False]
    # Nothing is waiting for a person any more: only the running read is awaited.
    assert r.state() is RunState.RUNNING
    assert r.machine.waiting_for is None
    r.report("c1.1", error=cancelled_error("interrupt"))
    assert [m.content for m in r.view.delivered] == ["forget it"]


def test_interrupt_with_only_approvals_pending_delivers_at_once() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated"), call("gated")))
    r.send("never mind", mode="interrupt")
    assert r.state() is RunState.RUNNING
    assert r.machine.waiting_for is None
    assert [m.content for m in r.view.delivered] == ["never mind"]
    assert [x.error.code for x in r.last_results() if x.error] == [ErrorCode.CANCELLED] * 2
    assert r.fx.dispatched == []
    mark = r.mark()
    r.approve("c1.0")  # too late: settled by the interrupt
    assert r.since(mark) == []


def test_interrupt_while_waiting_for_the_user_resumes_at_once() -> None:
    r = Run().start()
    r.decide_next(AskUser(question="?"))
    r.send("here", mode="interrupt")
    assert r.state() is RunState.RUNNING
    assert [m.content for m in r.view.delivered] == ["here"]
    assert r.fx.of(CancelWork) == []


# ---------------------------------------------------------------------- AskUser


@pytest.mark.parametrize("mode", ["queue", "interrupt"])
def test_ask_user_waits_and_the_next_message_resumes(mode: str) -> None:
    r = Run().start()
    r.decide_next(AskUser(question="which file?"))
    assert r.state() is RunState.WAITING
    assert r.machine.waiting_for is WaitingFor.USER
    cp = r.fx.checkpoints[-1]
    assert (cp.snapshot["state"], cp.snapshot["waiting_for"]) == ("waiting", "user")
    assert r.fx.decide_request is None
    r.send("the second one", mode=mode)
    assert r.state() is RunState.RUNNING
    assert [m.content for m in r.view.delivered] == ["the second one"]
    assert r.view.model_calls == 1


def test_waiting_for_is_cleared_when_the_user_answers() -> None:
    r = Run().start()
    r.decide_next(AskUser(question="?"))
    r.send("answer")
    assert r.machine.waiting_for is None
    assert r.fx.checkpoints[-1].snapshot["waiting_for"] is None
    changed = r.fx.events_of(EventKind.STATE_CHANGED)[-1].data
    assert changed["to"] == "running"
    assert changed["waiting_for"] is None


def test_messages_queued_before_ask_user_answer_it_at_once() -> None:
    r = Run().start()
    r.send("I already know: the first")
    r.decide_next(AskUser(question="which?"))
    assert r.state() is RunState.RUNNING
    assert r.fx.events_of(EventKind.STATE_CHANGED)[-1].data["to"] == "running"
    req = r.fx.decides[-1]
    assert req.model_call == 2
    assert [m.content for m in req.view.delivered] == ["I already know: the first"]


def test_approvals_and_cancels_do_not_answer_ask_user() -> None:
    r = Run().start()
    r.decide_next(AskUser(question="?"))
    mark = r.mark()
    r.approve("c1.0")
    r.deny("c9.9")
    assert r.since(mark) == []
    assert r.state() is RunState.WAITING


# ---------------------------------------------------------------------- approvals


def test_approval_parks_the_call_while_others_run() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated", x=1), call("read")))
    assert r.state() is RunState.WAITING
    assert r.machine.waiting_for is WaitingFor.APPROVAL
    (req,) = r.fx.events_of(EventKind.APPROVAL_REQUESTED)
    assert req.data == {"call_id": "c1.0", "tool": "gated", "arguments": {"x": 1}}
    assert r.running_ids() == ["c1.1"]
    assert [c.call_id for c in r.machine.pending_approvals()] == ["c1.0"]
    assert r.fx.checkpoints[-1].snapshot["plan"][0]["status"] == "awaiting_approval"
    r.report("c1.1")
    assert len(r.fx.decides) == 1  # not before every approval is settled
    r.approve("c1.0")
    assert r.state() is RunState.RUNNING
    assert r.running_ids() == ["c1.0"]
    (settled,) = r.fx.events_of(EventKind.APPROVAL_SETTLED)
    assert settled.data["approved"] is True
    r.report("c1.0", "sent")
    assert [(x.call_id, x.ok) for x in r.last_results()] == [("c1.0", True), ("c1.1", True)]
    assert r.view.steps == 2


def test_denied_call_is_an_approval_denied_result_and_not_a_step() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated")))
    r.deny("c1.0", reason="not today")
    assert r.fx.dispatched == []
    (res,) = r.last_results()
    assert res.error is not None
    assert res.error.code is ErrorCode.APPROVAL_DENIED
    assert res.error.details["reason"] == "not today"
    assert r.view.steps == 0
    assert r.state() is RunState.RUNNING


def test_agent_waits_for_every_approval_of_the_plan() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated", n=1), call("gated", n=2)))
    r.approve("c1.1")
    assert r.state() is RunState.WAITING  # one still pending
    r.report("c1.1")
    assert len(r.fx.decides) == 1
    r.deny("c1.0")
    assert r.state() is RunState.RUNNING
    assert len(r.fx.decides) == 2
    assert [x.ok for x in r.last_results()] == [False, True]


def test_queued_messages_wait_for_the_approval_boundary() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated")))
    r.send("any news?")
    assert len(r.fx.decides) == 1
    assert r.state() is RunState.WAITING
    r.approve("c1.0")
    r.finish_all_calls()
    assert [m.content for m in r.view.delivered] == ["any news?"]


def test_approval_for_unknown_or_settled_calls_changes_nothing() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated"), call("read")))
    mark = r.mark()
    r.approve("c9.9")
    r.deny("c1.1")  # not awaiting approval (running)
    assert r.since(mark) == []
    r.approve("c1.0")
    mark = r.mark()
    r.approve("c1.0")  # approved twice: runs at most once
    r.deny("c1.0")
    assert r.since(mark) == []
    assert [j.call_id for j in r.fx.dispatched].count("c1.0") == 1


def test_approval_while_cancelling_does_not_dispatch() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated"), call("read")))
    r.cancel()
    assert r.state() is RunState.WAITING  # the read still runs
    r.approve("c1.0")
    assert [j.call_id for j in r.fx.dispatched] == ["c1.1"]
    r.report("c1.1", error=cancelled_error())
    assert r.state() is RunState.CANCELLED


def test_plan_with_approvals_is_checkpointed_before_anything_runs() -> None:
    r = Run().start()
    r.decide_next(plan(call("gated"), call("read")))
    effects = r.fx.effects
    cp = max(i for i, e in enumerate(effects) if type(e).__name__ == "CheckpointWrite")
    first_dispatch = min(i for i, e in enumerate(effects) if isinstance(e, Dispatch))
    assert cp < first_dispatch
    assert r.fx.checkpoints[-1].snapshot["plan"][1]["status"] == "pending"
