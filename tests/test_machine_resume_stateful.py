"""Resume invariant: resuming from a checkpoint and feeding the same inputs gives the same outcome.

The state machine of tests/test_machine_stateful.py runs unchanged (all its invariants hold);
`Run.feed` logs every message it feeds the machine (start, host, decided, tool_done, timer,
cancel_now, record_error) with the effect index and clock at which it was fed. At teardown the
run is crashed and resumed around every non-terminal checkpoint k, at two points:

- **after k is stored**, before anything that followed it in the same message (its
  dispatches, its model call): the store holds snapshot k, the transcript up to it, the
  results journaled for k's plan before it (calls resolved at planning, calls finished before
  an approval wait) and no later host message. The resumed machine (`restore`, then `resume`
  at the clock of that message) is fed every later input unchanged.
- **before k+1 is stored**, when k has a plan (no model call in the window between them):
  the store holds snapshot k, every result journaled for k's plan before k+1, and every host
  message accepted after k (seq above k's `last_seq`, the one that wrote k+1 included; when
  k+1 was written by `cancel_now`, the CancelRequest `RunHandle.cancel` stores right after it
  too). The machine resumes at the clock of that message and is fed every later input.

Both go through the codec as a durable store does (`decode(encode(...))` of the snapshot and
entries), so calls to run are validated again from their stored JSON arguments (R21).

"Same outcome": once both runs had every input,
1. the same transcript, entry for entry (kind, call ids, values, errors, attempts, durations);
2. the same requests to the world after the crash point: dispatched attempts (call id, tool,
   validated arguments, idempotency key, attempt, deadline), model calls (number, deadline,
   budgets and the messages the view marks as delivered), journaled results, settled states;
3. the same final snapshot (state, waiting_for, plan with call statuses and attempts, step
   and model-call counters, usage, output, inbox position and pending messages, remaining
   time, counters), the same errors, the same settled outcome, the same pending timers.

Differences the design documents, mapped explicitly (never ignored silently):

- revisions: resume checkpoints the boundary it re-enters when the original had already
  checkpointed it (a model-call boundary, an approval wait), so the resumed revision and
  `metrics.checkpoints` are the original's plus delta = checkpoints written by resume minus
  those the original wrote after the crash point in the same message; delta is 0, or 1 at
  those two kinds of checkpoint only.
- wall-clock telemetry: `duration_seconds` counts from the resume, and so does the phase under
  way at the crash point (execution, across the window or an approval wait); every other
  phase's seconds must be equal.
- plan arguments are compared in their stored JSON form (a call restored with its result
  keeps that form; calls that run again are validated again, compared in requests).
- writes (docs/contract.md "Safe boundaries", docs/durability.md): a call of a `write`
  tool without `honors_idempotency_key` that has no result when its checkpoint was stored may
  have started, so resume answers it `side_effect_unknown` instead of running it. From such a
  checkpoint the runs diverge by design: the test asserts that each such call gets that result
  at once and is never dispatched, and compares nothing further.
- the window before k+1 is lost with the process except what was stored: counters kept only
  in memory (`retries`, `tool_errors`, `late_results_dropped`) lose what the window added
  (snapshot k+1 minus snapshot k); a hook error recorded in the window is lost, and so is the
  error of an attempt retried in the window (like the `retries` it counts). The errors of the
  results journaled in the window come back with them (R6), in the plan's step order (the
  journal keeps results, not the order they came in), before the errors the resumed run
  records itself. When the run
  ends in the window (k+1 terminal), its `cancelled` error lists in `abandoned` the work the
  resumed process abandoned, and its undelivered inbox is not compared (a message that came
  after the cancel was pending in the original, and comes after the end in the resumed run). The
  remaining time counts from checkpoint k (time while no process ran does not count), so a
  window during which the clock moved is checked only for runs without `total_timeout`.
  Budgets are not telemetry: steps (R27) and model calls must be equal.

The deterministic tests at the end pin the discrepancies this invariant found.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, settings
from pydantic_core import to_jsonable_python

from steerable.actors._machine.effects import TimerKind
from steerable.actors._stores.store import StoredRun
from steerable.protocol import (
    AgentError,
    AskUser,
    CallStatus,
    ErrorCode,
    HostMessage,
    RetryPolicy,
    RunConfig,
    RunSnapshot,
    RunState,
    ToolResult,
    TranscriptEntry,
    WaitingFor,
)
from steerable.protocol.codec import decode, encode, encode_body

if TYPE_CHECKING:
    from tests import test_machine_stateful as base
    from tests.machine_kit import (
        MODEL_KEY,
        CheckpointWrite,
        Decide,
        Dispatch,
        Effect,
        Input,
        Journal,
        Run,
        Settled,
        call,
        plan,
    )
else:
    import test_machine_stateful as base
    from machine_kit import (
        MODEL_KEY,
        CheckpointWrite,
        Decide,
        Dispatch,
        Effect,
        Input,
        Journal,
        Run,
        Settled,
        call,
        plan,
    )

EXAMPLES_SCALE = base.EXAMPLES_SCALE

VOLATILE = ("retries", "tool_errors", "late_results_dropped")
"""Counters kept only in memory between checkpoints."""


@dataclass
class Crash:
    """Where the original run crashed and what its store held then."""

    k: int
    """The checkpoint resumed from."""
    last_input: int
    """The input during which the crash happened; inputs after it are fed to the resumed run."""
    effects_from: int
    """Original effects from here on are redone or come after the crash."""
    stored: StoredRun
    before_next: bool
    """True for the crash before checkpoint k+1, False for the crash after checkpoint k."""
    now: float
    """The clock at the crash: the resume's `now`."""
    lost_errors: list[AgentError] = field(default_factory=list)


def _stored(run: Run, k: int, journal_until: int, messages: list[HostMessage]) -> StoredRun:
    """What a durable store returns for checkpoint k, through the codec."""
    cps = run.fx.checkpoints
    snap = decode(encode_body("snapshot", cps[k].snapshot), kind="snapshot")
    assert isinstance(snap, RunSnapshot)
    entries: list[TranscriptEntry] = [
        decode(encode(e, kind="entry"), kind="entry") for cp in cps[: k + 1] for e in cp.entries
    ]
    ids = {pc.call_id for pc in snap.plan}
    journal = {
        e.result.call_id: e.result
        for e in run.fx.effects[:journal_until]
        if isinstance(e, Journal) and e.result.call_id in ids
    }
    return StoredRun(
        snapshot=snap,
        transcript=entries[: snap.transcript_len],
        journal=journal,
        messages=messages,
    )


def _crashes(run: Run) -> list[Crash]:
    """Both crash points around every non-terminal checkpoint (see the module docstring)."""
    effects = run.fx.effects
    positions = [i for i, e in enumerate(effects) if isinstance(e, CheckpointWrite)]
    starts = [inp.effects for inp in run.inputs]

    def input_of(pos: int) -> int:
        return bisect.bisect_right(starts, pos) - 1

    out: list[Crash] = []
    for k, pos in enumerate(positions):
        if _ended_at(run, k):
            continue
        i = input_of(pos)
        out.append(Crash(k, i, pos + 1, _stored(run, k, pos, []), False, run.inputs[i].now))
        if k + 1 == len(positions):
            continue
        snap = out[-1].stored.snapshot
        j = input_of(positions[k + 1])
        now = run.inputs[j].now
        if run.inputs[j].method == "cancel_now" and j + 1 < len(run.inputs):
            # RunHandle.cancel stores its CancelRequest at once, while a checkpoint is written
            # behind: the crash comes after that request is stored (without it, the journal
            # would hold results of a cancel the store never heard of).
            assert run.inputs[j + 1].method == "host"
            j += 1
        if not snap.plan or (snap.deadline_left is not None and now != run.inputs[i].now):
            continue
        window = run.inputs[i + 1 : j + 1]
        messages: list[HostMessage] = []
        last = snap.last_seq
        for inp in window:
            if inp.method == "host" and inp.args[0].seq > last:
                messages.append(inp.args[0])
                last = inp.args[0].seq
        lost = [inp.args[0] for inp in window if inp.method == "record_error"]
        stored = _stored(run, k, positions[k + 1], messages)
        out.append(Crash(k, j, positions[k + 1], stored, True, now, lost))
    return out


def _replay(res: Run, inputs: Sequence[Input]) -> None:
    for inp in inputs:
        res.now = inp.now
        if inp.method == "timer":
            kind, key, attempt, _ = inp.args
            if res.fx.timers.get((kind, key), (None,))[0] == attempt:
                del res.fx.timers[(kind, key)]
        res.feed(inp.method, *inp.args)


def _requests(effects: Sequence[Effect]) -> list[Any]:
    out: list[Any] = []
    for e in effects:
        if isinstance(e, Dispatch):
            out.append(e.job)
        elif isinstance(e, Decide):
            delivered = [m.seq for m in e.view.delivered]
            out.append(("decide", e.model_call, e.deadline, e.view.budgets, delivered))
        elif isinstance(e, Journal):
            out.append(e.result)
        elif isinstance(e, Settled):
            out.append(("settled", e.outcome.state))
    return out


def _unknown_writes(run: Run, crash: Crash) -> set[str]:
    """Calls resume must answer with side_effect_unknown: writes without a stored result."""
    tools = run.machine.tools
    return {
        pc.call_id
        for pc in crash.stored.snapshot.plan
        if pc.kind == "tool"
        and pc.name in tools
        and not tools[pc.name].spec.redispatch_safe
        and pc.status in (CallStatus.PENDING, CallStatus.RUNNING)
        and pc.call_id not in crash.stored.journal
    }


def _check_unknown_writes(res: Run, unknown: set[str]) -> None:
    results = {e.result.call_id: e.result for e in res.fx.effects if isinstance(e, Journal)}
    dispatched = {e.job.call_id for e in res.fx.effects if isinstance(e, Dispatch)}
    for cid in unknown:
        result = results.get(cid)
        assert isinstance(result, ToolResult), f"{cid}: no result at resume"
        assert result.error is not None
        assert result.error.code is ErrorCode.SIDE_EFFECT_UNKNOWN, result
        assert cid not in dispatched, f"{cid} was dispatched again after a crash"


def _normalized(
    snapshot: dict[str, Any], delta: int, lost: dict[str, int], open_phase: str | None
) -> dict[str, Any]:
    metrics = dict(snapshot["metrics"])
    del metrics["duration_seconds"]
    phases = dict(metrics["phase_seconds"])
    phases.pop(open_phase or "", None)
    metrics["phase_seconds"] = phases
    metrics["checkpoints"] += delta
    for key, n in lost.items():
        metrics[key] -= n
    return {
        **snapshot,
        # As stored: a call restored with its result keeps its arguments' JSON form.
        "plan": to_jsonable_python(snapshot["plan"]),
        "revision": snapshot["revision"] + delta,
        "metrics": metrics,
        "errors": None,  # compared as objects
    }


def check_resume(run: Run, crash: Crash) -> None:
    """Resume the run at `crash`, feed it the inputs that followed, compare (docstring)."""
    res = run.resumed(crash.stored, crash.now, crash.stored.messages)
    unknown = _unknown_writes(run, crash)
    if unknown:
        _check_unknown_writes(res, unknown)
        return
    at_resume = len(res.fx.checkpoints)
    end_of_input = (
        run.inputs[crash.last_input + 1].effects
        if crash.last_input + 1 < len(run.inputs)
        else len(run.fx.effects)
    )
    redone = sum(
        1
        for e in run.fx.effects[crash.effects_from : end_of_input]
        if isinstance(e, CheckpointWrite)
    )
    snap = crash.stored.snapshot
    waiting_approval = snap.state is RunState.WAITING and snap.waiting_for is WaitingFor.APPROVAL
    delta = at_resume - redone
    boundary = not snap.plan and snap.state is RunState.RUNNING
    assert delta == 0 or (delta == 1 and (boundary or waiting_approval)), (delta, snap.state)
    _replay(res, run.inputs[crash.last_input + 1 :])

    a, b = run.machine, res.machine
    assert b.transcript == a.transcript
    assert _requests(res.fx.effects) == _requests(run.fx.effects[crash.effects_from :])
    assert [x.state for x in res.fx.settled_outcomes] == [x.state for x in run.fx.settled_outcomes]
    lost: dict[str, int] = {}
    if crash.before_next:
        nxt = RunSnapshot.model_validate(run.fx.checkpoints[crash.k + 1].snapshot)
        lost = {key: getattr(nxt.metrics, key) - getattr(snap.metrics, key) for key in VOLATILE}
    open_phase = "execute" if snap.plan and (crash.before_next or waiting_approval) else None
    got = _normalized(b.snapshot(), 0, {}, open_phase)
    want = _normalized(a.snapshot(), delta, lost, open_phase)
    ended_in_window = crash.before_next and _ended_at(run, crash.k + 1)
    if ended_in_window:
        for body in (got, want):  # never delivered either way (see the module docstring)
            body["pending_messages"] = body["delivered_seq"] = None
    assert got == want, _diff(got, want)
    kept = _kept_errors(run, crash)
    assert _errors(b.errors, ended_in_window) == _errors(kept, ended_in_window)
    if run.fx.settled_outcomes:
        mine, theirs = res.outcome, run.outcome
        assert mine.output == theirs.output
        assert _errors(mine.errors, ended_in_window) == _errors(kept, ended_in_window)
        assert mine.revision == theirs.revision + delta
    assert res.fx.timers == run.fx.timers


def _kept_errors(run: Run, crash: Crash) -> list[AgentError]:
    """The original's errors as the resumed run must have them (see the module docstring)."""
    errors = run.machine.errors
    if not crash.before_next:
        return list(errors)
    start = len(crash.stored.snapshot.errors)
    end = len(RunSnapshot.model_validate(run.fx.checkpoints[crash.k + 1].snapshot).errors)
    window = [
        e
        for e in errors[start:end]
        if not any(e is x for x in crash.lost_errors) and not e.details.get("retried")
    ]
    step = {pc.call_id: i for i, pc in enumerate(crash.stored.snapshot.plan)}
    journaled = [e for e in window if e.details.get("call_id") in crash.stored.journal]
    journaled.sort(key=lambda e: step[e.details["call_id"]])
    rest = [e for e in window if not any(e is x for x in journaled)]
    return [*errors[:start], *journaled, *rest, *errors[end:]]


def _ended_at(run: Run, k: int) -> bool:
    return RunSnapshot.model_validate(run.fx.checkpoints[k].snapshot).state.is_terminal


def _errors(errors: Sequence[AgentError], ended_in_window: bool) -> list[AgentError]:
    """The errors to compare: when the run ended in the window, what its cancel abandoned is
    what the resumed process abandoned (the crashed one's work is gone, its results stored)."""
    if not ended_in_window:
        return list(errors)
    return [
        e.model_copy(update={"details": {**e.details, "abandoned": None}})
        if e.code is ErrorCode.CANCELLED and "abandoned" in e.details
        else e
        for e in errors
    ]


def _diff(got: dict[str, Any], want: dict[str, Any]) -> str:
    keys = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
    return "; ".join(f"{k}: resumed {got.get(k)!r} != original {want.get(k)!r}" for k in keys)


class ResumeModel(base.RunMachineModel):
    def teardown(self) -> None:
        if self.r is None or sys.exc_info()[0] is not None:
            return  # the example already failed: report that, not a consequence of it
        for crash in _crashes(self.r):
            where = "before checkpoint" if crash.before_next else "after checkpoint"
            try:
                check_resume(self.r, crash)
            except AssertionError as exc:
                n = crash.k + crash.before_next
                raise AssertionError(f"resumed {where} {n}: {exc}") from exc


ResumeModel.TestCase.settings = settings(
    max_examples=800 * EXAMPLES_SCALE,
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestResume = ResumeModel.TestCase


# ---------------------------------------------------------------------- what the model found


def _resume(run: Run, k: int, *, before_next: bool) -> Run:
    """The run resumed at a crash after checkpoint k, or before checkpoint k+1."""
    crash = next(c for c in _crashes(run) if c.k == k and c.before_next is before_next)
    return run.resumed(crash.stored, crash.now, crash.stored.messages)


def _last_checkpoint(run: Run) -> int:
    return len(run.fx.checkpoints) - 1


def test_resume_charges_the_steps_whose_results_were_journaled() -> None:
    # R27 + "Budgets at the edge": steps that ran before a crash stay spent after it.
    r = Run(config=RunConfig(max_steps=2)).start()
    r.decide_next(plan(call("read", i=0), call("read", i=1)))
    k = _last_checkpoint(r)
    r.finish_all_calls()  # both results journaled; the crash comes before the next checkpoint
    res = _resume(r, k, before_next=True)
    assert res.machine.steps == r.machine.steps == 2
    res.decide_next(plan(call("read", i=2)))
    assert res.state() is RunState.EXHAUSTED, "a third step ran under max_steps=2"


def test_resume_keeps_the_count_of_model_retries() -> None:
    # docs/contract.md "Model calls": provider_timeout is retried under the RetryPolicy, then ERROR.
    retry = RetryPolicy(max_retries=1, backoff=0.1, jitter=False)
    r = Run(config=RunConfig(model_timeout=2.0, retry=retry)).start()
    r.fire(TimerKind.MODEL_TIMEOUT, MODEL_KEY)  # timeout 1: retry 1 of 1
    r.fire(TimerKind.MODEL_RETRY, MODEL_KEY)  # the boundary before the retry is checkpointed
    k = _last_checkpoint(r)
    r.fire(TimerKind.MODEL_TIMEOUT, MODEL_KEY)  # timeout 2: no retry left
    assert r.state() is RunState.ERROR
    res = _resume(r, k, before_next=False)
    res.fire(TimerKind.MODEL_TIMEOUT, MODEL_KEY)
    assert res.state() is RunState.ERROR, "the resumed run retried past max_retries"


def test_resume_shows_the_messages_delivered_at_its_boundary() -> None:
    # RunView.delivered: "the messages delivered at this boundary"; no model call saw them.
    r = Run().start()
    r.decide_next(AskUser(question="which file?"))
    r.send("a.txt")  # delivered at the boundary, which is checkpointed before the model call
    assert [m.content for m in r.view.delivered] == ["a.txt"]
    res = _resume(r, _last_checkpoint(r), before_next=False)
    assert [m.content for m in res.view.delivered] == ["a.txt"]


def test_resume_applies_a_stored_cancel_before_calling_the_model_again() -> None:
    # R18: after an accepted cancel the model is not called again; the cancel was stored.
    r = Run().start()
    r.decide_next(plan(call("read", i=0)))
    k = _last_checkpoint(r)
    r.send("stop that", "interrupt")
    r.cancel()
    r.report("c1.0", None, AgentError.of(ErrorCode.CANCELLED, "stopped"))
    assert r.state() is RunState.CANCELLED
    res = _resume(r, k, before_next=True)
    assert res.fx.decides == [], "the resumed run called the model after the stored cancel"
    assert res.state() is RunState.CANCELLED


def test_resume_delivers_stored_messages_at_the_boundary_they_reached() -> None:
    # R20: messages accepted before a boundary are delivered at it, whatever their modes.
    r = Run().start()
    r.decide_next(plan(call("read", i=0)))
    k = _last_checkpoint(r)
    r.send("stop that", "interrupt")
    r.send("and use b.txt")
    r.report("c1.0", None, AgentError.of(ErrorCode.CANCELLED, "stopped"))
    assert [m.content for m in r.view.delivered] == ["stop that", "and use b.txt"]
    res = _resume(r, k, before_next=True)
    assert [m.content for m in res.view.delivered] == ["stop that", "and use b.txt"]


def test_resume_in_the_deadlines_window_ends_by_the_deadline() -> None:
    # Found by ResumeModel (issue 10, defect 1), replayed step by step. The run's deadline
    # stops the plan at t=15: the results of the calls it stops are journaled, then the
    # terminal checkpoint follows. A crash between the two left a journal whose results said
    # the deadline had fired, which resume took for the plan's own results: it completed the
    # plan and went on past its deadline. It must end by the deadline, as the crashed run did.
    retry = RetryPolicy(max_retries=1, backoff=0.1, jitter=False)
    cfg = RunConfig(
        max_steps=3,
        max_model_calls=2,
        max_parallel_tools=1,
        step_timeout=30.0,
        model_timeout=2.0,
        total_timeout=15.0,
        cancel_grace=0.5,
        retry=retry,
    )
    m = ResumeModel()
    steps: list[tuple[str, dict[str, Any]]] = [
        ("start", {"cfg": cfg, "now": 0.0}),
        ("timer_fires", {"index": 0}),  # the model call times out: retry 1 of 1
        ("timer_fires", {"index": 0}),  # the retry's boundary
        ("agent_decides", {"kind": "plan", "names": ["read", "read", "gated"], "tokens": 0}),
        ("timer_fires", {"index": 1}),  # c1.0 times out at the deadline (no time to retry)
        ("abandoned_worker_reports_late", {"index": 0}),
        ("tool_reports", {"index": 0, "outcome": "ok", "value": None}),  # c1.1; c1.2 waits
        ("timer_fires", {"index": 0}),  # the run's deadline
        ("poke_the_ended_run", {"index": 0}),
        ("poke_the_ended_run", {"index": 0}),
    ]
    for name, kwargs in steps:
        if name == "agent_decides":
            kwargs["output"] = None
        getattr(m, name)(**kwargs)
        m.holds()
    assert m.run.state() is RunState.ERROR
    m.teardown()  # resumes around every checkpoint, "before checkpoint 4" included
    res = _resume(m.run, 3, before_next=True)
    assert res.state() is RunState.ERROR
    assert res.error.details.get("scope") == "run"
    assert res.fx.dispatched == []
    assert res.fx.decides == []
