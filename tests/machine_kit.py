"""Drive the pure `RunMachine` by hand: a recording `Effects` port, fake tools and a harness.

No threads, no clock: the test plays the supervisor. It answers the model call
(`decide_next`), reports tool attempts (`report`, `finish_all_calls`), fires the timers the
machine scheduled (`fire`) and sends host messages (`send`, `approve`, `deny`, `cancel`).
The `Recorder` keeps every effect as a typed record plus the derived world: the pending model
call, the attempts running on workers, the pending timers, events, checkpoints, the journal and
the settled outcome.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from steerable.actors._machine.effects import CallJob, ChildJob, TimerKind
from steerable.actors._machine.machine import MODEL_KEY, RunMachine, ToolLike
from steerable.actors._stores.store import StoredRun
from steerable.actors._tools.tool import tool
from steerable.protocol import (
    AgentError,
    AgentSpec,
    ApprovalDecision,
    AskUser,
    CancelRequest,
    CapabilitySnapshot,
    ErrorCode,
    EventKind,
    Finish,
    HostMessage,
    Phase,
    Plan,
    RunConfig,
    RunOutcome,
    RunSnapshot,
    RunState,
    RunView,
    SideEffect,
    SteeringMode,
    SubagentResult,
    ToolCall,
    ToolResult,
    ToolSpec,
    TranscriptEntry,
    Usage,
    UserMessage,
)
from steerable.protocol._stored import dynamic_part

__all__ = [
    "MODEL_KEY",
    "AbandonWork",
    "CancelWork",
    "CheckpointWrite",
    "Decide",
    "Dispatch",
    "Effect",
    "Emit",
    "FakeTool",
    "Input",
    "Journal",
    "Point",
    "Recorder",
    "Run",
    "Schedule",
    "Settled",
    "StartChild",
    "Unschedule",
    "call",
    "default_tools",
    "fake_tool",
    "kinds",
    "plan",
    "real_tools",
    "retryable",
    "typed_tool",
]


# ---------------------------------------------------------------------- effect records


@dataclass(frozen=True, slots=True)
class Decide:
    model_call: int
    view: RunView
    deadline: float


@dataclass(frozen=True, slots=True)
class Dispatch:
    job: CallJob


@dataclass(frozen=True, slots=True)
class StartChild:
    job: ChildJob


@dataclass(frozen=True, slots=True)
class CancelWork:
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class AbandonWork:
    key: str


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: TimerKind
    key: str
    attempt: int
    at: float


@dataclass(frozen=True, slots=True)
class Unschedule:
    kind: TimerKind
    key: str


@dataclass(frozen=True, slots=True)
class Emit:
    kind: EventKind
    phase: Phase | None
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Journal:
    result: ToolResult | SubagentResult


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    revision: int
    snapshot: dict[str, Any]
    entries_from: int
    entries: list[TranscriptEntry]
    transcript_len: int
    """len(machine.transcript) when the checkpoint was written (filled by the harness)."""


@dataclass(frozen=True, slots=True)
class Settled:
    outcome: RunOutcome


@dataclass(frozen=True, slots=True)
class Input:
    """One message the harness fed the machine: `getattr(machine, method)(*args)`."""

    method: str
    args: tuple[Any, ...]
    effects: int
    """len(recorder.effects) before the message: its effects are effects[effects:next.effects]."""
    now: float
    """The harness clock when the message was fed."""


Effect = (
    Decide
    | Dispatch
    | StartChild
    | CancelWork
    | AbandonWork
    | Schedule
    | Unschedule
    | Emit
    | Journal
    | CheckpointWrite
    | Settled
)


class Recorder:
    """An `Effects` implementation that records every call and keeps the world it implies.

    Attributes:
        effects: Every effect, in order.
        decide_request: The model call waiting for an answer (None if none is outstanding).
        running: call id -> the attempt a worker is running (reported or abandoned: removed).
        abandoned_jobs: Attempts given up on; their workers may still report (late results).
        timers: (kind, key) -> (attempt, at) of the pending timers.
        retired_timers: (kind, key, attempt) of timers unscheduled or replaced before firing:
            their fire message may still be on its way (a stale fire).
        settled_outcomes: Every outcome passed to `settled` (exactly one once terminal).
    """

    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self.decide_request: Decide | None = None
        self.running: dict[str, CallJob] = {}
        self.abandoned_jobs: list[CallJob] = []
        self.timers: dict[tuple[TimerKind, str], tuple[int, float]] = {}
        self.retired_timers: list[tuple[TimerKind, str, int]] = []
        self.settled_outcomes: list[RunOutcome] = []
        self.transcript_len: Callable[[], int] = lambda: 0  # set by the harness

    # -- the port

    def decide(self, model_call: int, view: RunView, deadline: float) -> None:
        eff = Decide(model_call, view, deadline)
        self.effects.append(eff)
        self.decide_request = eff

    def dispatch(self, job: CallJob) -> None:
        self.effects.append(Dispatch(job))
        self.running[job.call_id] = job

    def start_child(self, job: ChildJob) -> None:
        self.effects.append(StartChild(job))

    def cancel_work(self, key: str, reason: str) -> None:
        self.effects.append(CancelWork(key, reason))

    def abandon_work(self, key: str) -> None:
        self.effects.append(AbandonWork(key))
        if key == MODEL_KEY:
            self.decide_request = None
        else:
            job = self.running.pop(key, None)
            if job is not None:
                self.abandoned_jobs.append(job)

    def schedule(self, kind: TimerKind, key: str, attempt: int, at: float) -> None:
        self.effects.append(Schedule(kind, key, attempt, at))
        old = self.timers.get((kind, key))
        if old is not None:
            self.retired_timers.append((kind, key, old[0]))
        self.timers[(kind, key)] = (attempt, at)

    def unschedule(self, kind: TimerKind, key: str) -> None:
        self.effects.append(Unschedule(kind, key))
        old = self.timers.pop((kind, key), None)
        if old is not None:
            self.retired_timers.append((kind, key, old[0]))

    def emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        self.effects.append(Emit(kind, phase, dict(data)))

    def journal(self, result: ToolResult | SubagentResult) -> None:
        self.effects.append(Journal(result))

    def checkpoint(
        self,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> None:
        # The body carries the per-revision part the stores write: the same as splitting it.
        assert getattr(snapshot, "dynamic", None) == dynamic_part(dict(snapshot))
        self.effects.append(
            CheckpointWrite(
                revision, snapshot, entries_from, list(entries), int(self.transcript_len())
            )
        )

    def settled(self, outcome: RunOutcome) -> None:
        self.effects.append(Settled(outcome))
        self.settled_outcomes.append(outcome)

    # -- views of the record

    def of(self, kind: type[Any], since: int = 0) -> list[Any]:
        """The effects of one record type, from index `since`."""
        return [e for e in self.effects[since:] if isinstance(e, kind)]

    @property
    def events(self) -> list[Emit]:
        return [e for e in self.effects if isinstance(e, Emit)]

    def event_kinds(self, since: int = 0, *, hooks_only: bool = False) -> list[EventKind]:
        from steerable.protocol import HOOK_EVENTS

        return [
            e.kind
            for e in self.effects[since:]
            if isinstance(e, Emit) and (not hooks_only or e.kind in HOOK_EVENTS)
        ]

    def events_of(self, kind: EventKind) -> list[Emit]:
        return [e for e in self.effects if isinstance(e, Emit) and e.kind is kind]

    @property
    def checkpoints(self) -> list[CheckpointWrite]:
        return [e for e in self.effects if isinstance(e, CheckpointWrite)]

    @property
    def dispatched(self) -> list[CallJob]:
        return [e.job for e in self.effects if isinstance(e, Dispatch)]

    @property
    def decides(self) -> list[Decide]:
        return [e for e in self.effects if isinstance(e, Decide)]

    @property
    def journal_entries(self) -> list[ToolResult]:
        return [
            e.result
            for e in self.effects
            if isinstance(e, Journal) and isinstance(e.result, ToolResult)
        ]

    @property
    def outcome(self) -> RunOutcome | None:
        return self.settled_outcomes[-1] if self.settled_outcomes else None


# ---------------------------------------------------------------------- tools and decisions


@dataclass
class FakeTool:
    """A tool as the machine sees it: a spec and a validator.

    `validate` rejects arguments carrying `bad` (with a ValueError, as any validator may) and
    returns a copy of the rest.
    """

    spec: ToolSpec

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if "bad" in arguments:
            raise ValueError(f"argument 'bad' is not accepted by {self.spec.name}")
        return dict(arguments)


def fake_tool(
    name: str,
    *,
    side_effect: str | SideEffect = SideEffect.NONE,
    timeout: float | None = None,
    requires_approval: bool = False,
) -> FakeTool:
    return FakeTool(
        ToolSpec(
            name=name,
            side_effect=SideEffect(side_effect),
            timeout=timeout,
            requires_approval=requires_approval,
        )
    )


def default_tools() -> list[FakeTool]:
    """read (none), put (idempotent), write (write), gated (needs approval), slow (timeout 5)."""
    return [
        fake_tool("read"),
        fake_tool("put", side_effect="idempotent"),
        fake_tool("write", side_effect="write"),
        fake_tool("gated", requires_approval=True),
        fake_tool("slow", timeout=5.0),
    ]


def real_tools() -> list[ToolLike]:
    """Real `@tool`s, for the argument validation path of the real validator."""

    @tool(side_effect="none")
    def search(query: str, limit: int = 5) -> list[str]:
        return [query] * limit

    @tool(side_effect="write")
    def send(to: str, body: str) -> str:
        return f"{to}:{body}"

    return [search, send]


class Point(BaseModel):
    x: int
    y: int


def typed_tool() -> ToolLike:
    """A real idempotent `@tool` whose validated arguments are not plain JSON (a date, a
    pydantic model, a tuple): what the machine keeps in its plan and snapshots."""

    @tool(side_effect="idempotent")
    def book(when: datetime.date, point: Point, tags: tuple[str, ...] = ()) -> str:
        return f"{when}:{point.x},{point.y}:{len(tags)}"

    return book


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


def plan(*steps: ToolCall, tokens: int = 0) -> Plan:
    return Plan(steps=steps, usage=Usage(input_tokens=tokens))


def retryable(message: str = "flaky") -> AgentError:
    return AgentError.of(ErrorCode.HANDLER_ERROR, message, retryable=True)


# ---------------------------------------------------------------------- the harness


@dataclass
class Run:
    """One `RunMachine` wired to a `Recorder`, driven by hand.

    Args:
        config: The run's config (default `RunConfig()`).
        tools: The tools (default `default_tools()`).
        now: The start time.
    """

    config: RunConfig = field(default_factory=RunConfig)
    tools: Sequence[ToolLike] | None = None
    now: float = 100.0
    run_id: str = "run_test"
    task: str = "the task"

    def __post_init__(self) -> None:
        tools = default_tools() if self.tools is None else list(self.tools)
        self.fx = Recorder()
        self.machine = RunMachine(
            self.fx,
            run_id=self.run_id,
            trace_id="0" * 32,
            task=self.task,
            agent="agent",
            config=self.config,
            tools={t.spec.name: t for t in tools},
            capabilities=CapabilitySnapshot.of([t.spec for t in tools], [AgentSpec(name="agent")]),
            session_id="s1",
            task_id="t1",
        )
        self.fx.transcript_len = lambda: len(self.machine.transcript)
        self._seq = 0
        self.inputs: list[Input] = []
        """Every message fed through `feed`, in order (what a resume test replays)."""

    def feed(self, method: str, *args: Any) -> None:
        """Feed one message to the machine (`start`, `host`, `decided`, `tool_done`, `timer`,
        `cancel_now`, `record_error`, ...) and record it in `inputs`."""
        self.inputs.append(Input(method, args, len(self.fx.effects), self.now))
        getattr(self.machine, method)(*args)

    def resumed(self, stored: StoredRun, now: float, messages: Sequence[HostMessage] = ()) -> Run:
        """A new harness for the same run (config, tools, id) restored from `stored` and
        resumed at `now` with `messages`, as after a crash; its effects start at the resume."""
        run = Run(config=self.config, tools=self.tools, now=now, run_id=self.run_id, task=self.task)
        run.machine.restore(stored)
        run.machine.resume(now, messages)
        return run

    # -- state

    def state(self) -> RunState:
        """The machine's state (a call, so that mypy does not narrow it between steps)."""
        return self.machine.state

    @property
    def outcome(self) -> RunOutcome:
        out = self.fx.outcome
        assert out is not None, f"the run has not settled (state {self.state()})"
        return out

    @property
    def error(self) -> AgentError:
        err = self.outcome.error
        assert err is not None
        return err

    def mark(self) -> int:
        """An index into the effect list: effects after it are `since(mark)`."""
        return len(self.fx.effects)

    def since(self, mark: int) -> list[Effect]:
        return self.fx.effects[mark:]

    @property
    def view(self) -> RunView:
        """The view of the outstanding model call."""
        req = self.fx.decide_request
        assert req is not None, "no model call is outstanding"
        return req.view

    # -- driving

    def start(self) -> Run:
        self.feed("start", self.now)
        return self

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def decide_next(
        self,
        decision: Plan | Finish | AskUser | None,
        verdict: str | None = None,
        *,
        error: AgentError | None = None,
        elapsed: float = 0.0,
    ) -> None:
        """Answer the outstanding model call."""
        req = self.fx.decide_request
        assert req is not None, "no model call is outstanding"
        self.fx.decide_request = None
        self.feed("decided", req.model_call, decision, verdict, error, elapsed, self.now)

    def report(
        self,
        call_id: str,
        value: Any = "ok",
        error: AgentError | None = None,
        *,
        attempt: int | None = None,
    ) -> None:
        """A worker reports the attempt of `call_id` it runs (or `attempt`: a late report)."""
        job = self.fx.running.get(call_id)
        if attempt is None:
            assert job is not None, f"{call_id} is not running"
            attempt = job.attempt
        if job is not None and job.attempt == attempt:
            del self.fx.running[call_id]
        self.feed("tool_done", call_id, attempt, value, error, self.now)

    def finish_all_calls(self, value: Any = "ok") -> None:
        """Report success for every running attempt, until nothing runs (dispatch order)."""
        while self.fx.running:
            call_id = next(iter(self.fx.running))
            self.report(call_id, value)

    def running_ids(self) -> list[str]:
        return list(self.fx.running)

    def fire(self, kind: TimerKind, key: str) -> None:
        """Fire the pending timer (kind, key) at its time (the clock never goes back)."""
        assert (kind, key) in self.fx.timers, f"no timer {kind}/{key}: {self.fx.timers}"
        attempt, at = self.fx.timers.pop((kind, key))
        self.now = max(self.now, at)
        self.feed("timer", kind, key, attempt, self.now)

    def fire_raw(self, kind: TimerKind, key: str, attempt: int) -> None:
        """Deliver a timer message the machine may not expect (stale or bogus)."""
        self.feed("timer", kind, key, attempt, self.now)

    def next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def send(self, content: str, mode: str | SteeringMode = "queue") -> int:
        seq = self.next_seq()
        self.feed("host", UserMessage(seq=seq, content=content, mode=SteeringMode(mode)), self.now)
        return seq

    def approve(self, call_id: str) -> None:
        self.feed(
            "host", ApprovalDecision(seq=self.next_seq(), call_id=call_id, approved=True), self.now
        )

    def deny(self, call_id: str, reason: str = "no") -> None:
        self.feed(
            "host",
            ApprovalDecision(seq=self.next_seq(), call_id=call_id, approved=False, reason=reason),
            self.now,
        )

    def cancel(self, reason: str = "stop") -> None:
        self.feed("host", CancelRequest(seq=self.next_seq(), reason=reason), self.now)

    # -- checks

    def results(self) -> list[ToolResult]:
        """Tool results in the transcript, in order."""
        return [e for e in self.machine.transcript if isinstance(e, ToolResult)]

    def last_results(self) -> list[ToolResult]:
        """The results of the latest plan, as the outstanding view shows them."""
        return [r for r in self.view.last_results if isinstance(r, ToolResult)]

    def check_checkpoints(self) -> None:
        """Every checkpoint: revisions 0, 1, 2...; a valid RunSnapshot; entries tile the log."""
        rebuilt: list[TranscriptEntry] = []
        for i, cp in enumerate(self.fx.checkpoints):
            assert cp.revision == i
            snap = RunSnapshot.model_validate(cp.snapshot)
            assert snap.revision == i
            assert cp.entries_from == len(rebuilt)
            rebuilt.extend(cp.entries)
            assert len(rebuilt) == cp.transcript_len == snap.transcript_len
        if self.fx.checkpoints:
            last = self.fx.checkpoints[-1]
            assert rebuilt == self.machine.transcript[: last.transcript_len]


def kinds(effects: Iterable[Effect]) -> list[str]:
    """A compact trace of effects, for assertion messages."""
    out: list[str] = []
    for e in effects:
        if isinstance(e, Emit):
            out.append(f"emit:{e.kind.value}")
        else:
            out.append(type(e).__name__)
    return out
