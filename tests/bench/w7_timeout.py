"""W7: timeout precision. One plan of 50 calls (all in parallel) with `step_timeout=0.1` whose tool
would take 10 s; no retries.

Lateness of each timeout result = when the supervisor recorded it (the `tool_finished` event's
`at`) minus the call's deadline (`ctx.deadline`, the runtime's monotonic clock, converted to
wall time with an offset read once). Cooperative tool: `ctx.cancel_event.wait(10)` (threads
exit); non-cooperative: `time.sleep(10)` (50 threads abandoned; one plan only). p50/p99 ms.
Floor: 50 plain threads each `Event.wait()`-ing until their own 100 ms deadline.
"""

from __future__ import annotations

import threading
import time

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    ToolCall,
)

from ._common import Result, cpu_note, expect, metric

CALLS = 50
TIMEOUT = 0.1

_deadlines: dict[str, float] = {}
_began: dict[str, float] = {}  # perf_counter() as each call's body began
_lock = threading.Lock()


@tool
def waits10(ctx: ToolContext) -> str:
    """Would take 10 s; wakes at once when its call is cancelled (by the timeout)."""
    with _lock:
        _began[ctx.call_id] = time.perf_counter()
        _deadlines[ctx.call_id] = ctx.deadline or 0.0
    ctx.cancel_event.wait(10)
    return "late"


@tool
def sleeps10(ctx: ToolContext) -> str:
    """Sleeps 10 s, never checking."""
    with _lock:
        _began[ctx.call_id] = time.perf_counter()
        _deadlines[ctx.call_id] = ctx.deadline or 0.0
    time.sleep(10)  # the workload: a tool that never checks
    return "late"


class FanOutAgent:
    """One plan of 50 calls of `tool_name`, then Finish."""

    name = "w7"

    def __init__(self, tool_name: str) -> None:
        self.calls = 0
        self._plan = Plan(steps=tuple(ToolCall(name=tool_name) for _ in range(CALLS)))

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        return self._plan if self.calls == 1 else Finish(output="ok")


CONFIG = RunConfig(
    step_timeout=TIMEOUT,
    max_parallel_tools=CALLS,
    max_steps=CALLS,
    retry=RetryPolicy(max_retries=0),
)


def _plan_once(rt: Runtime, tool_name: str) -> tuple[list[float], float, int]:
    _deadlines.clear()
    _began.clear()
    offset = time.time() - time.monotonic()
    handle = rt.start("w7", agent=FanOutAgent(tool_name), config=CONFIG)
    out = handle.result(timeout=30)
    expect(out.state is RunState.FINISHED, f"W7: ended {out.state.value}: {out.errors}")
    expect(out.metrics.steps == CALLS, f"W7: {out.metrics.steps} steps, not {CALLS}")
    expect(out.metrics.tool_errors == CALLS, f"W7: {out.metrics.tool_errors} timeouts")
    finished: dict[str, float] = {}
    for event in handle.events(timeout=5):
        call_id = str(event.data.get("call_id"))
        if event.kind is EventKind.TOOL_FINISHED:
            expect(event.data.get("error") == "timeout", f"W7: {event.data}")
            finished[call_id] = event.at
    with _lock:
        deadlines = dict(_deadlines)
        began = list(_began.values())
    expect(bool(deadlines), "W7: no tool body ran")
    # All 50 calls are dispatched by one handler with one `now`, so they share a deadline; a
    # call that timed out before a worker began it (it then never runs) has no ctx.deadline of
    # its own and takes the plan's.
    plan_deadline = min(deadlines.values())
    never_ran = sum(1 for c in finished if c not in deadlines)
    late = [(at - offset - deadlines.get(c, plan_deadline)) * 1e3 for c, at in finished.items()]
    # From the first call's body starting to the last's, as the tools saw it (not the
    # tool_started events: every event of one supervisor step carries one time).
    spread = (max(began) - min(began)) * 1e3
    expect(len(late) == CALLS, f"W7: {len(late)} timeout results seen")
    return late, spread, never_ran


def case_cooperative(quick: bool) -> Result:
    """Cooperative tool (`ctx.cancel_event.wait(10)`)."""
    late: list[float] = []
    spreads: list[float] = []
    never_ran = 0
    with Runtime(tools=[waits10]) as rt:
        _plan_once(rt, "waits10")  # warm-up: 50 workers started
        for _ in range(1 if quick else 5):
            a, b, c = _plan_once(rt, "waits10")
            late += a
            spreads.append(b)
            never_ran += c
    return {
        "metrics": {
            "lateness_ms": metric(late, "ms"),
            "dispatch_spread_ms": metric(spreads, "ms"),
        },
        "config": "step_timeout=0.1, max_parallel_tools=50, retry max_retries=0",
        "info": {"timed_out_before_starting": never_ran, **cpu_note()},
    }


def case_noncooperative(quick: bool) -> Result:
    """Non-cooperative tool (`time.sleep(10)`): one plan; its 50 threads are abandoned."""
    with Runtime(tools=[sleeps10], max_abandoned=CALLS + 10, prestart_workers=CALLS) as rt:
        late, spread, never_ran = _plan_once(rt, "sleeps10")
    return {
        "metrics": {
            "lateness_ms": metric(late, "ms"),
            "dispatch_spread_ms": metric([spread], "ms"),
        },
        "config": "one plan, Runtime(prestart_workers=50, max_abandoned=60)",
        "info": {"timed_out_before_starting": never_ran},
    }


def case_floor(quick: bool) -> Result:
    """Floor: 50 threads, each waiting on an Event until its own 100 ms deadline."""
    late: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        deadline = time.monotonic() + TIMEOUT
        threading.Event().wait(deadline - time.monotonic())
        woke = time.monotonic()
        with lock:
            late.append((woke - deadline) * 1e3)

    for rep in range(2 if quick else 6):
        if rep == 1:
            late.clear()  # the first round is a warm-up
        threads = [threading.Thread(target=one) for _ in range(CALLS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"metrics": {"lateness_ms": metric(late, "ms")}}


CASES = {
    "cooperative": case_cooperative,
    "noncooperative": case_noncooperative,
    "floor": case_floor,
}
