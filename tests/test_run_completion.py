"""How a run ends: verified completion (R9), errors of the agent (R11), budgets (R10, R27).

Integration tests through the public API with real threads: `Runtime`, `RunHandle`, `@tool`
and the test kit. Every wait is on an event or the run's outcome; wall-clock bounds are only
fail-instead-of-hang guards.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import structlog

from steerable.actors import RetryableToolError, Runtime, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, wait_state
from steerable.protocol import (
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    SystemNote,
    ToolCall,
    ToolResult,
    Usage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


def _plan_echo(text: str = "x", tokens: int = 0) -> Plan:
    return Plan(
        steps=(ToolCall(name="echo", arguments={"text": text}),),
        usage=Usage(input_tokens=tokens, output_tokens=0),
    )


# ---------------------------------------------------------------------- verified completion


def test_accepted_finish_is_finished_with_its_output() -> None:
    seen: list[tuple[Any, RunView]] = []

    def accept(output: Any, view: RunView) -> str | None:
        seen.append((output, view))
        return None

    agent = ScriptedAgent([Finish(output={"answer": 42})])
    with Runtime() as rt:
        handle = rt.start("the task", agent=agent, accept=accept)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == {"answer": 42}
    assert outcome.errors == ()
    assert outcome.run_id == handle.run_id
    assert handle.state is RunState.FINISHED
    # accept saw the claim and the agent's view of the run
    assert len(seen) == 1
    assert seen[0][0] == {"answer": 42}
    assert seen[0][1].run_id == handle.run_id
    assert seen[0][1].task == "the task"


def test_rejected_finish_goes_back_to_the_agent_and_the_loop_goes_on() -> None:
    verdicts = iter(["the summary is missing", None])

    def accept(output: Any, view: RunView) -> str | None:
        return next(verdicts)

    agent = ScriptedAgent([Finish(output="draft"), Finish(output="draft + summary")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent, accept=accept)
        outcome = handle.result(timeout=WAIT)
        kinds = [e.kind for e in handle.events()]
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "draft + summary"
    assert agent.calls == 2
    notes = [e for e in agent.views[1].transcript if isinstance(e, SystemNote)]
    assert len(notes) == 1
    assert "the summary is missing" in notes[0].text
    assert EventKind.FINISH_REJECTED in kinds
    assert outcome.errors == ()  # a rejection is feedback, not an error


def test_a_claim_that_is_never_accepted_never_finishes() -> None:
    agent = ScriptedAgent(then=Finish(output="trust me"))
    with Runtime() as rt:
        handle = rt.start(
            "t",
            agent=agent,
            accept=lambda output, view: "not verified",
            config=RunConfig(max_model_calls=4),
        )
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.EXHAUSTED
    assert outcome.output is None
    assert agent.calls == 4
    assert outcome.errors[-1].code is ErrorCode.BUDGET_EXHAUSTED
    assert outcome.errors[-1].details["budget"] == "max_model_calls"


def test_accept_that_raises_is_recorded_and_does_not_finish_on_that_claim() -> None:
    calls = 0

    def accept(output: Any, view: RunView) -> str | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("checker offline")
        return None

    agent = ScriptedAgent([Finish(output="first"), Finish(output="second")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent, accept=accept)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "second"  # not the claim whose check raised
    assert agent.calls == 2
    errors = [e for e in outcome.errors if e.code is ErrorCode.HANDLER_ERROR]
    assert len(errors) == 1
    assert "checker offline" in errors[0].message
    assert errors[0].details.get("where") == "accept"
    notes = [e for e in agent.views[1].transcript if isinstance(e, SystemNote)]
    assert notes
    assert "checker offline" in notes[-1].text


# ---------------------------------------------------------------------- agent failures


def test_empty_plan_ends_in_error_invalid_decision() -> None:
    agent = ScriptedAgent([Plan(steps=())])
    with Runtime() as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.INVALID_DECISION
    assert agent.calls == 1  # no silent loop (R11)


def test_agent_that_raises_ends_in_error_handler_error() -> None:
    agent = ScriptedAgent([ValueError("model exploded")])
    with Runtime() as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.HANDLER_ERROR
    assert "model exploded" in outcome.error.message
    assert outcome.error.details["exception"] == "ValueError"


@pytest.mark.parametrize(
    "garbage",
    [None, "done", 42, {"kind": "teleport"}, {"answer": "yes"}, {"kind": "plan", "steps": 3}],
    ids=["none", "str", "int", "unknown-kind", "no-kind", "bad-plan"],
)
def test_agent_returning_garbage_ends_in_error_invalid_decision(garbage: object) -> None:
    agent = ScriptedAgent([lambda view: garbage])
    with Runtime() as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.INVALID_DECISION


def test_dict_decisions_in_json_shape_are_accepted() -> None:
    agent = ScriptedAgent(
        [
            {
                "kind": "plan",
                "steps": [{"kind": "tool", "name": "echo", "arguments": {"text": "hi"}}],
            },
            {"kind": "finish", "output": "ok"},
        ]
    )
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "ok"
    results = agent.views[1].last_results
    assert len(results) == 1
    assert isinstance(results[0], ToolResult)
    assert results[0].ok
    assert results[0].value == "hi"
    decisions = [e for e in agent.views[1].transcript if isinstance(e, DecisionEntry)]
    assert isinstance(decisions[0].decision, Plan)


def test_decide_runs_off_the_supervisor_thread() -> None:
    threads: list[str] = []

    def step(view: RunView) -> Finish:
        threads.append(threading.current_thread().name)
        return Finish(output=None)

    with Runtime() as rt:
        rt.start("t", agent=ScriptedAgent([step])).result(timeout=WAIT)
    assert len(threads) == 1
    assert not threads[0].startswith(("steerable-dispatch", "RunSupervisor"))


# ---------------------------------------------------------------------- budgets


def test_step_limit_yields_exhausted_never_finished() -> None:
    agent = ScriptedAgent(then=_plan_echo())
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(max_steps=3)).result(timeout=WAIT)
    assert outcome.state is RunState.EXHAUSTED
    assert outcome.output is None
    assert outcome.metrics.steps == 3
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert outcome.error.details["budget"] == "max_steps"
    assert outcome.error.details["limit"] == 3


def test_plan_larger_than_the_steps_left_is_not_run_at_all() -> None:
    ran: list[str] = []

    @tool
    def record(text: str) -> str:
        ran.append(text)
        return text

    agent = ScriptedAgent(
        [
            Plan(steps=(call("record", text="a"),)),
            Plan(steps=(call("record", text="b"), call("record", text="c"))),
        ]
    )
    with Runtime(tools=[record]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(max_steps=2)).result(timeout=WAIT)
    assert outcome.state is RunState.EXHAUSTED
    assert ran == ["a"]  # no half-run plans
    assert outcome.metrics.steps == 1
    assert outcome.error is not None
    assert outcome.error.details["budget"] == "max_steps"


def test_max_model_calls_yields_exhausted_and_the_agent_is_not_called_again() -> None:
    agent = ScriptedAgent(then=_plan_echo())
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(max_model_calls=3)).result(
            timeout=WAIT
        )
    assert outcome.state is RunState.EXHAUSTED
    assert agent.calls == 3
    assert outcome.metrics.model_calls == 3
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert outcome.error.details["budget"] == "max_model_calls"
    assert outcome.error.details["limit"] == 3


def test_token_budget_yields_exhausted() -> None:
    agent = ScriptedAgent(then=_plan_echo(tokens=40))
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(token_budget=100)).result(
            timeout=WAIT
        )
    assert outcome.state is RunState.EXHAUSTED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert outcome.error.details["budget"] == "token_budget"
    assert outcome.error.details["limit"] == 100
    # 40 + 40 fit; the third decision (120 tokens in all) is over: its plan is not run
    assert agent.calls == 3
    assert outcome.metrics.steps == 2
    assert outcome.metrics.input_tokens == 120


def test_finish_is_checked_normally_even_over_the_token_budget() -> None:
    agent = ScriptedAgent([Finish(output="done", usage=Usage(input_tokens=500, output_tokens=1))])
    with Runtime() as rt:
        outcome = rt.start("t", agent=agent, config=RunConfig(token_budget=10)).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "done"


# ---------------------------------------------------------------------- async agents


class AsyncAgent:
    """An `async def decide` agent that awaits on the runtime's loop before answering."""

    name = "async-agent"

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.views: list[RunView] = []

    async def decide(self, view: RunView) -> Plan | Finish:
        self.loops.append(asyncio.get_running_loop())
        self.views.append(view)
        await asyncio.sleep(0)
        if len(self.views) == 1:
            return _plan_echo("from async")
        return Finish(output=[r.value for r in view.last_results if isinstance(r, ToolResult)])


def test_async_def_decide_agents_work() -> None:
    agent = AsyncAgent()
    with Runtime(tools=[echo]) as rt:
        outcome = rt.start("t", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["from async"]
    assert len(agent.views) == 2
    assert agent.loops[0] is agent.loops[1]  # the runtime's one loop


def test_async_decide_that_raises_ends_in_error_handler_error() -> None:
    class Failing:
        async def decide(self, view: RunView) -> Finish:
            await asyncio.sleep(0)
            raise KeyError("no model")

    with Runtime() as rt:
        outcome = rt.start("t", agent=Failing()).result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.HANDLER_ERROR


# ---------------------------------------------------------------------- the outcome record


def test_outcome_fields_errors_metrics_and_revision() -> None:
    attempts: list[int] = []

    @tool(side_effect="idempotent")
    def flaky(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RetryableToolError("try again")
        return "ok"

    @tool
    def broken() -> str:
        raise RuntimeError("broken tool")

    agent = ScriptedAgent(
        [
            Plan(
                steps=(call("flaky"), call("broken")),
                usage=Usage(input_tokens=10, output_tokens=5),
            ),
            AskUser(question="more?", usage=Usage(input_tokens=1, output_tokens=2)),
            Finish(output="done", usage=Usage(input_tokens=100, output_tokens=50)),
        ]
    )
    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False))
    with Runtime(tools=[flaky, broken]) as rt:
        handle = rt.start("t", agent=agent, config=config)
        wait_state(handle, RunState.WAITING)
        handle.send("yes")
        outcome = handle.result(timeout=WAIT)
        checkpoints = [e for e in handle.events() if e.kind is EventKind.CHECKPOINT]
    assert outcome.state is RunState.FINISHED
    assert outcome.run_id == handle.run_id
    assert outcome.output == "done"
    # R7: tool failures are results for the agent and do not fail the run; R6: they are
    # recorded on it all the same, naming their calls (the two calls ran in parallel).
    errors = {(e.details["call_id"], e.details.get("retried")): e for e in outcome.errors}
    assert sorted(errors, key=str) == [("c1.0", True), ("c1.1", None)]
    assert errors["c1.0", True].details["attempt"] == 1
    assert errors["c1.0", True].retryable
    assert errors["c1.1", None].code is ErrorCode.HANDLER_ERROR
    m = outcome.metrics
    assert m.steps == 2  # a retried call is one step; a call that raised counts
    assert m.model_calls == 3
    assert m.input_tokens == 111
    assert m.output_tokens == 57
    assert m.retries == 1
    assert m.tool_errors == 1
    assert m.messages_delivered == 1
    assert attempts == [1, 2]
    # the outcome's revision is the final checkpoint's
    assert outcome.revision == handle.revision
    assert checkpoints[-1].data["revision"] == outcome.revision
    assert m.checkpoints == len(checkpoints) == outcome.revision + 1


def test_outcome_of_a_failed_run_lists_every_error_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    structlog.reset_defaults()  # steerable logs through `logging` unless structlog is set up
    caplog.set_level(logging.WARNING, logger="steerable")
    agent = ScriptedAgent([Plan(steps=())])
    failing_hook_calls: list[str] = []

    def hook(event: Any) -> None:
        failing_hook_calls.append(event.kind.value)
        raise RuntimeError("hook down")

    with Runtime() as rt:
        outcome = rt.start("t", agent=agent, hooks={"on_start": hook}).result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert outcome.errors[-1].code is ErrorCode.INVALID_DECISION  # the run's own error last
    # The hook runs beside the loop: an error it raised before the end is in the outcome, one
    # after the end is logged (docs/states-and-errors.md). Either way exactly once.
    in_outcome = [e for e in outcome.errors if e.code is ErrorCode.HOOK_ERROR]
    logged = [r for r in caplog.records if getattr(r, "event", None) == "hook_error_after_end"]
    assert len(in_outcome) + len(logged) == 1
    assert [e.code for e in outcome.errors] == [ErrorCode.HOOK_ERROR] * len(in_outcome) + [
        ErrorCode.INVALID_DECISION
    ]
    assert failing_hook_calls == ["run_started"]
