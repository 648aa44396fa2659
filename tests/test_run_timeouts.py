"""Time limits of a run: step timeouts that do not wait for the thread (R15, R17, T3), unknown
side effects never retried (R15), the total run timeout, model timeouts with retries, and the
rule that no step waits past the run's remaining time (R14).

Real threads; the outcomes asserted here do not depend on timing: a non-cooperative Gate stays
shut until the test releases it, so a small real timeout (0.05 s) always fires first. The R14
deadlines are checked on a `ManualClock`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from steerable.actors import ManualClock, Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound
NO_RETRY = RetryPolicy(max_retries=0)
FAST_RETRY = RetryPolicy(max_retries=3, backoff=0.01, jitter=False)


def _results(view: RunView) -> list[ToolResult]:
    return [r for r in view.last_results if isinstance(r, ToolResult)]


class HungTool:
    """A non-cooperative Gate tool that remembers the threads its calls run on."""

    def __init__(self, name: str = "hang", **options: Any) -> None:
        self.gate = Gate(cooperative=False)
        self.threads: list[threading.Thread] = []
        gate, threads = self.gate, self.threads

        def body(ctx: ToolContext) -> Any:
            threads.append(threading.current_thread())
            return gate.enter(ctx)

        body.__name__ = name
        self.tool = tool(name=name, **options)(body)

    def release_and_join(self) -> None:
        self.gate.release()
        for thread in self.threads:
            thread.join(WAIT)
            assert not thread.is_alive(), f"{thread.name} did not exit after release"


@pytest.fixture
def hung() -> Iterator[HungTool]:
    """A hung tool with a 0.05 s timeout, always released when the test ends."""
    h = HungTool(timeout=0.05)
    try:
        yield h
    finally:
        h.gate.release()


def test_step_timeout_returns_control_without_waiting_for_the_thread(hung: HungTool) -> None:
    agent = ScriptedAgent([plan(call("hang")), Finish(output="moved on")])
    with Runtime(tools=[hung.tool]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(retry=NO_RETRY))
        outcome = handle.result(timeout=WAIT)
        # the run finished while the tool's thread is still blocked in the tool (R15, T3)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "moved on"
        assert not hung.gate.stopped.is_set()
        assert hung.threads[0].is_alive()
        stats = rt.statistics()
        assert stats["workers_abandoned"] == 1
        assert stats["abandoned_total"] == 1
        (result,) = _results(agent.views[1])
        assert not result.ok
        assert result.error is not None
        assert result.error.code is ErrorCode.TIMEOUT
        assert result.error.details["call_id"] == result.call_id
        # released, the abandoned thread exits and the pool stops counting it
        hung.release_and_join()
        assert hung.gate.stopped.is_set()
        assert rt.statistics()["workers_abandoned"] == 0
        assert rt.statistics()["abandoned_total"] == 1


def test_a_late_result_of_a_timed_out_call_is_dropped(hung: HungTool) -> None:
    agent = ScriptedAgent([plan(call("hang")), Finish(output="done")])
    with Runtime(tools=[hung.tool]) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(retry=NO_RETRY))
        outcome = handle.result(timeout=WAIT)
        hung.release_and_join()
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.TIMEOUT
    assert result.value is None  # "released" never reached the agent
    assert outcome.state is RunState.FINISHED


def test_timed_out_write_is_side_effect_unknown_and_never_retried() -> None:
    hung = HungTool(name="send", side_effect="write", timeout=0.05)
    agent = ScriptedAgent([plan(call("send")), Finish(output="reported")])
    try:
        with Runtime(tools=[hung.tool]) as rt:
            handle = rt.start("t", agent=agent, config=RunConfig(retry=FAST_RETRY))
            outcome = handle.result(timeout=WAIT)
            kinds = [e.kind for e in handle.events()]
            hung.release_and_join()
    finally:
        hung.gate.release()
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert result.error is not None
    assert result.error.code is ErrorCode.SIDE_EFFECT_UNKNOWN
    assert result.error.retryable is False
    assert result.error.details["side_effect"] == "unknown"
    (ctx,) = hung.gate.contexts  # one attempt, never retried (R15)
    assert result.error.details["idempotency_key"] == ctx.idempotency_key
    assert result.attempts == 1
    assert EventKind.TOOL_RETRY not in kinds
    assert outcome.metrics.retries == 0


def test_timed_out_side_effect_free_call_is_retried() -> None:
    attempts: list[int] = []

    @tool(timeout=0.05)
    def sometimes_slow(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            ctx.wait(WAIT)  # cooperative: wakes when the timeout cancels it
            return "too late"
        return "fast now"

    agent = ScriptedAgent([plan(call("sometimes_slow"))])
    with Runtime(tools=[sometimes_slow]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(retry=FAST_RETRY)).result(
            timeout=WAIT
        )
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert result.ok
    assert result.value == "fast now"
    assert result.attempts == 2
    assert attempts == [1, 2]


def test_total_timeout_ends_the_run_in_error_with_scope_run() -> None:
    hung_long = HungTool(name="hang")  # no tool timeout: only the run's deadline stops it
    agent = ScriptedAgent([plan(call("hang"))])
    try:
        with Runtime(tools=[hung_long.tool]) as rt:
            handle = rt.start(
                "t", agent=agent, config=RunConfig(total_timeout=0.1, step_timeout=60.0)
            )
            outcome = handle.result(timeout=WAIT)
            assert not hung_long.gate.stopped.is_set()  # it did not wait for the thread
            hung_long.release_and_join()
    finally:
        hung_long.gate.release()
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TIMEOUT
    assert outcome.error.details["scope"] == "run"
    assert outcome.error.details["total_timeout"] == 0.1
    assert agent.calls == 1


def test_total_timeout_also_stops_a_slow_decide() -> None:
    hold = threading.Event()

    def slow(view: RunView) -> Plan:
        hold.wait(WAIT)
        return plan(call("nothing"))

    agent = ScriptedAgent([slow])
    try:
        with Runtime() as rt:
            outcome = rt.start("t", agent=agent, config=RunConfig(total_timeout=0.1)).result(
                timeout=WAIT
            )
    finally:
        hold.set()
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TIMEOUT
    assert outcome.error.details["scope"] == "run"


def test_model_timeout_is_retried_then_ends_in_error_provider_timeout() -> None:
    hold = threading.Event()

    def stuck(view: RunView) -> Finish:
        hold.wait(WAIT)
        return Finish(output="too late")

    agent = ScriptedAgent(then=stuck)
    config = RunConfig(
        model_timeout=0.05, retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False)
    )
    try:
        with Runtime() as rt:
            handle = rt.start("t", agent=agent, config=config)
            outcome = handle.result(timeout=WAIT)
            retries = [
                e
                for e in handle.events()
                if e.kind is EventKind.ERROR
                and e.data.get("code") == "provider_timeout"
                and "retry" in e.data
            ]
    finally:
        hold.set()
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.PROVIDER_TIMEOUT
    assert agent.calls == 3  # the first try and two retries, each a model call
    assert outcome.metrics.model_calls == 3
    assert outcome.metrics.retries == 2
    assert [e.data["retry"] for e in retries] == [1, 2]


def test_model_timeout_then_a_timely_answer_finishes() -> None:
    hold = threading.Event()

    def stuck(view: RunView) -> Finish:
        hold.wait(WAIT)
        return Finish(output="stale")

    agent = ScriptedAgent([stuck, Finish(output="fresh")])
    config = RunConfig(model_timeout=0.05, retry=RetryPolicy(backoff=0.01, jitter=False))
    try:
        with Runtime() as rt:
            outcome = rt.start("t", agent=agent, config=config).result(timeout=WAIT)
    finally:
        hold.set()
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "fresh"
    assert outcome.metrics.model_calls == 2
    assert outcome.metrics.retries == 1


def test_no_step_waits_past_the_runs_remaining_time() -> None:
    clock = ManualClock(start=1000.0)
    deadlines: dict[str, float | None] = {}
    in_decide = threading.Event()
    go = threading.Event()

    @tool
    def default_timeout(ctx: ToolContext) -> str:
        deadlines["default"] = ctx.deadline
        return "a"

    @tool(timeout=2.0)
    def short_timeout(ctx: ToolContext) -> str:
        deadlines["short"] = ctx.deadline
        return "b"

    def first(view: RunView) -> Plan:
        in_decide.set()
        assert go.wait(WAIT)
        return plan(call("default_timeout"), call("short_timeout"))

    agent = ScriptedAgent([first, Finish(output="ok")])
    config = RunConfig(total_timeout=10.0, step_timeout=60.0)
    with Runtime(tools=[default_timeout, short_timeout], clock=clock) as rt:
        handle = rt.start("t", agent=agent, config=config)
        assert in_decide.wait(WAIT)
        clock.advance(4.0)  # the model "took" 4 of the run's 10 seconds
        assert rt.services.timer.wait_idle()
        go.set()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    # the run's deadline is 1010: a 60 s step is cut to it, a 2 s step keeps its own (R14)
    assert deadlines == {"default": 1010.0, "short": 1006.0}
    assert agent.views[0].budgets.seconds_left == pytest.approx(10.0)
    assert agent.views[1].budgets.seconds_left == pytest.approx(6.0)


def test_run_deadline_cuts_a_hung_call_on_a_manual_clock() -> None:
    clock = ManualClock(start=0.0)
    gate = Gate()
    agent = ScriptedAgent([plan(call("g"))])
    with Runtime(tools=[gate.tool("g")], clock=clock) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(total_timeout=5.0))
        (ctx,) = gate.wait_started(1)
        assert ctx.deadline == 5.0
        clock.advance(4.9)
        assert rt.services.timer.wait_idle()
        assert handle.state is RunState.RUNNING
        assert not ctx.cancelled
        clock.advance(0.1)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TIMEOUT
    assert outcome.error.details["scope"] == "run"
    assert ctx.cancelled


def test_a_run_keeps_one_alarm_and_its_timers_fire_after_an_early_ring() -> None:
    # Timers live in the run; the runtime's timer heap holds one alarm per run, at the
    # earliest deadline. A timer cancelled before it is due leaves the alarm where it was:
    # it rings early, finds nothing due, and is set again for what remains.
    clock = ManualClock(start=0.0)
    gate = Gate()

    @tool(timeout=1.0)
    def quick() -> str:
        """Return at once (its timeout is cancelled when it does)."""
        return "ok"

    agent = ScriptedAgent([plan(call("quick")), plan(call("g"))])
    with Runtime(tools=[quick, gate.tool("g")], clock=clock) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(total_timeout=5.0))
        (ctx,) = gate.wait_started(1)
        # The run deadline, the model timeouts, both tool timeouts: one alarm (at 1.0).
        assert rt.statistics()["timers_pending"] == 1
        clock.advance(1.0)  # the alarm rings for the cancelled timeout of `quick`
        assert rt.services.timer.wait_idle()
        assert handle.state is RunState.RUNNING
        assert not ctx.cancelled
        clock.advance(4.0)  # the run deadline, from the alarm set again
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TIMEOUT
    assert outcome.error.details["scope"] == "run"
    assert ctx.cancelled
