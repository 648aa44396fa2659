"""RunMachine under random interleavings (hypothesis `RuleBasedStateMachine`).

The test plays the supervisor and the world: it answers model calls with random decisions,
reports tool attempts (successes, retryable and fatal errors, late results of abandoned
attempts), fires the timers the machine scheduled (and stale ones), sends user messages in both
modes, cancels (as a host message, and as `RunHandle.cancel` does: `cancel_now` then the
stored request), records hook errors, approves and denies real and bogus calls. Tool results and
outputs are random JSON-like values, normalised as the supervisor normalises them; one tool
(`book`) validates its arguments into a date, a pydantic model and a tuple. After every step it
checks the invariants of docs/style.md and docs/contract.md: terminal states are final and
silent, messages are
delivered in seq order exactly once, every dispatched attempt ends exactly once, budgets hold,
checkpoints tile the transcript and validate, and the run settles exactly once.

Codec invariant ("decode(encode(state)) equals the state at every boundary", R24): every
checkpoint's snapshot body goes through `encode_body("snapshot", ...)` and `decode` and comes
back equal to `RunSnapshot.model_validate(body)`. The one field compared differently is a
planned call's `arguments`: the machine keeps the validated arguments (objects such as a date
or a model), which the codec stores in their JSON form. For those the decoded arguments must
equal the JSON form of the kept ones and, validated again by the same tool (what a restore
does, R21), equal them. Every new transcript entry round-trips through `encode(entry,
kind="entry")` / `decode(kind="entry")` to an equal entry. A value the codec cannot encode fails
the test: it would be a checkpoint the store cannot write.

Every message fed to the machine goes through `Run.feed`, which logs it: the resume invariant
(tests/test_machine_resume_stateful.py) replays that log.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pydantic_core import to_jsonable_python

from steerable.actors._machine.effects import TimerKind
from steerable.actors._tools.tool import normalize_result
from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    AskUser,
    CancelRequest,
    DecisionEntry,
    ErrorCode,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunSnapshot,
    RunState,
    SteeringMode,
    ToolCall,
    ToolResult,
    TranscriptEntry,
    Usage,
    UserMessage,
)
from steerable.protocol.codec import decode, encode, encode_body

if TYPE_CHECKING:  # mypy resolves the kit as tests.machine_kit (explicit package bases)
    from tests.machine_kit import (
        MODEL_KEY,
        AbandonWork,
        CheckpointWrite,
        Decide,
        Dispatch,
        Effect,
        Journal,
        Run,
        call,
        default_tools,
        retryable,
        typed_tool,
    )
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from machine_kit import (
        MODEL_KEY,
        AbandonWork,
        CheckpointWrite,
        Decide,
        Dispatch,
        Effect,
        Journal,
        Run,
        call,
        default_tools,
        retryable,
        typed_tool,
    )

EXAMPLES_SCALE = int(os.environ.get("STEERABLE_EXAMPLES_SCALE", "1"))
"""A one-off multiplier of the example counts (`STEERABLE_EXAMPLES_SCALE=10` for a long run)."""

TOOLS = [*default_tools(), typed_tool()]
STEP_NAMES = ["read", "put", "write", "gated", "slow", "book", "nope", "bad"]
# Weighted choices: most decisions are plans, most tool attempts succeed or fail retryably.
DECISIONS = ["plan"] * 6 + ["finish", "rejected", "rejected", "ask", "empty", "raise"]
TOOL_OUTCOMES = ["ok", "ok", "ok", "retryable", "retryable", "fatal", "cancelled"]
HOST_ACTIONS = ["queue"] * 3 + ["interrupt"] * 2 + ["approve"] * 3 + ["deny", "bogus", "again"]
HOST_ACTIONS += ["cancel", "cancel", "handle_cancel", "hook_error"]

# What a tool or an agent's Finish may carry once normalised (msgpack's integer range).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)

configs = st.builds(
    RunConfig,
    max_steps=st.integers(0, 6),
    max_model_calls=st.integers(1, 6),
    max_parallel_tools=st.integers(1, 3),
    step_timeout=st.sampled_from([3.0, 30.0]),
    model_timeout=st.sampled_from([2.0, 20.0]),
    total_timeout=st.one_of(st.none(), st.sampled_from([15.0, 100.0])),
    token_budget=st.one_of(st.none(), st.integers(20, 120)),
    cancel_grace=st.sampled_from([0.5, 4.0]),
    retry=st.builds(
        RetryPolicy,
        max_retries=st.integers(0, 2),
        backoff=st.sampled_from([0.1, 1.0]),
        jitter=st.booleans(),
    ),
)


def _step(name: str, i: int) -> ToolCall:
    if name == "bad":
        return call("read", bad=i)
    if name == "book":
        return call("book", when=f"2024-05-0{i % 9 + 1}", point={"x": i, "y": -i}, tags=["t"] * i)
    return call(name, i=i)


class RunMachineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.r: Run | None = None
        self.scanned = 0
        # The world's view of work in flight.
        self.live: dict[str, int] = {}  # call id -> attempt running on a worker
        self.seen_attempts: set[tuple[str, int]] = set()
        self.abandoned: list[tuple[str, int]] = []
        self.model_live: int | None = None
        # Host messages.
        self.accepted_user: list[int] = []
        self.sent: list[Any] = []
        self.cancel_accepted = False
        self.approved: set[str] = set()
        self.journaled: dict[str, ToolResult] = {}
        # Checkpoints and the end.
        self.rebuilt: list[TranscriptEntry] = []
        self.checkpoints = 0
        self.terminal_len: int | None = None
        self.terminal_state: RunState | None = None

    # ------------------------------------------------------------------ helpers

    @property
    def run(self) -> Run:
        assert self.r is not None
        return self.r

    def _scan(self) -> None:
        """Check every new effect against the world model."""
        r = self.run
        new: list[Effect] = r.fx.effects[self.scanned :]
        self.scanned = len(r.fx.effects)
        for eff in new:
            if isinstance(eff, Dispatch):
                job = eff.job
                key = (job.call_id, job.attempt)
                assert key not in self.seen_attempts, f"attempt dispatched twice: {key}"
                assert job.call_id not in self.live, f"{job.call_id} dispatched while running"
                assert not self.cancel_accepted, "dispatch after an accepted cancel"
                if job.tool == "gated":
                    assert job.call_id in self.approved, f"{job.call_id} ran unapproved"
                self.seen_attempts.add(key)
                self.live[job.call_id] = job.attempt
            elif isinstance(eff, AbandonWork):
                if eff.key == MODEL_KEY:
                    assert self.model_live is not None, "abandoned a model call not in flight"
                    self.model_live = None
                else:
                    assert eff.key in self.live, f"abandoned {eff.key}, which is not running"
                    self.abandoned.append((eff.key, self.live.pop(eff.key)))
            elif isinstance(eff, Decide):
                assert self.model_live is None, "two model calls in flight"
                assert not self.cancel_accepted, "model called after an accepted cancel"
                self.model_live = eff.model_call
                self._check_view(eff)
            elif isinstance(eff, CheckpointWrite):
                self._check_checkpoint(eff)
            elif isinstance(eff, Journal):
                res = eff.result
                assert isinstance(res, ToolResult)  # no subagents in this model
                assert res.call_id not in self.journaled, f"{res.call_id} has two results"
                self.journaled[res.call_id] = res
                tries = sum(1 for c, _ in self.seen_attempts if c == res.call_id)
                assert res.attempts == tries, (res, tries)
                assert res.ok == (res.error is None)

    def _check_view(self, eff: Decide) -> None:
        r = self.run
        cfg = r.config
        view = eff.view
        b = view.budgets
        assert b.steps_left >= 0
        assert b.model_calls_left >= 1
        assert b.tokens_left is None or b.tokens_left >= 0
        assert b.seconds_left is None or b.seconds_left >= 0
        assert eff.model_call <= cfg.max_model_calls
        assert eff.model_call == view.model_calls + 1
        # Every user message accepted so far is delivered, in seq order, once.
        delivered = [e.seq for e in view.transcript if isinstance(e, UserMessage)]
        assert delivered == self.accepted_user, (delivered, self.accepted_user)
        if cfg.token_budget is not None:
            assert view.usage.total < cfg.token_budget

    def _check_checkpoint(self, cp: CheckpointWrite) -> None:
        assert cp.revision == self.checkpoints, "revisions go up by one"
        self.checkpoints += 1
        snap = RunSnapshot.model_validate(cp.snapshot)
        assert snap.revision == cp.revision
        assert cp.entries_from == len(self.rebuilt)
        self.rebuilt.extend(cp.entries)
        assert len(self.rebuilt) == cp.transcript_len == snap.transcript_len
        assert self.rebuilt == self.run.machine.transcript[: cp.transcript_len]
        self._check_codec(cp, snap)

    def _check_codec(self, cp: CheckpointWrite, snap: RunSnapshot) -> None:
        """decode(encode(state)) == state at this boundary (see the module docstring)."""
        decoded = decode(encode_body("snapshot", cp.snapshot), kind="snapshot")
        assert isinstance(decoded, RunSnapshot)
        no_plan = {"plan": ()}
        assert decoded.model_copy(update=no_plan) == snap.model_copy(update=no_plan)
        assert len(decoded.plan) == len(snap.plan)
        tools = self.run.machine.tools
        for got, kept in zip(decoded.plan, snap.plan, strict=True):
            no_args: dict[str, Any] = {"arguments": {}}
            assert got.model_copy(update=no_args) == kept.model_copy(update=no_args)
            assert got.arguments == to_jsonable_python(kept.arguments), (got, kept)
            tool = tools.get(got.name)
            again = got.arguments
            if tool is not None:
                try:
                    again = tool.validate(got.arguments)
                except Exception:  # the agent's bad arguments never validated: kept raw
                    again = got.arguments
            assert again == kept.arguments, (got, kept)
        for entry in cp.entries:
            assert decode(encode(entry, kind="entry"), kind="entry") == entry, entry

    def _report(self, index: int, value: Any, error: AgentError | None) -> None:
        r = self.run
        ids = sorted(self.live)
        cid = ids[index % len(ids)]
        attempt = self.live.pop(cid)
        r.fx.running.pop(cid, None)
        dropped = r.machine.metrics().late_results_dropped
        r.feed("tool_done", cid, attempt, value, error, r.now)
        assert r.machine.metrics().late_results_dropped == dropped, "a live result was dropped"

    def _answer(self, decision: Plan | Finish | AskUser | None, **kw: Any) -> None:
        self.model_live = None
        self.run.decide_next(decision, **kw)

    def _host(self, msg: Any) -> None:
        r = self.run
        terminal = r.machine.is_terminal
        fresh = msg.seq > r.machine.last_seq
        mark = r.mark()
        r.feed("host", msg, r.now)
        if not fresh:
            assert r.since(mark) == [], "a duplicate seq had an effect"
            return
        self.sent.append(msg)
        if terminal:
            return
        if isinstance(msg, UserMessage):
            self.accepted_user.append(msg.seq)
        elif isinstance(msg, CancelRequest):
            self.cancel_accepted = True
        elif msg.approved:
            self.approved.add(msg.call_id)

    # ------------------------------------------------------------------ rules

    def _alive(self) -> bool:
        return self.r is not None and not self.r.machine.is_terminal

    @initialize(cfg=configs, now=st.sampled_from([0.0, 1000.0]))
    def start(self, cfg: RunConfig, now: float) -> None:
        self.r = Run(config=cfg, tools=TOOLS, now=now)
        self.r.start()

    @precondition(lambda self: self.r is not None and self.r.fx.decide_request is not None)
    @rule(
        kind=st.sampled_from(DECISIONS),
        names=st.lists(st.sampled_from(STEP_NAMES), min_size=1, max_size=4),
        tokens=st.integers(0, 30),
        output=json_values,
    )
    def agent_decides(self, kind: str, names: list[str], tokens: int, output: Any) -> None:
        usage = Usage(output_tokens=tokens)
        if kind == "plan":
            steps = tuple(_step(n, i) for i, n in enumerate(names))
            self._answer(Plan(steps=steps, usage=usage))
        elif kind == "empty":
            self._answer(Plan(steps=(), usage=usage))
        elif kind == "finish":
            self._answer(Finish(output=normalize_result(output), usage=usage), verdict=None)
        elif kind == "rejected":
            self._answer(Finish(output=normalize_result(output), usage=usage), verdict="not yet")
        elif kind == "ask":
            self._answer(AskUser(question="?", usage=usage))
        else:
            self._answer(None, error=AgentError.of(ErrorCode.HANDLER_ERROR, "agent raised"))

    @precondition(lambda self: bool(self.live))
    @rule(index=st.integers(0, 5), outcome=st.sampled_from(TOOL_OUTCOMES), value=json_values)
    def tool_reports(self, index: int, outcome: str, value: Any) -> None:
        if outcome == "ok":
            self._report(index, normalize_result(value), None)
        elif outcome == "retryable":
            self._report(index, None, retryable())
        elif outcome == "cancelled":
            self._report(index, None, AgentError.of(ErrorCode.CANCELLED, "stopped"))
        else:
            self._report(index, None, AgentError.of(ErrorCode.HANDLER_ERROR, "boom"))

    @precondition(lambda self: bool(self.abandoned))
    @rule(index=st.integers(0, 5))
    def abandoned_worker_reports_late(self, index: int) -> None:
        r = self.run
        cid, attempt = self.abandoned.pop(index % len(self.abandoned))
        mark = r.mark()
        dropped = r.machine.metrics().late_results_dropped
        r.feed("tool_done", cid, attempt, "late", None, r.now)
        assert r.since(mark) == [], f"late result of abandoned {cid}#{attempt} had effects"
        assert r.machine.metrics().late_results_dropped == dropped + 1

    @precondition(lambda self: self.r is not None and bool(self.r.fx.timers))
    @rule(index=st.integers(0, 10))
    def timer_fires(self, index: int) -> None:
        # Timers fire in deadline order (the TimerService's order); ties in any order.
        r = self.run
        first = min(at for _, at in r.fx.timers.values())
        due = sorted(k for k, (_, at) in r.fx.timers.items() if at == first)
        kind, key = due[index % len(due)]
        r.fire(kind, key)

    @precondition(lambda self: self._alive())
    @rule(action=st.sampled_from(HOST_ACTIONS), index=st.integers(0, 10))
    def host_sends(self, action: str, index: int) -> None:
        r = self.run
        if action in ("queue", "interrupt"):
            content = f"m{len(self.sent)}"
            self._host(UserMessage(seq=r.next_seq(), content=content, mode=SteeringMode(action)))
        elif action == "cancel":
            self._host(CancelRequest(seq=r.next_seq(), reason="stop"))
        elif action == "handle_cancel":
            # RunHandle.cancel: tell the supervisor at once, then store the request in order.
            r.feed("cancel_now", "handle", r.now)
            self.cancel_accepted = True
            self._host(CancelRequest(seq=r.next_seq(), reason="handle"))
        elif action == "hook_error":
            errors = len(r.machine.errors)
            r.feed("record_error", AgentError.of(ErrorCode.HOOK_ERROR, f"hook {index} raised"))
            assert len(r.machine.errors) == errors + 1
        elif action == "again" and self.sent:
            self._host(self.sent[index % len(self.sent)])
        elif action in ("approve", "deny", "bogus"):
            pending = [c.call_id for c in r.machine.pending_approvals()]
            cid = pending[index % len(pending)] if pending and action != "bogus" else "c9.9"
            mark = r.mark()
            msg = ApprovalDecision(seq=r.next_seq(), call_id=cid, approved=action == "approve")
            self._host(msg)
            if cid not in pending:
                assert r.since(mark) == [], "an approval of no pending call had effects"

    @precondition(lambda self: self.r is not None)
    @rule(
        action=st.sampled_from(["time", "stale_timer", "bogus_result"]),
        index=st.integers(0, 7),
        cid=st.sampled_from(["c1.0", "c2.1", "c9.9"]),
        seconds=st.sampled_from([0.1, 1.0, 5.0]),
    )
    def noise(self, action: str, index: int, cid: str, seconds: float) -> None:
        r = self.run
        if action == "time":
            r.advance(seconds)
        elif action == "stale_timer" and r.fx.retired_timers:
            # A timer message already on its way when the machine unscheduled it (a race).
            retired = r.fx.retired_timers
            kind, key, attempt = retired.pop(len(retired) - 1 - index % len(retired))
            if (kind, key) not in r.fx.timers:  # else it was rescheduled: a real fire
                r.fire_raw(kind, key, attempt)
        elif action == "bogus_result":
            attempt = index % 4
            if self.live.get(cid) == attempt or (cid, attempt) in self.abandoned:
                return  # a real report, not a bogus one
            mark = r.mark()
            r.feed("tool_done", cid, attempt, "bogus", None, r.now)
            assert r.since(mark) == []

    @precondition(lambda self: self.r is not None and self.r.machine.is_terminal)
    @rule(index=st.integers(0, 3))
    def poke_the_ended_run(self, index: int) -> None:
        r = self.run
        m = r.machine
        r.feed("host", UserMessage(seq=r.next_seq(), content="late", mode="interrupt"), r.now)
        r.feed("host", CancelRequest(seq=r.next_seq()), r.now)
        r.feed("host", ApprovalDecision(seq=r.next_seq(), call_id="c1.0", approved=True), r.now)
        r.feed("cancel_now", "late", r.now)
        for kind in TimerKind:
            r.fire_raw(kind, ["run", "model", "plan", "c1.0"][index], 1)
        r.feed("tool_done", "c1.0", 1, "late", None, r.now)
        r.feed("decided", m.model_calls, Finish(output="late"), None, None, 0.0, r.now)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def holds(self) -> None:
        if self.r is None:
            return
        self._scan()
        self._terminal_is_final_and_silent()
        self._budgets_hold()
        self._delivery_is_ordered_and_once()
        self._results_follow_their_plan_in_step_order()
        self._the_run_can_make_progress()

    def _terminal_is_final_and_silent(self) -> None:
        r = self.run
        settled = len(r.fx.settled_outcomes)
        if self.terminal_state is not None:
            assert r.state() is self.terminal_state, "a terminal state was left"
            assert len(r.fx.effects) == self.terminal_len, "effects after the terminal state"
            assert settled == 1
            return
        if not r.state().is_terminal:
            assert settled == 0
            return
        self.terminal_state = r.state()
        self.terminal_len = len(r.fx.effects)
        assert settled == 1, "settled exactly once"
        outcome = r.fx.settled_outcomes[0]
        assert outcome.state is r.state()
        assert outcome.revision == self.checkpoints - 1
        assert r.fx.checkpoints[-1].snapshot["state"] == r.state().value
        assert not self.live, f"run ended with attempts still running: {self.live}"
        assert self.model_live is None, "run ended with the model call in flight"
        assert r.fx.timers == {}, f"timers left pending: {r.fx.timers}"
        if self.cancel_accepted:
            assert r.state() in (RunState.CANCELLED, RunState.ERROR), r.state()

    def _budgets_hold(self) -> None:
        m = self.run.machine
        cfg = self.run.config
        assert 0 <= m.steps <= cfg.max_steps
        assert 0 <= m.model_calls <= cfg.max_model_calls
        # R27: a step is a call that was dispatched at least once, whatever its attempts.
        assert m.steps == len({c for c, _ in self.seen_attempts})
        metrics = m.metrics()
        assert min(metrics.retries, metrics.tool_errors, metrics.late_results_dropped) >= 0

    def _results_follow_their_plan_in_step_order(self) -> None:
        entries = list(self.run.machine.transcript)
        decision = 0
        for i, entry in enumerate(entries):
            if not isinstance(entry, DecisionEntry):
                continue
            decision += 1
            if not isinstance(entry.decision, Plan):
                continue
            after = []
            for e in entries[i + 1 :]:
                if not isinstance(e, ToolResult):
                    break
                after.append(e)
            expected = [f"c{decision}.{k}" for k in range(len(entry.decision.steps))]
            assert [e.call_id for e in after] in (expected, []), (expected, after)
            for e in after:
                assert self.journaled[e.call_id] == e, "the transcript differs from the journal"

    def _delivery_is_ordered_and_once(self) -> None:
        seqs = [e.seq for e in self.run.machine.transcript if isinstance(e, UserMessage)]
        assert seqs == self.accepted_user[: len(seqs)], (seqs, self.accepted_user)

    def _the_run_can_make_progress(self) -> None:
        if self.run.state().is_terminal:
            return
        r = self.run
        waiting = r.state() is RunState.WAITING
        timers = any(k[0] is not TimerKind.RUN_DEADLINE for k in r.fx.timers)
        assert self.model_live is not None or self.live or timers or waiting, (
            f"stuck in {r.state()} with nothing pending"
        )


RunMachineModel.TestCase.settings = settings(
    max_examples=400 * EXAMPLES_SCALE,  # ~5 s when every invariant holds
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRunMachine = RunMachineModel.TestCase
