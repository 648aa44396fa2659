"""RunMachine, driven directly: completion (R9), invalid decisions (R11), budgets (R10, R27),
terminal states (R8), hook-moment events (R12) and checkpoints at safe boundaries (R21).

Execution (parallelism, retries, timeouts, deadlines) is in `test_machine_execution.py`;
steering, cancellation, AskUser and approvals in `test_machine_steering.py`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from steerable.actors._machine.effects import CallJob, TimerKind, call_job
from steerable.actors._machine.parts import Meter
from steerable.protocol import (
    HOOK_EVENTS,
    AgentError,
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    Phase,
    Plan,
    RetryPolicy,
    RunConfig,
    RunMetrics,
    RunSnapshot,
    RunState,
    SystemNote,
    ToolResult,
    Usage,
    UserMessage,
)
from steerable.protocol._stored import trimmed_metrics

if TYPE_CHECKING:  # mypy resolves the kit as tests.machine_kit (explicit package bases)
    from tests.machine_kit import (
        CheckpointWrite,
        Decide,
        Dispatch,
        Run,
        call,
        plan,
        real_tools,
        retryable,
    )
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from machine_kit import (
        CheckpointWrite,
        Decide,
        Dispatch,
        Run,
        call,
        plan,
        real_tools,
        retryable,
    )

# ---------------------------------------------------------------------- start


def test_start_checkpoints_then_calls_the_model_once() -> None:
    r = Run(now=100.0).start()
    assert r.state() is RunState.RUNNING
    effects = r.fx.effects
    cp = [i for i, e in enumerate(effects) if isinstance(e, CheckpointWrite)]
    dec = [i for i, e in enumerate(effects) if isinstance(e, Decide)]
    assert len(cp) == 1
    assert len(dec) == 1
    assert cp[0] < dec[0]
    req = r.fx.decides[0]
    assert req.model_call == 1
    assert req.deadline == 100.0 + RunConfig().model_timeout
    assert r.fx.timers[(TimerKind.MODEL_TIMEOUT, "model")] == (1, req.deadline)
    view = req.view
    assert (view.task, len(view.transcript), view.delivered) == ("the task", 0, ())
    assert view.model_calls == 0
    assert view.steps == 0
    assert view.budgets.steps_left == 50
    assert view.budgets.model_calls_left == 50
    assert view.session_id == "s1"
    assert view.task_id == "t1"
    assert r.fx.outcome is None


def test_start_twice_does_nothing() -> None:
    r = Run().start()
    mark = r.mark()
    r.machine.start(r.now + 1)
    assert r.since(mark) == []


def test_total_timeout_schedules_the_run_deadline() -> None:
    r = Run(config=RunConfig(total_timeout=30.0), now=10.0).start()
    assert r.fx.timers[(TimerKind.RUN_DEADLINE, "run")] == (0, 40.0)
    assert r.fx.decides[0].view.budgets.seconds_left == 30.0


# ---------------------------------------------------------------------- completion (R9)


def test_accepted_finish_ends_finished_with_the_output() -> None:
    r = Run().start()
    r.decide_next(Finish(output={"answer": 42}), verdict=None)
    assert r.state() is RunState.FINISHED
    out = r.outcome
    assert out.state is RunState.FINISHED
    assert out.output == {"answer": 42}
    assert out.errors == ()
    assert len(r.fx.settled_outcomes) == 1
    ended = r.fx.events_of(EventKind.RUN_ENDED)
    assert [e.data for e in ended] == [
        {
            "state": "finished",
            "error": None,
            "message": None,
            "output": {"answer": 42},
            "revision": out.revision,
        }
    ]
    assert [type(e) for e in r.machine.transcript] == [DecisionEntry]
    assert r.fx.checkpoints[-1].snapshot["state"] == "finished"
    assert r.fx.checkpoints[-1].snapshot["output"] == {"answer": 42}
    assert out.revision == r.fx.checkpoints[-1].revision
    assert r.fx.timers == {}


def test_rejected_finish_notes_the_reason_and_calls_the_model_again() -> None:
    r = Run().start()
    r.decide_next(Finish(output="draft"), verdict="the summary is missing")
    assert r.state() is RunState.RUNNING
    assert r.fx.outcome is None
    rejected = r.fx.events_of(EventKind.FINISH_REJECTED)
    assert len(rejected) == 1
    assert rejected[0].data == {"reason": "the summary is missing"}
    assert rejected[0].phase is Phase.OBSERVE
    decision, note = r.machine.transcript
    assert isinstance(decision, DecisionEntry)
    assert isinstance(note, SystemNote)
    assert "the summary is missing" in note.text
    assert note.data == {"reason": "the summary is missing"}
    req = r.fx.decides[-1]
    assert req.model_call == 2
    assert list(req.view.transcript) == [decision, note]
    r.decide_next(Finish(output="final"))
    assert r.outcome.output == "final"


def test_finish_output_is_none_unless_finished() -> None:
    r = Run(config=RunConfig(max_model_calls=1)).start()
    r.decide_next(Finish(output="x"), verdict="no")
    assert r.state() is RunState.EXHAUSTED
    assert r.outcome.output is None


# ---------------------------------------------------------------------- invalid decisions (R11)


def test_empty_plan_ends_in_error_invalid_decision() -> None:
    r = Run().start()
    r.decide_next(Plan(steps=()))
    assert r.state() is RunState.ERROR
    assert r.error.code is ErrorCode.INVALID_DECISION
    assert r.fx.dispatched == []
    assert len(r.fx.decides) == 1


def test_decide_error_ends_in_error_with_that_error() -> None:
    r = Run().start()
    boom = AgentError.of(ErrorCode.HANDLER_ERROR, "the agent raised KeyError", type="KeyError")
    r.decide_next(None, error=boom)
    assert r.state() is RunState.ERROR
    assert r.outcome.errors == (boom,)
    finished = r.fx.events_of(EventKind.REASONING_FINISHED)
    assert finished[-1].data == {"model_call": 1, "error": "handler_error"}
    assert r.machine.transcript == []


# ---------------------------------------------------------------------- budgets (R10, R27)


def test_max_model_calls_used_up_ends_exhausted() -> None:
    r = Run(config=RunConfig(max_model_calls=2)).start()
    r.decide_next(plan(call("read")))
    r.finish_all_calls()
    assert r.fx.decides[-1].view.budgets.model_calls_left == 1
    r.decide_next(plan(call("read")))
    r.finish_all_calls()
    assert r.state() is RunState.EXHAUSTED
    err = r.error
    assert err.code is ErrorCode.BUDGET_EXHAUSTED
    assert err.details["budget"] == "max_model_calls"
    assert err.details["limit"] == 2
    assert len(r.fx.decides) == 2  # the agent is not called again
    # The last plan's results are recorded all the same.
    assert len(r.results()) == 2
    assert r.fx.checkpoints[-1].transcript_len == len(r.machine.transcript)


def test_plan_with_more_steps_than_left_is_not_run_at_all() -> None:
    r = Run(config=RunConfig(max_steps=2)).start()
    r.decide_next(plan(call("read"), call("read"), call("put")))
    assert r.state() is RunState.EXHAUSTED
    assert r.fx.dispatched == []
    err = r.error
    assert err.details["budget"] == "max_steps"
    assert err.details["limit"] == 2
    assert err.details["planned"] == 3
    assert err.details["steps_left"] == 2
    assert r.machine.steps == 0


def test_steps_left_carry_over_between_plans() -> None:
    r = Run(config=RunConfig(max_steps=3)).start()
    r.decide_next(plan(call("read"), call("read")))
    r.finish_all_calls()
    assert r.view.budgets.steps_left == 1
    assert r.view.steps == 2
    mark = r.mark()
    r.decide_next(plan(call("read"), call("read")))
    assert r.state() is RunState.EXHAUSTED
    assert r.fx.of(Dispatch, mark) == []
    assert r.error.details["steps_left"] == 1


def test_plan_using_exactly_the_steps_left_runs() -> None:
    r = Run(config=RunConfig(max_steps=2)).start()
    r.decide_next(plan(call("read"), call("put")))
    assert [j.call_id for j in r.fx.dispatched] == ["c1.0", "c1.1"]
    r.finish_all_calls()
    assert r.state() is RunState.RUNNING
    assert r.machine.steps == 2
    r.decide_next(Finish(output="done"))  # a Finish needs no step
    assert r.state() is RunState.FINISHED


def test_unknown_tools_and_invalid_arguments_resolve_at_once_and_are_not_steps() -> None:
    r = Run(config=RunConfig(max_steps=1)).start()
    r.decide_next(plan(call("nope", x=1), call("read", bad=True), call("read", q="a")))
    assert r.state() is RunState.RUNNING  # only one executable step: within the budget
    assert [j.call_id for j in r.fx.dispatched] == ["c1.2"]
    journaled = {res.call_id: res for res in r.fx.journal_entries}
    assert journaled["c1.0"].error is not None
    assert journaled["c1.0"].error.code is ErrorCode.UNKNOWN_TOOL
    assert journaled["c1.0"].attempts == 0
    assert journaled["c1.1"].error is not None
    assert journaled["c1.1"].error.code is ErrorCode.INVALID_ARGUMENTS
    r.finish_all_calls("found")
    results = r.last_results()
    assert [(x.call_id, x.ok) for x in results] == [
        ("c1.0", False),
        ("c1.1", False),
        ("c1.2", True),
    ]
    assert results[2].value == "found"
    assert r.machine.steps == 1
    assert r.machine.metrics().tool_errors == 2


def test_plan_of_only_unusable_calls_goes_straight_back_to_the_agent() -> None:
    r = Run(config=RunConfig(max_steps=0)).start()
    r.decide_next(plan(call("nope"), call("read", bad=1)))
    assert r.fx.dispatched == []
    assert [x.error.code for x in r.last_results() if x.error] == [
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.INVALID_ARGUMENTS,
    ]
    assert r.view.steps == 0


def test_real_tool_validator_errors_become_invalid_arguments_results() -> None:
    r = Run(tools=real_tools()).start()
    r.decide_next(
        plan(
            call("search", query="x", limit="many"),
            call("search"),
            call("search", query="y", limit="3"),
        )
    )
    assert [(j.call_id, j.arguments) for j in r.fx.dispatched] == [
        ("c1.2", {"query": "y", "limit": 3})  # lax validation, defaults filled in
    ]
    r.finish_all_calls()
    first, second, _ = r.last_results()
    for res in (first, second):
        assert not res.ok
        assert res.error is not None
        assert res.error.code is ErrorCode.INVALID_ARGUMENTS
        assert res.error.details["tool"] == "search"


def test_token_budget_exceeded_by_a_plan_ends_exhausted_without_running_it() -> None:
    r = Run(config=RunConfig(token_budget=100)).start()
    r.decide_next(plan(call("read"), tokens=150))
    assert r.state() is RunState.EXHAUSTED
    assert r.error.details == {"budget": "token_budget", "limit": 100}
    assert r.fx.dispatched == []


def test_token_budget_exceeded_by_ask_user_ends_exhausted() -> None:
    r = Run(config=RunConfig(token_budget=10)).start()
    r.decide_next(AskUser(question="?", usage=Usage(output_tokens=11)))
    assert r.state() is RunState.EXHAUSTED
    assert r.error.details["budget"] == "token_budget"


def test_finish_is_checked_normally_when_the_token_budget_is_exceeded() -> None:
    r = Run(config=RunConfig(token_budget=10)).start()
    r.decide_next(Finish(output="ok", usage=Usage(input_tokens=500)), verdict=None)
    assert r.state() is RunState.FINISHED
    assert r.outcome.output == "ok"
    assert r.outcome.metrics.input_tokens == 500


def test_rejected_finish_over_the_token_budget_exhausts_at_the_boundary() -> None:
    r = Run(config=RunConfig(token_budget=10)).start()
    r.decide_next(Finish(output="ok", usage=Usage(input_tokens=50)), verdict="not yet")
    assert r.state() is RunState.EXHAUSTED
    assert r.error.details["budget"] == "token_budget"
    assert len(r.fx.decides) == 1
    assert isinstance(r.machine.transcript[-1], SystemNote)


def test_token_budget_used_up_exactly_stops_before_the_next_model_call() -> None:
    r = Run(config=RunConfig(token_budget=100)).start()
    r.decide_next(plan(call("read"), tokens=100))
    assert len(r.fx.dispatched) == 1  # within the budget: the plan runs
    r.finish_all_calls()
    assert r.state() is RunState.EXHAUSTED
    assert len(r.fx.decides) == 1


def test_retries_are_attempts_within_one_step() -> None:
    cfg = RunConfig(retry=RetryPolicy(max_retries=3, jitter=False))
    r = Run(config=cfg).start()
    r.decide_next(plan(call("put"), call("read")))
    r.report("c1.0", error=retryable())
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.report("c1.0", error=retryable())
    r.fire(TimerKind.TOOL_RETRY, "c1.0")
    r.finish_all_calls()
    assert r.machine.steps == 2
    assert r.view.steps == 2
    put = r.last_results()[0]
    assert put.ok
    assert put.attempts == 3
    assert r.machine.metrics().retries == 2


def test_a_call_that_failed_still_counts_as_a_step() -> None:
    r = Run(config=RunConfig(max_steps=1)).start()
    r.decide_next(plan(call("write")))
    r.report("c1.0", error=AgentError.of(ErrorCode.HANDLER_ERROR, "boom"))
    assert r.view.steps == 1
    assert r.view.budgets.steps_left == 0
    r.decide_next(plan(call("read")))
    assert r.state() is RunState.EXHAUSTED


# ---------------------------------------------------------------------- terminal states (R8)


def _finished_run_with_stale_work() -> Run:
    """A run that finished while a timer and a late result were still on their way."""
    r = Run(config=RunConfig(total_timeout=1000.0, max_parallel_tools=1)).start()
    r.decide_next(plan(call("read"), call("read")))
    r.report("c1.0")
    r.report("c1.1")
    r.decide_next(Finish(output="done"))
    assert r.state() is RunState.FINISHED
    return r


def test_nothing_changes_a_finished_run() -> None:
    r = _finished_run_with_stale_work()
    before = (r.outcome, list(r.machine.transcript), r.machine.revision)
    mark = r.mark()
    r.send("hello")
    r.send("now!", mode="interrupt")
    r.approve("c1.0")
    r.cancel("too late")
    for kind, key, attempt in [
        (TimerKind.RUN_DEADLINE, "run", 0),
        (TimerKind.TOOL_TIMEOUT, "c1.0", 1),
        (TimerKind.TOOL_RETRY, "c1.1", 2),
        (TimerKind.MODEL_TIMEOUT, "model", 2),
        (TimerKind.MODEL_RETRY, "model", 1),
        (TimerKind.GRACE, "run", 0),
        (TimerKind.GRACE, "plan", 0),
        (TimerKind.GRACE, "model", 2),
    ]:
        r.fire_raw(kind, key, attempt)
    r.machine.tool_done("c1.0", 1, "late", None, r.now)
    r.machine.decided(2, Finish(output="again"), None, None, 0.0, r.now)
    r.machine.decided(3, Plan(steps=(call("read"),)), None, None, 0.0, r.now)
    assert r.since(mark) == []
    assert r.state() is RunState.FINISHED
    assert (r.machine.outcome().output, list(r.machine.transcript), r.machine.revision) == (
        before[0].output,
        before[1],
        before[2],
    )
    assert len(r.fx.settled_outcomes) == 1


def test_abort_abandons_work_and_later_results_change_nothing() -> None:
    r = Run(config=RunConfig(max_parallel_tools=1)).start()
    r.decide_next(plan(call("read"), call("put")))
    defect = AgentError.of(ErrorCode.INTERNAL_ERROR, "a bug")
    r.machine.abort(defect)
    assert r.state() is RunState.ERROR
    assert r.outcome.errors[-1] == defect
    assert r.fx.abandoned_jobs
    assert r.fx.abandoned_jobs[0].call_id == "c1.0"
    assert r.fx.timers == {}
    mark = r.mark()
    # The abandoned worker reports anyway (a success, then a retryable error).
    r.machine.tool_done("c1.0", 1, "late", None, r.now)
    r.machine.tool_done("c1.0", 1, None, retryable(), r.now)
    assert r.since(mark) == [], "a terminal run must not act on a late result"
    assert r.machine.metrics().steps == 1


def test_terminal_state_is_checkpointed_once_and_settled_once() -> None:
    r = Run().start()
    r.decide_next(Plan(steps=()))
    terminal = [
        c for c in r.fx.checkpoints if RunSnapshot.model_validate(c.snapshot).state.is_terminal
    ]
    assert len(terminal) == 1
    assert terminal[0].snapshot["errors"][0]["code"] == "invalid_decision"
    assert len(r.fx.settled_outcomes) == 1
    assert r.fx.settled_outcomes[0].revision == terminal[0].revision


# ---------------------------------------------------------------------- events (R12)


def _hook_events(r: Run) -> list[tuple[EventKind, Phase | None]]:
    return [(e.kind, e.phase) for e in r.fx.events if e.kind in HOOK_EVENTS]


def test_hook_moments_in_order_with_their_phases() -> None:
    r = Run().start()
    r.decide_next(plan(call("read"), call("put")))
    r.finish_all_calls()
    r.decide_next(Finish(output=1))
    assert _hook_events(r) == [
        (EventKind.RUN_STARTED, Phase.LOAD),
        (EventKind.REASONING_STARTED, Phase.REASON),
        (EventKind.REASONING_FINISHED, Phase.REASON),
        (EventKind.PLANNING_STARTED, Phase.PLAN),
        (EventKind.PLANNING_FINISHED, Phase.PLAN),
        (EventKind.EXECUTE_STARTED, Phase.EXECUTE),
        (EventKind.EXECUTE_FINISHED, Phase.EXECUTE),
        (EventKind.REASONING_STARTED, Phase.REASON),
        (EventKind.REASONING_FINISHED, Phase.REASON),
        (EventKind.RUN_ENDED, None),
    ]
    kinds = [e.kind for e in r.fx.events]
    # Tool events sit between EXECUTE_STARTED and EXECUTE_FINISHED.
    start, end = kinds.index(EventKind.EXECUTE_STARTED), kinds.index(EventKind.EXECUTE_FINISHED)
    inner = kinds[start + 1 : end]
    assert inner.count(EventKind.TOOL_STARTED) == 2
    assert inner.count(EventKind.TOOL_FINISHED) == 2
    assert r.fx.events_of(EventKind.EXECUTE_FINISHED)[0].data == {"calls": 2, "interrupted": False}
    assert r.fx.events_of(EventKind.PLANNING_FINISHED)[0].data == {
        "calls": ["c1.0", "c1.1"],
        "approvals": 0,
    }


def test_cancel_emits_run_cancelled_before_run_ended() -> None:
    r = Run().start()
    r.decide_next(AskUser(question="?"))
    r.cancel("stop it")
    hooks = [k for k, _ in _hook_events(r)]
    assert hooks[-2:] == [EventKind.RUN_CANCELLED, EventKind.RUN_ENDED]
    assert r.fx.events_of(EventKind.RUN_CANCELLED)[0].data == {
        "reason": "stop it",
        "abandoned": [],
    }
    ended = r.fx.events_of(EventKind.RUN_ENDED)[0].data
    assert {k: ended[k] for k in ("state", "error", "output")} == {
        "state": "cancelled",
        "error": "cancelled",
        "output": None,
    }
    assert "stop it" in ended["message"]


def test_state_changes_are_events() -> None:
    r = Run().start()
    r.decide_next(AskUser(question="which one?"))
    r.send("the first")
    r.decide_next(Finish(output=1))
    changes = [(e.data["from"], e.data["to"]) for e in r.fx.events_of(EventKind.STATE_CHANGED)]
    assert changes == [
        ("idle", "running"),
        ("running", "waiting"),
        ("waiting", "running"),
        ("running", "finished"),
    ]
    asked = r.fx.events_of(EventKind.STATE_CHANGED)[1].data
    assert asked["question"] == "which one?"
    assert asked["waiting_for"] == "user"


# ---------------------------------------------------------------------- checkpoints (R21)


def _index(r: Run, pred: type, nth: int = 0) -> int:
    hits = [i for i, e in enumerate(r.fx.effects) if isinstance(e, pred)]
    return hits[nth]


def test_checkpoints_at_safe_boundaries_only() -> None:
    r = Run(config=RunConfig(max_parallel_tools=1)).start()
    assert [c.revision for c in r.fx.checkpoints] == [0]
    r.decide_next(plan(call("read"), call("put")))
    # After the decision is recorded and keyed, before any dispatch.
    assert [c.revision for c in r.fx.checkpoints] == [0, 1]
    assert _index(r, CheckpointWrite, 1) < _index(r, Dispatch, 0)
    keyed = RunSnapshot.model_validate(r.fx.checkpoints[1].snapshot)
    assert [(p.call_id, p.status.value) for p in keyed.plan] == [
        ("c1.0", "pending"),
        ("c1.1", "pending"),
    ]
    # Keys are assigned before dispatch and distinct per call (R4).
    assert keyed.plan[0].idempotency_key == r.fx.dispatched[0].idempotency_key
    assert keyed.plan[0].idempotency_key != keyed.plan[1].idempotency_key
    # No checkpoint while the plan runs.
    r.report("c1.0")
    assert len(r.fx.checkpoints) == 2
    r.report("c1.1")
    # At the boundary before the next model call.
    assert len(r.fx.checkpoints) == 3
    assert _index(r, CheckpointWrite, 2) < _index(r, Decide, 1)
    boundary = r.fx.checkpoints[2]
    assert [type(e) for e in boundary.entries] == [ToolResult, ToolResult]
    assert boundary.snapshot["plan"] == []
    # When waiting.
    r.decide_next(AskUser(question="?"))
    assert r.fx.checkpoints[-1].snapshot["state"] == "waiting"
    assert r.fx.checkpoints[-1].snapshot["waiting_for"] == "user"
    assert r.fx.checkpoints[-1].revision == 3
    # At the terminal state.
    r.cancel()
    assert r.fx.checkpoints[-1].snapshot["state"] == "cancelled"
    assert [c.revision for c in r.fx.checkpoints] == [0, 1, 2, 3, 4]
    r.check_checkpoints()


def test_checkpoint_entries_tile_the_transcript() -> None:
    r = Run().start()
    r.decide_next(Finish(output="x"), verdict="more")
    r.send("also this")
    r.decide_next(plan(call("read"), call("nope")))
    r.send("queued")
    r.finish_all_calls()
    r.decide_next(AskUser(question="?"))
    r.send("answer")
    r.decide_next(Finish(output="y"))
    r.check_checkpoints()
    cps = r.fx.checkpoints
    assert cps[-1].transcript_len == len(r.machine.transcript)
    rebuilt = [e for c in cps for e in c.entries]
    assert rebuilt == r.machine.transcript
    kinds = [type(e).__name__ for e in rebuilt]
    assert kinds == [
        "DecisionEntry",
        "SystemNote",
        "DecisionEntry",
        "ToolResult",
        "ToolResult",
        "UserMessage",
        "UserMessage",
        "DecisionEntry",
        "UserMessage",
        "DecisionEntry",
    ]
    # The message sent while the model thought is delivered at the boundary after the plan.
    assert isinstance(rebuilt[5], UserMessage)
    assert rebuilt[5].content == "also this"


def test_checkpoint_snapshot_counts_and_pending_messages() -> None:
    r = Run().start()
    r.decide_next(plan(call("read")))
    r.send("later")
    snap = RunSnapshot.model_validate(r.machine.snapshot())
    assert snap.last_seq == 0
    assert [m.seq for m in snap.pending_messages] == [0]
    r.finish_all_calls()
    snap = RunSnapshot.model_validate(r.fx.checkpoints[-1].snapshot)
    assert snap.pending_messages == ()
    assert snap.model_calls == 1
    assert snap.steps == 1
    assert snap.decisions == 1
    assert snap.metrics.checkpoints == snap.revision + 1
    assert snap.metrics.messages_delivered == 1


@pytest.mark.parametrize("verdict", [None, "again"])
def test_every_checkpoint_validates(verdict: str | None) -> None:
    r = Run(config=RunConfig(max_model_calls=3, total_timeout=500.0)).start()
    r.decide_next(plan(call("gated"), call("read")))
    r.approve("c1.0")
    r.finish_all_calls()
    r.decide_next(Finish(output={"k": [1, 2]}), verdict=verdict)
    r.check_checkpoints()
    for cp in r.fx.checkpoints:
        RunSnapshot.model_validate(cp.snapshot)


def test_a_built_call_job_is_the_constructed_one() -> None:
    args = ("c1.0", "read", {"a": 1}, "idem_x", 2, 5.5)
    job = call_job(*args)
    assert job == CallJob(*args)
    assert repr(job) == repr(CallJob(*args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.attempt = 3  # type: ignore[misc]


def test_the_meters_trimmed_metrics_are_trimmed_metrics_of_the_full_ones() -> None:
    meter = Meter()
    meter.start(1.0)
    for counter in ("checkpoints", "retries", "checkpoints", "late_results_dropped"):
        meter.count(counter)
        meter.at(2.5)
        full, trimmed = meter.snapshot_metrics()
        expected = trimmed_metrics(full)
        assert list(trimmed.items()) == list(expected.items())  # same values, same key order
    meter.restore(
        model_calls=1, model_retries=0, steps=1, decisions=1, usage=Usage(),
        metrics=RunMetrics(tool_errors=2, checkpoints=4),
    )  # fmt: skip
    full, trimmed = meter.snapshot_metrics()
    assert list(trimmed.items()) == list(trimmed_metrics(full).items())
