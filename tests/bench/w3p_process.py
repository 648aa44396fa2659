"""W3p: cancelling a process-isolated tool that never checks, and the cost of isolation.

Kill: a `@tool(isolation="process")` that ignores cancellation, either spinning in C code with
the GIL held (`sum(range(10**12))`) or in `time.sleep(3600)`; `RunConfig(cancel_grace=0.05)`,
`cancel()` once the tool reported its pid. Figures: ms from `cancel()` to `result()` returning
CANCELLED, ms from `cancel()` until the worker process is gone (exited and reaped), and whether
the call was reported `killed`. Target: both within `cancel_grace` + 50 ms.

Overhead: one run calling a no-op tool N times in a row (one call per plan), process-isolated
(warm workers) against the same no-op on a worker thread: µs per call and the difference. The
same for a Ray task when Ray is installed (`steerable[ray]`), reported without a target.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from steerable.actors import Runtime
from steerable.protocol import Finish, Plan, RunConfig, RunState, RunView, ToolCall

from ._common import Result, expect, metric, not_available

GRACE = 0.05


def _kit() -> Any:
    # The tools live in a module the workers import by name (tests/isolation_tools.py).
    from tests import isolation_tools

    return isolation_tools


class OneCallAgent:
    """Plans one call; finishes if ever called again."""

    name = "w3p"

    def __init__(self, tool_name: str, beacon: str) -> None:
        self._plan = Plan(steps=(ToolCall(name=tool_name, arguments={"beacon": beacon}),))
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        return self._plan if self.calls == 1 else Finish(output="not cancelled")


class LoopAgent:
    """Calls `tool_name` (no arguments) `n` times, one call per plan, then finishes."""

    name = "w3p-loop"

    def __init__(self, tool_name: str, n: int) -> None:
        self._plan = Plan(steps=(ToolCall(name=tool_name),))
        self.left = n

    def decide(self, view: RunView) -> Plan | Finish:
        if self.left <= 0:
            return Finish(output="done")
        self.left -= 1
        return self._plan


def _kill_once(rt: Runtime, kit: Any, beacon: Any, tool_name: str) -> tuple[float, float, bool]:
    handle = rt.start(
        "w3p", agent=OneCallAgent(tool_name, beacon.address), config=RunConfig(cancel_grace=GRACE)
    )
    pid = int(beacon.wait())
    t0 = time.perf_counter()
    handle.cancel("bench")
    out = handle.result(timeout=30)
    t1 = time.perf_counter()
    expect(kit.wait_gone(pid, 30), f"W3p: worker {pid} still alive after the kill")
    t2 = time.perf_counter()
    expect(out.state is RunState.CANCELLED, f"W3p: ended {out.state.value}, not cancelled")
    killed = out.error is not None and bool(out.error.details.get("killed"))
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3, killed


def case_kill(quick: bool) -> Result:
    """cancel -> CANCELLED and cancel -> process gone, for a C busy loop and a sleep."""
    kit = _kit()
    runs = 5 if quick else 20
    metrics: dict[str, Any] = {}
    killed_ok: list[float] = []
    with tempfile.TemporaryDirectory(prefix="w3p") as directory:
        beacon = kit.Beacon(Path(directory))
        try:
            with Runtime(tools=[kit.spinner, kit.sleeper], process_workers=2) as rt:
                for tool_name, short in (("spinner", "spin"), ("sleeper", "sleep")):
                    result_ms: list[float] = []
                    gone_ms: list[float] = []
                    for _ in range(runs):
                        r, g, killed = _kill_once(rt, kit, beacon, tool_name)
                        result_ms.append(r)
                        gone_ms.append(g)
                        killed_ok.append(1.0 if killed else 0.0)
                    metrics[f"cancel_ms_{short}"] = metric(result_ms, "ms")
                    metrics[f"gone_ms_{short}"] = metric(gone_ms, "ms")
        finally:
            beacon.close()
    expect(all(killed_ok), "W3p: a killed call was not reported killed")
    metrics["killed_reported"] = metric(killed_ok, "yes/no")
    return {"metrics": metrics, "config": f"RunConfig(cancel_grace={GRACE})"}


def _loop_us(rt: Runtime, tool_name: str, n: int) -> float:
    rt.start("warm", agent=LoopAgent(tool_name, 5)).result(timeout=60)  # workers warm
    config = RunConfig(max_steps=n + 1, max_model_calls=n + 2)
    t0 = time.perf_counter()
    out = rt.start("w3p", agent=LoopAgent(tool_name, n), config=config).result(timeout=600)
    elapsed = time.perf_counter() - t0
    expect(out.state is RunState.FINISHED, f"W3p: the {tool_name} loop ended {out.state.value}")
    return elapsed / n * 1e6


def case_overhead(quick: bool) -> Result:
    """µs per call of a no-op tool: process-isolated (warm) vs a worker thread."""
    kit = _kit()
    n = 50 if quick else 500
    rounds = 2 if quick else 5
    process: list[float] = []
    thread: list[float] = []
    with Runtime(tools=[kit.noop, kit.noop_thread], process_workers=1) as rt:
        for _ in range(rounds):
            thread.append(_loop_us(rt, "noop_thread", n))
            process.append(_loop_us(rt, "noop", n))
    overhead = [p - t for p, t in zip(process, thread, strict=True)]
    return {
        "metrics": {
            "us_per_call_process": metric(process, "µs"),
            "us_per_call_thread": metric(thread, "µs"),
            "overhead_us": metric(overhead, "µs"),
        },
        "config": f"{n} sequential calls per round, {rounds} rounds",
    }


def case_ray(quick: bool) -> Result:
    """Ray: µs per call of a no-op task, and cancel -> CANCELLED ms for a sleeping task."""
    try:
        import ray
    except ImportError:
        return not_available("Ray is not installed (steerable[ray])")
    from tests import ray_tools

    n = 10 if quick else 100
    root = str(Path(__file__).resolve().parents[2])  # the tools' module is tests.ray_tools
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": root}},
    )
    try:
        with Runtime(tools=[ray_tools.ray_noop, ray_tools.ray_sleeper]) as rt:
            per_call = [_loop_us(rt, "ray_noop", n) for _ in range(1 if quick else 3)]
            cancel_ms: list[float] = []
            for _ in range(3 if quick else 10):
                handle = rt.start(
                    "w3p",
                    agent=LoopAgent("ray_sleeper", 1),
                    config=RunConfig(cancel_grace=GRACE),
                )
                # No beacon from a Ray worker: cancel once the task had time to be scheduled.
                time.sleep(0.5)
                t0 = time.perf_counter()
                handle.cancel("bench")
                out = handle.result(timeout=60)
                cancel_ms.append((time.perf_counter() - t0) * 1e3)
                expect(out.state is RunState.CANCELLED, f"W3p ray: ended {out.state.value}")
    finally:
        ray.shutdown()
    return {
        "metrics": {
            "us_per_call_ray": metric(per_call, "µs"),
            "cancel_ms_ray": metric(cancel_ms, "ms"),
        },
        "config": f"ray.init(num_cpus=2), {n} sequential calls",
    }


CASES = {"kill": case_kill, "overhead": case_overhead, "ray": case_ray}
