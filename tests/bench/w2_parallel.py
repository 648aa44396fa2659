"""W2: one plan of 100 tool calls, each blocking 50 ms.

Figures: wall ms from `start()` to `result()` (two decisions and the plan) for a sync
`time.sleep(0.05)` tool at `max_parallel_tools=100` with `Runtime(prestart_workers=100)` and with
a cold default `Runtime()`, an `async def` tool awaiting `asyncio.sleep(0.05)`, and the sync tool
at `max_parallel_tools=10`. The physical limits are 50 ms and 500 ms.
Floors: 100 plain threads, `ThreadPoolExecutor(100)` (and 10), `asyncio.gather`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

from steerable.actors import Runtime, tool
from steerable.protocol import Finish, Plan, RunConfig, RunState, RunView, ToolCall

from ._common import Result, cpu_note, expect, metric

CALLS = 100
SLEEP = 0.05


STARTED: list[float] = []
"""`perf_counter()` as each call of the current run began (list.append is atomic)."""


@tool
def block50() -> str:
    """Block the worker thread for 50 ms."""
    STARTED.append(time.perf_counter())
    time.sleep(SLEEP)  # the workload: a blocking tool
    return "ok"


@tool
async def await50() -> str:
    """Await 50 ms."""
    STARTED.append(time.perf_counter())
    await asyncio.sleep(SLEEP)
    return "ok"


class FanOutAgent:
    """One plan of `CALLS` calls of `tool_name`, then Finish."""

    name = "w2"

    def __init__(self, tool_name: str) -> None:
        self.calls = 0
        self._plan = Plan(steps=tuple(ToolCall(name=tool_name) for _ in range(CALLS)))

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        return self._plan if self.calls == 1 else Finish(output=len(view.last_results))


SPREADS: list[float] = []
"""Per run: ms from the first call's start to the 100th's, as the tools saw it (dispatch and
the GIL). Not the tool_started events: every event of one supervisor step carries one time."""


def run_once(rt: Runtime, tool_name: str, parallel: int) -> float:
    """One W2 run; returns wall ms; checks that all 100 calls ran and succeeded."""
    cfg = RunConfig(max_parallel_tools=parallel, max_steps=CALLS)
    STARTED.clear()
    t0 = time.perf_counter()
    handle = rt.start("w2", agent=FanOutAgent(tool_name), config=cfg)
    out = handle.result(timeout=60)
    ms = (time.perf_counter() - t0) * 1e3
    SPREADS.append((max(STARTED) - min(STARTED)) * 1e3 if STARTED else 0.0)
    expect(out.state is RunState.FINISHED, f"W2: ended {out.state.value}: {out.errors}")
    expect(out.metrics.steps == CALLS, f"W2: {out.metrics.steps} calls ran, not {CALLS}")
    expect(out.output == CALLS, f"W2: the agent saw {out.output} results")
    expect(out.metrics.tool_errors == 0, f"W2: {out.metrics.tool_errors} tool errors")
    return ms


def _reps(quick: bool, full: int) -> int:
    return 1 if quick else full


def case_sync_prestart(quick: bool) -> Result:
    """Sync tool, max_parallel_tools=100, Runtime(prestart_workers=100)."""
    with Runtime(tools=[block50], prestart_workers=CALLS) as rt:
        if not quick:
            run_once(rt, "block50", CALLS)  # warm-up
        SPREADS.clear()
        samples = [run_once(rt, "block50", CALLS) for _ in range(_reps(quick, 11))]
    return {
        "metrics": {
            "wall_ms": metric(samples, "ms"),
            "dispatch_spread_ms": metric(SPREADS, "ms"),
        },
        "config": "Runtime(prestart_workers=100), max_parallel_tools=100",
        "info": cpu_note(),
    }


def case_sync_cold(quick: bool) -> Result:
    """Sync tool, max_parallel_tools=100, a new default Runtime per repetition (cold pool)."""
    samples = []
    for _ in range(_reps(quick, 5)):
        with Runtime(tools=[block50]) as rt:
            samples.append(run_once(rt, "block50", CALLS))
    return {
        "metrics": {"wall_ms": metric(samples, "ms")},
        "config": "new Runtime() per run (workers started on demand), max_parallel_tools=100",
    }


def case_async(quick: bool) -> Result:
    """`async def` tool, max_parallel_tools=100."""
    with Runtime(tools=[await50]) as rt:
        run_once(rt, "await50", CALLS)  # warm-up (starts the event loop thread)
        SPREADS.clear()
        samples = [run_once(rt, "await50", CALLS) for _ in range(_reps(quick, 11))]
    return {
        "metrics": {
            "wall_ms": metric(samples, "ms"),
            "dispatch_spread_ms": metric(SPREADS, "ms"),
        },
        "config": "max_parallel_tools=100",
    }


def case_sync_10(quick: bool) -> Result:
    """Sync tool, max_parallel_tools=10."""
    with Runtime(tools=[block50]) as rt:
        samples = [run_once(rt, "block50", 10) for _ in range(_reps(quick, 3))]
    return {"metrics": {"wall_ms": metric(samples, "ms")}, "config": "max_parallel_tools=10"}


def _threads_once() -> float:
    t0 = time.perf_counter()
    threads = [threading.Thread(target=time.sleep, args=(SLEEP,)) for _ in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - t0) * 1e3


def _pool_once(workers: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        wait([pool.submit(time.sleep, SLEEP) for _ in range(CALLS)])
    return (time.perf_counter() - t0) * 1e3


def case_floors(quick: bool) -> Result:
    """Floors: 100 threads, ThreadPoolExecutor(100) and (10), asyncio.gather (running loop)."""
    reps = _reps(quick, 11)
    _threads_once()
    threads = [_threads_once() for _ in range(reps)]
    pool100 = [_pool_once(100) for _ in range(reps)]
    pool10 = [_pool_once(10) for _ in range(1 if quick else 3)]

    async def gather_once() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(asyncio.sleep(SLEEP) for _ in range(CALLS)))
        return (time.perf_counter() - t0) * 1e3

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(gather_once())
        gathered = [loop.run_until_complete(gather_once()) for _ in range(reps)]
    finally:
        loop.close()
    return {
        "metrics": {
            "threads_ms": metric(threads, "ms"),
            "pool100_ms": metric(pool100, "ms"),
            "pool10_ms": metric(pool10, "ms"),
            "gather_ms": metric(gathered, "ms"),
        }
    }


CASES = {
    "sync_prestart": case_sync_prestart,
    "sync_cold": case_sync_cold,
    "async": case_async,
    "sync_10": case_sync_10,
    "floors": case_floors,
}
