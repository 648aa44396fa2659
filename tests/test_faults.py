"""Fault injection at the actor level (reliability suite, item 2).

A mixed population of concurrent runs, one fault per run, with healthy runs in between: tools
that raise, hang forever, overrun their deadline, return unserialisable or 10 MB results, call
`sys.exit()`, raise `KeyboardInterrupt` or `asyncio.CancelledError`, or start threads of their
own; agents that raise, hang or return garbage; hooks that raise or hang. The runtime keeps
serving the other runs (every healthy run FINISHES), every failure is a typed `AgentError` on
its own run (R5, R6, R7, R13, R15, docs/pykka.md T3, T7), and after `shutdown()` the threads are
the baseline plus exactly the abandoned workers `shutdown()` reported.

Deterministic: a hung tool or agent waits on an event only the test sets, so a small real
timeout (0.1 s) always fires first; healthy work has generous timeouts. Everything hung is
released when the test ends, so abandoned threads exit.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog

from steerable.actors import Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan
from steerable.protocol import (
    AgentError,
    ErrorCode,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunOutcome,
    RunState,
    RunView,
    ToolResult,
)

WAIT = 30.0  # generous fail-instead-of-hang bound for one run under a loaded 2-core machine
FAST = 0.1  # the timeout of work that is meant to time out (it never returns by itself)
NO_RETRY = RetryPolicy(max_retries=0)
HEALTHY = RunConfig(retry=NO_RETRY)  # default step/model timeouts (60 s, 120 s): never hit


class Hazards:
    """What the faulty tools, agents and hooks block on; released when the test ends."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered: dict[str, threading.Event] = {}
        self.own_threads: list[threading.Thread] = []
        self.blocked_threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def block(self, what: str) -> None:
        """Block the calling thread until `release` (ignores cancellation, like T3)."""
        with self._lock:
            self.blocked_threads.append(threading.current_thread())
            self.entered.setdefault(what, threading.Event()).set()
        self.release.wait()

    def wait_entered(self, what: str) -> bool:
        """Wait until some thread blocked in `block(what)`."""
        with self._lock:
            entered = self.entered.setdefault(what, threading.Event())
        return entered.wait(WAIT)

    def spawn(self, name: str) -> None:
        """Start a thread of the tool's own that outlives the call (joined by the test)."""
        thread = threading.Thread(target=self.release.wait, name=name, daemon=False)
        with self._lock:
            self.own_threads.append(thread)
        thread.start()

    def release_and_join(self) -> None:
        self.release.set()
        with self._lock:
            threads = self.own_threads + self.blocked_threads
        for thread in threads:
            thread.join(WAIT)
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"threads still alive after release: {alive}"


@pytest.fixture
def hazards() -> Iterator[Hazards]:
    h = Hazards()
    try:
        yield h
    finally:
        h.release.set()


# --- tools that fail the same way every time (no test state)


@tool
def echo(text: str) -> str:
    return text


@tool
def boom() -> str:
    raise ValueError("tool failed on purpose")


@tool
def unserialisable() -> object:
    return object()


@tool
def circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@tool
def huge() -> str:
    return "x" * 10_000_000  # 10 MB, ten times the 1 MB result limit


@tool
def exits() -> str:
    sys.exit(3)


@tool
def interrupts() -> str:
    raise KeyboardInterrupt


@tool
def cancels_itself() -> str:
    raise asyncio.CancelledError("tool-made cancellation")


@tool
def generator_exit() -> str:
    raise GeneratorExit


@tool
def out_of_memory() -> str:
    raise MemoryError("pretend")


@tool
def recurses() -> int:
    def down(n: int) -> int:
        return down(n + 1) + 1

    return down(0)


@tool
async def async_boom() -> str:
    raise ValueError("async tool failed on purpose")


@tool(timeout=FAST)
async def async_hang() -> str:
    await asyncio.Event().wait()  # cancelled through asyncio on timeout
    return "never"


@tool
async def async_exits() -> str:
    raise SystemExit(4)


@tool
async def async_interrupts() -> str:
    raise KeyboardInterrupt


STATELESS_TOOLS = [
    echo,
    boom,
    unserialisable,
    circular,
    huge,
    exits,
    interrupts,
    cancels_itself,
    generator_exit,
    out_of_memory,
    recurses,
    async_boom,
    async_hang,
    async_exits,
    async_interrupts,
]


def fault_tools(h: Hazards) -> list[Any]:
    """Every faulty tool, plus the healthy `echo`; the blocking ones block on `h`."""

    @tool(timeout=FAST)
    def hang() -> str:
        h.block("hang")
        return "too late"

    @tool(timeout=FAST, side_effect="write")
    def hang_write() -> str:
        h.block("hang_write")
        return "too late"

    @tool(timeout=FAST)
    def overrun(ctx: ToolContext) -> str:
        ctx.wait(None)  # cooperative: wakes when the timeout cancels it, then returns late
        return "late result"

    @tool
    def own_thread(ctx: ToolContext) -> str:
        h.spawn(f"tool-own-{ctx.call_id}")
        return "spawned"

    return [*STATELESS_TOOLS, hang, hang_write, overrun, own_thread]


def report_results(view: RunView) -> Finish:
    """The agent's second decision: finish with the codes of the results it saw."""
    results = [r for r in view.last_results if isinstance(r, ToolResult)]
    return Finish(
        output=[
            {"ok": r.ok, "code": None if r.error is None else r.error.code.value} for r in results
        ]
    )


@dataclass
class Case:
    """One run of the population and what its outcome must be."""

    kind: str
    agent: Any
    state: RunState
    tool_code: ErrorCode | None = None  # the code of the tool result the agent saw
    run_code: ErrorCode | None = None  # the code of the error that ended the run
    hook_error: bool = False  # a hook_error recorded while the run still FINISHED
    config: RunConfig = HEALTHY
    hooks: dict[str, Callable[[RunEvent], object]] = field(default_factory=dict)
    accept: Callable[[Any, RunView], str | None] | None = None


def tool_case(kind: str, tool_name: str, code: ErrorCode | None, **call_args: Any) -> Case:
    agent = ScriptedAgent([plan(call(tool_name, **call_args)), report_results], name=kind)
    return Case(kind, agent, RunState.FINISHED, tool_code=code)


def agent_case(
    kind: str, step: Any, code: ErrorCode, config: RunConfig = HEALTHY, *, async_: bool = False
) -> Case:
    agent: Any = ScriptedAgent([step], name=kind)
    if async_:
        agent = AsyncAgent(step, kind)
    return Case(kind, agent, RunState.ERROR, run_code=code, config=config)


class AsyncAgent:
    """An `async def decide` agent whose first decision is `step` (a callable or a value)."""

    def __init__(self, step: Any, name: str) -> None:
        self.step = step
        self.name = name

    async def decide(self, view: RunView) -> Any:
        return await self.step(view)


def population(h: Hazards) -> list[Case]:
    """Every fault once, in a fixed order."""
    model_hang = RunConfig(model_timeout=FAST, retry=NO_RETRY)

    def hang_decide(view: RunView) -> Any:
        h.block("decide")
        return Finish(output="too late")

    async def async_raise(view: RunView) -> Any:
        raise RuntimeError("async agent failed on purpose")

    async def async_hang(view: RunView) -> Any:
        await asyncio.Event().wait()

    async def async_garbage(view: RunView) -> Any:
        return ["not", "a", "decision"]

    def raising_hook(event: RunEvent) -> None:
        raise ValueError("hook failed on purpose")

    def exiting_hook(event: RunEvent) -> None:
        sys.exit(5)

    def hanging_hook(event: RunEvent) -> None:
        h.block("hook")

    def raising_accept(output: Any, view: RunView) -> str | None:
        raise RuntimeError("accept failed on purpose")

    finishing = ScriptedAgent([plan(call("echo", text="hi"))], then=Finish(output="done"))
    return [
        # --- tools: the run goes on, the agent sees a typed error result (R7)
        tool_case("tool_raises", "boom", ErrorCode.HANDLER_ERROR),
        tool_case("tool_hangs", "hang", ErrorCode.TIMEOUT),
        tool_case("write_tool_hangs", "hang_write", ErrorCode.SIDE_EFFECT_UNKNOWN),
        tool_case("tool_overruns", "overrun", ErrorCode.TIMEOUT),
        tool_case("tool_unserialisable", "unserialisable", ErrorCode.HANDLER_ERROR),
        tool_case("tool_circular", "circular", ErrorCode.HANDLER_ERROR),
        tool_case("tool_10mb", "huge", ErrorCode.HANDLER_ERROR),
        tool_case("tool_sys_exit", "exits", ErrorCode.HANDLER_ERROR),
        tool_case("tool_keyboard_interrupt", "interrupts", ErrorCode.HANDLER_ERROR),
        tool_case("tool_cancelled_error", "cancels_itself", ErrorCode.CANCELLED),
        tool_case("tool_generator_exit", "generator_exit", ErrorCode.HANDLER_ERROR),
        tool_case("tool_memory_error", "out_of_memory", ErrorCode.HANDLER_ERROR),
        tool_case("tool_recursion", "recurses", ErrorCode.HANDLER_ERROR),
        tool_case("tool_own_thread", "own_thread", None),
        tool_case("tool_unknown", "no_such_tool", ErrorCode.UNKNOWN_TOOL),
        tool_case("tool_bad_arguments", "echo", ErrorCode.INVALID_ARGUMENTS, text=["x"]),
        tool_case("async_tool_raises", "async_boom", ErrorCode.HANDLER_ERROR),
        tool_case("async_tool_hangs", "async_hang", ErrorCode.TIMEOUT),
        tool_case("async_tool_sys_exit", "async_exits", ErrorCode.HANDLER_ERROR),
        tool_case("async_tool_keyboard_interrupt", "async_interrupts", ErrorCode.HANDLER_ERROR),
        # --- agents: the run ends in ERROR with the agent's typed error
        agent_case("agent_raises", RuntimeError("agent failed"), ErrorCode.HANDLER_ERROR),
        agent_case("agent_sys_exit", SystemExit(2), ErrorCode.HANDLER_ERROR),
        agent_case("agent_keyboard_interrupt", KeyboardInterrupt(), ErrorCode.HANDLER_ERROR),
        agent_case("agent_hangs", hang_decide, ErrorCode.PROVIDER_TIMEOUT, model_hang),
        agent_case("agent_returns_int", lambda v: 42, ErrorCode.INVALID_DECISION),
        agent_case("agent_returns_none", lambda v: None, ErrorCode.INVALID_DECISION),
        agent_case(
            "agent_returns_bad_dict",
            lambda v: {"kind": "plan", "steps": "nope"},
            ErrorCode.INVALID_DECISION,
        ),
        agent_case("agent_empty_plan", Plan(steps=()), ErrorCode.INVALID_DECISION),
        agent_case("agent_unstorable_finish", Finish(output=object()), ErrorCode.INVALID_DECISION),
        agent_case("async_agent_raises", async_raise, ErrorCode.HANDLER_ERROR, async_=True),
        agent_case(
            "async_agent_hangs",
            async_hang,
            ErrorCode.PROVIDER_TIMEOUT,
            model_hang,
            async_=True,
        ),
        agent_case("async_agent_garbage", async_garbage, ErrorCode.INVALID_DECISION, async_=True),
        # --- hooks: the run FINISHES with a hook_error recorded (R13)
        Case(
            "hook_raises",
            ScriptedAgent([plan(call("echo", text="x"))], then=Finish(output="done")),
            RunState.FINISHED,
            hook_error=True,
            hooks={"on_start": raising_hook, "after_execute": raising_hook},
        ),
        Case(
            "hook_sys_exit",
            ScriptedAgent([Finish(output="done")]),
            RunState.FINISHED,
            hook_error=True,
            hooks={"before_reasoning": exiting_hook},
        ),
        Case(
            "hook_hangs",
            ScriptedAgent([Finish(output="done")]),
            RunState.FINISHED,
            hook_error=True,
            hooks={"on_finish": hanging_hook},
        ),
        # --- the delivery check raises: never accepted, the run runs out of model calls
        Case(
            "accept_raises",
            ScriptedAgent([], then=Finish(output="claim")),
            RunState.EXHAUSTED,
            run_code=ErrorCode.BUDGET_EXHAUSTED,
            config=RunConfig(max_model_calls=3, retry=NO_RETRY),
            accept=raising_accept,
        ),
        Case("healthy_multi", finishing, RunState.FINISHED),
    ]


def healthy_case(i: int) -> Case:
    agent = ScriptedAgent(
        [plan(call("echo", text=f"a{i}"), call("echo", text=f"b{i}")), report_results],
        name=f"healthy_{i}",
    )
    return Case(f"healthy_{i}", agent, RunState.FINISHED)


def check_outcome(case: Case, outcome: RunOutcome, late_hooks: set[str]) -> list[str]:
    """What is wrong with `outcome` for `case` (empty: as expected).

    `late_hooks`: runs whose hook failed, or was given up, after their outcome was published
    (logged: docs/states-and-errors.md "Phases and hooks")."""
    problems: list[str] = []
    codes = [e.code.value for e in outcome.errors]
    if outcome.state is not case.state:
        problems.append(f"state {outcome.state.value}, errors {codes}")
        return problems
    for error in outcome.errors:
        if not isinstance(error, AgentError) or not error.message:
            problems.append(f"untyped error {error!r}")
    if case.kind.startswith("healthy"):
        want: Any = [{"ok": True, "code": None}] * 2 if case.kind != "healthy_multi" else "done"
        if outcome.output != want or outcome.errors:
            problems.append(f"healthy run: output {outcome.output!r}, errors {codes}")
    elif case.run_code is not None:
        last = outcome.error
        if last is None or last.code is not case.run_code:
            problems.append(f"ended with {codes}, expected {case.run_code.value}")
    elif case.hook_error:
        # R13: recorded on the run if the hook ran before its end, else logged after it
        recorded = ErrorCode.HOOK_ERROR.value in codes or outcome.run_id in late_hooks
        if not recorded or set(codes) - {"hook_error"}:
            problems.append(f"errors {codes}, expected hook_error only")
        if outcome.output != "done":
            problems.append(f"output {outcome.output!r}")
    else:
        want_code = None if case.tool_code is None else case.tool_code.value
        want = [{"ok": want_code is None, "code": want_code}]
        if outcome.output != want:
            problems.append(f"tool result {outcome.output!r}, expected {want!r}")
        # R6: the tool's failure is recorded on the run, naming its call; R7: it is the
        # only error (retried attempts aside), so it did not fail the run.
        final = [e.code.value for e in outcome.errors if not e.details.get("retried")]
        if final != ([] if want_code is None else [want_code]):
            problems.append(f"errors {codes}, expected the tool's {want_code} only")
        if any("call_id" not in e.details for e in outcome.errors):
            problems.append(f"a tool error without its call id: {codes}")
    return problems


def test_a_mixed_population_of_faults_leaves_every_other_run_intact(
    hazards: Hazards, caplog: pytest.LogCaptureFixture
) -> None:
    structlog.reset_defaults()  # steerable logs through `logging` unless structlog is set up
    caplog.set_level(logging.WARNING, logger="steerable")
    baseline = {t.name for t in threading.enumerate()}
    faults = population(hazards)
    cases: list[Case] = []
    for i, fault in enumerate(faults * 2):  # every fault twice
        cases.append(fault if i < len(faults) else _fresh(fault, hazards))
        if i % 2 == 0:
            cases.append(healthy_case(i))  # healthy runs in between must FINISH
    assert len(cases) >= 60
    rt = Runtime(tools=fault_tools(hazards), hook_timeout=0.5, max_abandoned=1000)
    left: list[str] = []
    try:
        handles = [
            rt.start(c.kind, agent=c.agent, config=c.config, hooks=dict(c.hooks), accept=c.accept)
            for c in cases
        ]
        outcomes = [h.result(timeout=WAIT) for h in handles]
        # Hooks still pending at a run's end run after its outcome; wait for them (the hung
        # ones are given up after hook_timeout) before reading what they logged.
        assert rt.services.hooks_draining.wait(WAIT)
        late_hooks = {
            getattr(r, "run_id", "")
            for r in caplog.records
            if getattr(r, "event", None) in ("hook_error_after_end", "hooks_abandoned_after_end")
        }
        problems = {
            f"{c.kind}#{i}": p
            for i, (c, o) in enumerate(zip(cases, outcomes, strict=True))
            if (p := check_outcome(c, o, late_hooks))
        }
        assert not problems, problems
        stats = rt.statistics()
        assert stats["runs_active"] == 0
        assert stats["runs_passivated"] == 0
        assert stats["runs_started"] == stats["runs_ended"] == len(cases)
        assert rt.directory.entries() == []
        # abandoned: the hung sync tools and decides (2 x 3); the overrunning tool (2) only
        # if it had not returned yet when its timeout gave it up (it returns when cancelled)
        assert 6 <= stats["abandoned_total"] <= 8
    finally:
        left = rt.shutdown(timeout=5.0)
    extra = {t.name for t in threading.enumerate()} - baseline
    own = {t.name for t in hazards.own_threads}
    # R15/T3: only workers blocked in user code may outlive shutdown, and it names them all
    assert extra - own <= set(left), f"unreported threads: {sorted(extra - own - set(left))}"
    assert set(left) <= {t.name for t in hazards.blocked_threads}
    hazards.release_and_join()
    after = {t.name for t in threading.enumerate() if t.is_alive()}
    assert after == baseline
    faulty = sum(1 for c in cases if not c.kind.startswith("healthy"))
    print(
        f"\nfaults: runs={len(cases)} faulty={faulty} fault_kinds={len(faults) - 1} "
        f"healthy={len(cases) - faulty} abandoned={stats['abandoned_total']} "
        f"threads_reported_by_shutdown={len(left)} own_threads_joined={len(own)}"
    )


def _fresh(case: Case, h: Hazards) -> Case:
    """A second run of the same fault, with a fresh agent (scripts are consumed)."""
    for again in population(h):
        if again.kind == case.kind:
            return again
    raise AssertionError(case.kind)


def test_runtime_serves_new_runs_while_abandoned_threads_are_still_blocked(
    hazards: Hazards,
) -> None:
    with Runtime(tools=fault_tools(hazards)) as rt:
        stuck = [
            rt.start("t", agent=ScriptedAgent([plan(call("hang")), report_results]), config=HEALTHY)
            for _ in range(4)
        ]
        for handle in stuck:
            assert handle.result(timeout=WAIT).output == [{"ok": False, "code": "timeout"}]
        assert rt.statistics()["workers_abandoned"] == 4  # still blocked, never reused
        fresh = rt.start("t", agent=healthy_case(0).agent, config=HEALTHY)
        assert fresh.result(timeout=WAIT).output == [{"ok": True, "code": None}] * 2
        hazards.release_and_join()


def test_abandoned_threads_past_the_ceiling_refuse_calls_until_they_exit(
    hazards: Hazards,
) -> None:
    """T3 bulkhead: at `max_abandoned`, new calls get a retryable resource_exhausted."""
    with Runtime(tools=fault_tools(hazards), max_abandoned=2) as rt:
        for _ in range(2):
            hung = rt.start(
                "t", agent=ScriptedAgent([plan(call("hang")), report_results]), config=HEALTHY
            )
            assert hung.result(timeout=WAIT).output == [{"ok": False, "code": "timeout"}]
        refused_agent = ScriptedAgent([plan(call("echo", text="x"))], then=report_results)
        refused = rt.start("t", agent=refused_agent, config=HEALTHY).result(timeout=WAIT)
        assert refused.output == [{"ok": False, "code": "resource_exhausted"}]
        result = refused_agent.views[1].last_results[0]
        assert result.error is not None
        assert result.error.retryable
        hazards.release_and_join()  # the abandoned workers exit and leave the count
        assert rt.statistics()["workers_abandoned"] == 0
        again = rt.start("t", agent=healthy_case(1).agent, config=HEALTHY)
        assert again.result(timeout=WAIT).output == [{"ok": True, "code": None}] * 2


def test_a_hung_hook_in_one_run_does_not_cost_another_run_its_hooks(hazards: Hazards) -> None:
    """R13 isolation: a hook that never returns is one run's hook_error, not everyone's."""
    seen: list[str] = []

    def hanging_hook(event: RunEvent) -> None:
        hazards.block("hook")

    def recording_hook(event: RunEvent) -> None:
        seen.append(event.kind.value)

    busy = Gate()  # cooperative: A's call ends when A is cancelled
    with Runtime(tools=[busy.tool("busy")], hook_timeout=0.5) as rt:
        # run A: its on_start hook hangs; A itself stays live, in a call that waits
        blocker = rt.start(
            "a",
            agent=ScriptedAgent([plan(call("busy"))]),
            config=HEALTHY,
            hooks={"on_start": hanging_hook},
        )
        busy.wait_started(1)
        assert hazards.wait_entered("hook")
        # run B: healthy, with an ordinary hook
        other = rt.start(
            "b", agent=ScriptedAgent([Finish(output="ok")]), hooks={"on_finish": recording_hook}
        )
        outcome = other.result(timeout=WAIT)
        blocker.cancel("done")
        blocker.result(timeout=WAIT)
    # shutdown gave up on A's hung hook after hook_timeout: its worker exits once released
    hazards.release_and_join()
    assert outcome.state is RunState.FINISHED
    assert [e.code.value for e in outcome.errors] == [], "B's hooks were blocked by A's"
    assert seen == ["run_ended"], "B's on_finish hook never ran"


def test_shutdown_names_every_thread_it_leaves_behind_even_the_event_loop(
    hazards: Hazards,
) -> None:
    """`shutdown()` returns the names of the threads still alive because user code never
    returned (its docstring); an `async def` tool that blocks the loop thread when cancelled
    keeps the runtime's event loop thread alive, so that name must be among them."""

    @tool(timeout=FAST)
    async def blocks_the_loop() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            hazards.block("loop")  # synchronous: the loop thread itself is stuck (T3, T10)
            raise
        return "never"

    baseline = {t.name for t in threading.enumerate()}
    rt = Runtime(tools=[blocks_the_loop])
    try:
        agent = ScriptedAgent([plan(call("blocks_the_loop")), report_results])
        outcome = rt.start("t", agent=agent, config=HEALTHY).result(timeout=WAIT)
        assert outcome.output == [{"ok": False, "code": "timeout"}]
        assert hazards.wait_entered("loop")
    finally:
        left = rt.shutdown(timeout=0.5)
    alive = {t.name for t in threading.enumerate()} - baseline
    hazards.release_and_join()
    assert alive == {"steerable-asyncio"}
    assert alive <= set(left), f"shutdown() returned {left} while {sorted(alive)} still ran"


def test_a_run_whose_worker_thread_cannot_start_fails_with_resource_exhausted(
    hazards: Hazards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: no thread for the agent's call is a typed error for that run, never a hang."""
    import pykka

    from steerable.actors._engine.pool import ToolWorker

    with Runtime(tools=fault_tools(hazards)) as rt:
        warm = rt.start("t", agent=healthy_case(0).agent, config=HEALTHY)
        assert warm.result(timeout=WAIT).state is RunState.FINISHED  # the pool's launcher is up
        for ref in pykka.ActorRegistry.get_by_class(ToolWorker):
            assert ref.stop(timeout=WAIT)  # no worker left to take the call later

        def no_thread(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", no_thread)
            agent = ScriptedAgent([plan(call("echo", text="x"))], then=report_results)
            out = rt.start("t", agent=agent, config=HEALTHY).result(timeout=WAIT)
        assert out.state is RunState.ERROR
        assert out.error is not None
        assert out.error.code is ErrorCode.RESOURCE_EXHAUSTED
        again = rt.start("t", agent=healthy_case(0).agent, config=HEALTHY)
        assert again.result(timeout=WAIT).state is RunState.FINISHED  # threads start again
