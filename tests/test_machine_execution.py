"""RunMachine plan execution, driven directly: parallel limit and step order (R17), retries
(R16), tool timeouts (R14, R15), model timeouts and the run deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from steerable.actors._machine.effects import TimerKind
from steerable.protocol import (
    AgentError,
    ErrorCode,
    EventKind,
    Finish,
    RetryPolicy,
    RunConfig,
    RunState,
    UserMessage,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.machine_kit (explicit package bases)
    from tests.machine_kit import (
        AbandonWork,
        CancelWork,
        Decide,
        Dispatch,
        Run,
        Schedule,
        call,
        plan,
        retryable,
    )
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from machine_kit import (
        AbandonWork,
        CancelWork,
        Decide,
        Dispatch,
        Run,
        Schedule,
        call,
        plan,
        retryable,
    )

NO_JITTER = RetryPolicy(max_retries=3, backoff=0.5, multiplier=3.0, max_backoff=2.0, jitter=False)


# ---------------------------------------------------------------------- parallelism (R17)


def test_parallel_limit_dispatches_one_more_per_completion() -> None:
    r = Run(config=RunConfig(max_parallel_tools=2)).start()
    r.decide_next(plan(*(call("read", i=i) for i in range(5))))
    assert r.running_ids() == ["c1.0", "c1.1"]
    r.report("c1.1", "v1")
    assert r.running_ids() == ["c1.0", "c1.2"]
    r.report("c1.0", "v0")
    assert r.running_ids() == ["c1.2", "c1.3"]
    r.report("c1.3", "v3")
    assert r.running_ids() == ["c1.2", "c1.4"]
    r.report("c1.4", "v4")
    assert r.running_ids() == ["c1.2"]
    assert len(r.fx.decides) == 1  # the plan is not complete yet
    r.report("c1.2", "v2")
    assert [j.call_id for j in r.fx.dispatched] == ["c1.0", "c1.1", "c1.2", "c1.3", "c1.4"]
    assert [j.arguments for j in r.fx.dispatched] == [{"i": i} for i in range(5)]
    # Results in step order, whatever the completion order.
    assert [(x.call_id, x.value) for x in r.last_results()] == [
        (f"c1.{i}", f"v{i}") for i in range(5)
    ]
    # ... while the journal holds them as they arrived (durable inbox).
    assert [x.call_id for x in r.fx.journal_entries] == ["c1.1", "c1.0", "c1.3", "c1.4", "c1.2"]


def test_call_ids_and_keys_are_distinct_per_call_and_decision() -> None:
    r = Run().start()
    r.decide_next(plan(call("write", x=1), call("write", x=1)))
    r.finish_all_calls()
    r.decide_next(plan(call("write", x=1)))
    jobs = r.fx.dispatched
    assert [j.call_id for j in jobs] == ["c1.0", "c1.1", "c2.0"]
    assert len({j.idempotency_key for j in jobs}) == 3
    assert all(r.run_id not in j.idempotency_key for j in jobs)


def test_tool_results_carry_duration_and_attempts() -> None:
    r = Run().start()
    r.decide_next(plan(call("read")))
    r.advance(2.5)
    r.report("c1.0", [1, 2])
    (res,) = r.last_results()
    assert res.ok
    assert res.value == [1, 2]
    assert res.attempts == 1
    assert res.duration == 2.5


# ---------------------------------------------------------------------- retries (R16)


@pytest.mark.parametrize("tool", ["read", "put"])
def test_retryable_error_schedules_a_retry_with_the_same_key(tool: str) -> None:
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call(tool)))
    first = r.fx.dispatched[0]
    r.advance(1.0)
    mark = r.mark()
    r.report("c1.0", error=retryable("503"))
    assert r.fx.of(Dispatch, mark) == []  # not at once: after the backoff
    assert r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")] == (2, r.now + 0.5)
    (event,) = r.fx.events_of(EventKind.TOOL_RETRY)
    assert event.data == {
        "call_id": "c1.0",
        "tool": tool,
        "attempt": 2,
        "delay": 0.5,
        "error": "handler_error",
    }
    assert r.fx.journal_entries == []  # no result yet
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    second = r.fx.dispatched[-1]
    assert (second.call_id, second.attempt) == ("c1.0", 2)
    assert second.idempotency_key == first.idempotency_key
    assert second.arguments == first.arguments
    r.report("c1.0", error=retryable("503"))
    assert r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")] == (3, r.now + 1.5)
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.report("c1.0", error=retryable("503"))
    assert r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")] == (4, r.now + 2.0)  # max_backoff
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.report("c1.0", "finally")
    assert [j.attempt for j in r.fx.dispatched] == [1, 2, 3, 4]
    assert {j.idempotency_key for j in r.fx.dispatched} == {first.idempotency_key}
    (res,) = r.last_results()
    assert res.ok
    assert res.value == "finally"
    assert res.attempts == 4
    assert r.machine.metrics().retries == 3
    # Only the first attempt announces the tool.
    assert len(r.fx.events_of(EventKind.TOOL_STARTED)) == 1


def test_retries_stop_after_max_retries() -> None:
    cfg = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.1, jitter=False))
    r = Run(config=cfg).start()
    r.decide_next(plan(call("read")))
    for _ in range(2):
        r.report("c1.0", error=retryable())
        r.fire(TimerKind.TOOL_RETRY, "c1.0")
    mark = r.mark()
    r.report("c1.0", error=retryable("still down"))
    assert all(s.kind is not TimerKind.TOOL_RETRY for s in r.fx.of(Schedule, mark))
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    (res,) = r.last_results()
    assert not res.ok
    assert res.attempts == 3
    assert res.error is not None
    assert res.error.message == "still down"
    assert res.error.retryable  # the agent may still decide to try again (R7)


def test_write_tools_are_never_retried() -> None:
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("write")))
    r.report("c1.0", error=retryable())
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    assert r.fx.events_of(EventKind.TOOL_RETRY) == []
    (res,) = r.last_results()
    assert res.attempts == 1
    assert res.error is not None
    assert res.error.retryable


def test_non_retryable_errors_are_never_retried() -> None:
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("read"), call("put")))
    r.report("c1.0", error=AgentError.of(ErrorCode.HANDLER_ERROR, "ValueError"))
    r.report("c1.1", error=AgentError.of(ErrorCode.INVALID_ARGUMENTS, "nope"))
    assert r.fx.events_of(EventKind.TOOL_RETRY) == []
    assert [x.attempts for x in r.last_results()] == [1, 1]


def test_retry_never_past_the_run_deadline() -> None:
    policy = RetryPolicy(max_retries=5, backoff=5.0, multiplier=1.0, max_backoff=5.0, jitter=False)
    r = Run(config=RunConfig(total_timeout=10.0, retry=policy), now=0.0).start()
    r.decide_next(plan(call("read")))
    r.advance(4.0)
    r.report("c1.0", error=retryable())  # 4 + 5 = 9 < 10: retried
    assert r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")] == (2, 9.0)
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.report("c1.0", error=retryable())  # 9 + 5 = 14 >= 10: not retried
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    (res,) = r.last_results()
    assert not res.ok
    assert res.attempts == 2


def test_jittered_delay_is_deterministic_and_within_half_to_full() -> None:
    policy = RetryPolicy(max_retries=3, backoff=1.0, multiplier=2.0, max_backoff=10.0, jitter=True)
    delays: list[list[float]] = []
    for _ in range(2):
        r = Run(config=RunConfig(retry=policy), now=0.0).start()
        r.decide_next(plan(call("read")))
        got = []
        for n in (1, 2, 3):
            r.report("c1.0", error=retryable())
            attempt, at = r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")]
            assert attempt == n + 1
            got.append(at - r.now)
            base = min(10.0, 1.0 * 2.0 ** (n - 1))
            assert 0.5 * base <= at - r.now <= base
            r.fire(TimerKind.TOOL_RETRY, "c1.0")
        delays.append(got)
    assert delays[0] == delays[1]  # replays see the same delays


# ---------------------------------------------------------------------- tool timeouts (R14, R15)


def test_tool_deadline_is_its_timeout_or_the_step_timeout() -> None:
    r = Run(config=RunConfig(step_timeout=7.0), now=0.0).start()
    r.decide_next(plan(call("read"), call("slow")))
    read, slow = r.fx.dispatched
    assert read.deadline == 7.0
    assert slow.deadline == 5.0
    assert r.fx.timers[(TimerKind.TOOL_TIMEOUT, "c1.0")] == (1, 7.0)
    assert r.fx.timers[(TimerKind.TOOL_TIMEOUT, "c1.1")] == (1, 5.0)


def test_tool_deadline_never_past_the_run_deadline() -> None:
    r = Run(config=RunConfig(step_timeout=60.0, total_timeout=30.0), now=0.0).start()
    r.advance(28.0)
    r.decide_next(plan(call("read"), call("slow")))
    read, slow = r.fx.dispatched
    assert read.deadline == 30.0
    assert slow.deadline == 30.0
    assert r.fx.timers[(TimerKind.TOOL_TIMEOUT, "c1.0")] == (1, 30.0)


def test_model_deadline_never_past_the_run_deadline() -> None:
    r = Run(config=RunConfig(model_timeout=120.0, total_timeout=30.0), now=0.0).start()
    assert r.fx.decides[0].deadline == 30.0
    assert r.fx.timers[(TimerKind.MODEL_TIMEOUT, "model")] == (1, 30.0)


def test_tool_timeout_abandons_the_attempt_and_retries_a_read() -> None:
    r = Run(config=RunConfig(retry=NO_JITTER), now=0.0).start()
    r.decide_next(plan(call("slow")))
    mark = r.mark()
    r.fire(TimerKind.TOOL_TIMEOUT, "c1.0")
    assert r.now == 5.0
    assert r.fx.of(CancelWork, mark) == [CancelWork("c1.0", "timeout")]
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("c1.0")]
    assert r.fx.timers[(TimerKind.TOOL_RETRY, "c1.0")] == (2, 5.5)
    assert r.fx.events_of(EventKind.TOOL_RETRY)[0].data["error"] == "timeout"
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    job = r.fx.dispatched[-1]
    assert (job.attempt, job.deadline) == (2, 10.5)
    r.report("c1.0", "second time lucky")
    (res,) = r.last_results()
    assert res.ok
    assert res.attempts == 2


def test_tool_timeout_without_retries_is_a_timeout_result() -> None:
    r = Run(config=RunConfig(retry=RetryPolicy(max_retries=0))).start()
    r.decide_next(plan(call("read")))
    r.fire(TimerKind.TOOL_TIMEOUT, "c1.0")
    (res,) = r.last_results()
    assert res.error is not None
    assert res.error.code is ErrorCode.TIMEOUT
    assert res.error.retryable
    assert res.error.details["call_id"] == "c1.0"


def test_write_tool_timeout_is_side_effect_unknown_and_never_retried() -> None:
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("write")))
    key = r.fx.dispatched[0].idempotency_key
    mark = r.mark()
    r.fire(TimerKind.TOOL_TIMEOUT, "c1.0")
    assert r.fx.of(CancelWork, mark) == [CancelWork("c1.0", "timeout")]
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("c1.0")]
    assert (TimerKind.TOOL_RETRY, "c1.0") not in r.fx.timers
    (res,) = r.last_results()
    assert res.error is not None
    assert res.error.code is ErrorCode.SIDE_EFFECT_UNKNOWN
    assert not res.error.retryable
    assert res.error.details["idempotency_key"] == key
    assert len(r.fx.dispatched) == 1


def test_late_result_of_a_timed_out_call_is_dropped_and_counted() -> None:
    r = Run(config=RunConfig(retry=RetryPolicy(max_retries=0))).start()
    r.decide_next(plan(call("read"), call("slow")))
    r.fire(TimerKind.TOOL_TIMEOUT, "c1.1")
    assert r.running_ids() == ["c1.0"]
    mark = r.mark()
    r.report("c1.1", "too late", attempt=1)
    assert r.since(mark) == []
    assert r.machine.metrics().late_results_dropped == 1
    r.finish_all_calls()
    assert [x.ok for x in r.last_results()] == [True, False]


def test_late_result_of_a_timed_out_attempt_is_dropped_while_its_retry_waits() -> None:
    """The abandoned attempt 1 reports after its timeout, before retry 2 is dispatched."""
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("slow")))
    r.fire(TimerKind.TOOL_TIMEOUT, "c1.0")
    assert (TimerKind.TOOL_RETRY, "c1.0") in r.fx.timers
    mark = r.mark()
    r.report("c1.0", "stale value", attempt=1)
    assert r.since(mark) == [], "an abandoned attempt's result must be dropped"
    assert r.machine.metrics().late_results_dropped == 1
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    assert r.fx.dispatched[-1].attempt == 2


def test_stale_tool_timeout_for_an_attempt_that_reported_changes_nothing() -> None:
    """A TOOL_TIMEOUT already on its way when the attempt failed (retry pending)."""
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("read")))
    r.report("c1.0", error=retryable())
    mark = r.mark()
    r.fire_raw(TimerKind.TOOL_TIMEOUT, "c1.0", 1)
    assert r.since(mark) == [], "a reported attempt cannot time out"
    assert r.machine.metrics().retries == 1


def test_stale_timers_are_ignored() -> None:
    r = Run(config=RunConfig(retry=NO_JITTER)).start()
    r.decide_next(plan(call("read")))
    mark = r.mark()
    r.fire_raw(TimerKind.TOOL_TIMEOUT, "c1.0", 7)  # another attempt
    r.fire_raw(TimerKind.TOOL_TIMEOUT, "c9.9", 1)  # no such call
    r.fire_raw(TimerKind.TOOL_RETRY, "c1.0", 2)  # no retry pending
    r.fire_raw(TimerKind.MODEL_TIMEOUT, "model", 1)  # the model call already answered
    r.fire_raw(TimerKind.MODEL_RETRY, "model", 1)  # no model retry pending
    r.fire_raw(TimerKind.GRACE, "plan", 0)  # no interrupt
    r.fire_raw(TimerKind.GRACE, "run", 0)  # no cancel
    r.fire_raw(TimerKind.GRACE, "model", 1)
    assert r.since(mark) == []


# ---------------------------------------------------------------------- model timeouts


def test_model_timeout_is_retried_as_a_new_model_call() -> None:
    policy = RetryPolicy(max_retries=2, backoff=1.0, multiplier=2.0, jitter=False)
    r = Run(config=RunConfig(model_timeout=10.0, retry=policy), now=0.0).start()
    mark = r.mark()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    assert r.fx.of(CancelWork, mark) == [CancelWork("model", "timeout")]
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("model")]
    errors = r.fx.events_of(EventKind.ERROR)
    assert errors[-1].data == {"code": "provider_timeout", "retry": 1, "delay": 1.0}
    assert r.fx.timers[(TimerKind.MODEL_RETRY, "model")] == (1, 11.0)
    assert r.state() is RunState.RUNNING
    r.fire(TimerKind.MODEL_RETRY, "model")
    req = r.fx.decides[-1]
    assert req.model_call == 2
    assert req.deadline == 21.0
    # The abandoned first call answers late: dropped.
    mark = r.mark()
    r.machine.decided(1, Finish(output="stale"), None, None, 15.0, r.now)
    assert r.since(mark) == []
    assert r.machine.metrics().late_results_dropped == 1
    r.decide_next(Finish(output="fresh"))
    assert r.outcome.output == "fresh"
    assert r.outcome.metrics.model_calls == 2
    assert r.outcome.metrics.retries == 1


def test_model_timeouts_past_max_retries_end_in_provider_timeout() -> None:
    policy = RetryPolicy(max_retries=1, backoff=1.0, jitter=False)
    r = Run(config=RunConfig(model_timeout=10.0, retry=policy)).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    r.fire(TimerKind.MODEL_RETRY, "model")
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    assert r.state() is RunState.ERROR
    assert r.error.code is ErrorCode.PROVIDER_TIMEOUT
    assert r.error.retryable
    assert len(r.fx.decides) == 2
    assert r.fx.timers == {}


def test_model_timeout_counts_against_max_model_calls() -> None:
    policy = RetryPolicy(max_retries=5, backoff=1.0, jitter=False)
    r = Run(config=RunConfig(max_model_calls=2, model_timeout=10.0, retry=policy)).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    r.fire(TimerKind.MODEL_RETRY, "model")
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    if (TimerKind.MODEL_RETRY, "model") in r.fx.timers:
        r.fire(TimerKind.MODEL_RETRY, "model")
    assert r.state() is RunState.EXHAUSTED
    assert r.error.details["budget"] == "max_model_calls"
    assert len(r.fx.decides) == 2


def test_model_retry_never_past_the_run_deadline() -> None:
    policy = RetryPolicy(max_retries=5, backoff=5.0, multiplier=1.0, max_backoff=5.0, jitter=False)
    cfg = RunConfig(model_timeout=10.0, total_timeout=12.0, retry=policy)
    r = Run(config=cfg, now=0.0).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")  # at 10; a retry at 15 would pass 12
    assert r.state() is RunState.ERROR
    assert r.error.code is ErrorCode.PROVIDER_TIMEOUT


def test_message_queued_during_a_timed_out_model_call_reaches_the_retry() -> None:
    """The retry is the next model call: the boundary before it delivers the inbox."""
    policy = RetryPolicy(max_retries=2, backoff=1.0, jitter=False)
    r = Run(config=RunConfig(model_timeout=10.0, retry=policy)).start()
    r.send("please also check Y")
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    r.fire(TimerKind.MODEL_RETRY, "model")
    view = r.fx.decides[-1].view
    assert [m.content for m in view.delivered] == ["please also check Y"]
    assert isinstance(view.transcript[-1], UserMessage)


def test_each_model_call_is_preceded_by_a_checkpoint() -> None:
    policy = RetryPolicy(max_retries=2, backoff=1.0, jitter=False)
    r = Run(config=RunConfig(model_timeout=10.0, retry=policy)).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")
    r.fire(TimerKind.MODEL_RETRY, "model")
    decides = [i for i, e in enumerate(r.fx.effects) if isinstance(e, Decide)]
    cps = [i for i, e in enumerate(r.fx.effects) if type(e).__name__ == "CheckpointWrite"]
    assert len(decides) == 2
    for i, d in enumerate(decides):
        previous = decides[i - 1] if i else -1
        assert any(previous < c < d for c in cps), f"no boundary before model call {i + 1}"


# ---------------------------------------------------------------------- run deadline


def test_run_deadline_during_execution_ends_in_error_timeout() -> None:
    cfg = RunConfig(total_timeout=30.0, max_parallel_tools=3, retry=NO_JITTER)
    r = Run(config=cfg, now=0.0).start()
    r.decide_next(plan(call("read"), call("put"), call("read"), call("gated")))
    r.report("c1.1", error=retryable())  # retry pending: not running on a worker
    mark = r.mark()
    r.fire(TimerKind.RUN_DEADLINE, "run")
    assert r.state() is RunState.ERROR
    err = r.error
    assert err.code is ErrorCode.TIMEOUT
    assert err.details["scope"] == "run"
    assert err.details["total_timeout"] == 30.0
    running = {"c1.0", "c1.2"}
    assert {e.key for e in r.fx.of(CancelWork, mark)} == running
    assert {e.key for e in r.fx.of(AbandonWork, mark)} == running
    journaled = {x.call_id: x for x in r.fx.journal_entries}
    assert set(journaled) == {"c1.0", "c1.1", "c1.2", "c1.3"}
    for res in journaled.values():
        assert res.error is not None
        assert res.error.code is ErrorCode.TIMEOUT
        assert res.error.details["scope"] == "run"
    assert r.fx.timers == {}
    assert len(r.fx.settled_outcomes) == 1


def test_run_deadline_while_reasoning_abandons_the_model_call() -> None:
    r = Run(config=RunConfig(total_timeout=5.0)).start()
    mark = r.mark()
    r.fire(TimerKind.RUN_DEADLINE, "run")
    assert r.fx.of(CancelWork, mark) == [CancelWork("model", "timeout")]
    assert r.fx.of(AbandonWork, mark) == [AbandonWork("model")]
    assert r.state() is RunState.ERROR
    assert r.error.details["scope"] == "run"
    mark = r.mark()
    r.machine.decided(1, Finish(output="late"), None, None, 6.0, r.now)
    assert r.since(mark) == []


# ---------------------------------------------------------------------- the outcome's errors


def test_outcome_errors_list_every_error_in_the_order_it_happened() -> None:
    # Issue 10, defect 5 (R6, docs/states-and-errors.md): tool errors (with their call id),
    # retried attempts and retried model timeouts are all in RunOutcome.errors, in order.
    r = Run(config=RunConfig(model_timeout=10.0, retry=NO_JITTER), now=0.0).start()
    r.fire(TimerKind.MODEL_TIMEOUT, "model")  # retried
    r.fire(TimerKind.MODEL_RETRY, "model")
    r.decide_next(plan(call("read", i=0), call("nope"), call("write", i=1)))  # nope: unknown
    r.report("c1.0", error=retryable("flaky"))  # retried
    r.report("c1.2", error=AgentError.of(ErrorCode.HANDLER_ERROR, "boom"))
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.report("c1.0", "fine")
    hook = AgentError.of(ErrorCode.HOOK_ERROR, "a hook raised")
    r.feed("record_error", hook)
    r.decide_next(Finish(output="done"))
    assert r.state() is RunState.FINISHED
    errors = r.outcome.errors
    assert [(e.code, e.details.get("call_id"), e.details.get("retried")) for e in errors] == [
        (ErrorCode.PROVIDER_TIMEOUT, None, True),
        (ErrorCode.UNKNOWN_TOOL, "c1.1", None),
        (ErrorCode.HANDLER_ERROR, "c1.0", True),
        (ErrorCode.HANDLER_ERROR, "c1.2", None),
        (ErrorCode.HOOK_ERROR, None, None),
    ]
    assert errors[0].details["retry"] == 1
    assert errors[2].details["attempt"] == 1
    assert errors[3].details["tool"] == "write"
    assert errors[4] == hook
    # Every error is an `error` event too, in the same order.
    events = [(e.data["code"], e.data.get("call_id")) for e in r.fx.events_of(EventKind.ERROR)]
    assert events == [(e.code.value, e.details.get("call_id")) for e in errors]
