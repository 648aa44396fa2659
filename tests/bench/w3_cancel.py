"""W3: cancelling a run whose tool is running.

Cooperative: a tool that would run 10 s in 10 ms slices, waiting on `ctx.cancel_event.wait(0.01)`;
`cancel()` 100 ms after the tool started. Figures: ms from `cancel()` to `result()` returning
CANCELLED, p50 and p99 over >= 20 runs, and whether the tool had stopped when `result()`
returned. Non-cooperative: a tool in plain `time.sleep(10)`, `RunConfig(cancel_grace=0.05)`:
CANCELLED within the grace + 5 ms and the call reported abandoned. Process-isolated tools do not
exist: reported "not supported". Floor: a plain thread polling an event in 10 ms slices.
"""

from __future__ import annotations

import threading
import time

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import Finish, Plan, RunConfig, RunState, RunView, ToolCall

from ._common import Result, cpu_note, expect, metric

TOOL_START_TO_CANCEL = 0.1
GRACE = 0.05


class _Probe:
    """What the current run's tool reports: started, stopped (and when)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.stopped_at = 0.0


_probe = _Probe()


@tool
def sliced(ctx: ToolContext) -> str:
    """Work for 10 s in 10 ms slices, stopping as soon as the call is cancelled."""
    probe = _probe
    probe.started.set()
    try:
        for _ in range(1000):
            if ctx.cancel_event.wait(0.01):
                ctx.raise_if_cancelled()
        return "done"
    finally:
        probe.stopped_at = time.perf_counter()
        probe.stopped.set()


@tool
def sleeper() -> str:
    """Sleep 10 s without ever checking for cancellation."""
    probe = _probe
    probe.started.set()
    time.sleep(10)  # the workload: a tool that never checks
    probe.stopped_at = time.perf_counter()
    probe.stopped.set()
    return "done"


class OneCallAgent:
    """Plans one call of `tool_name`; finishes if ever called again."""

    name = "w3"

    def __init__(self, tool_name: str) -> None:
        self._plan = Plan(steps=(ToolCall(name=tool_name),))
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        return self._plan if self.calls == 1 else Finish(output="not cancelled")


def _cancel_once(rt: Runtime, tool_name: str, cfg: RunConfig) -> tuple[float, bool, list[str]]:
    global _probe  # noqa: PLW0603 - one probe per run, read by the module-level tools
    _probe = probe = _Probe()
    handle = rt.start("w3", agent=OneCallAgent(tool_name), config=cfg)
    expect(probe.started.wait(10), "W3: the tool never started")
    time.sleep(TOOL_START_TO_CANCEL)
    t0 = time.perf_counter()
    handle.cancel("bench")
    out = handle.result(timeout=10)
    t1 = time.perf_counter()
    stopped = probe.stopped.is_set() and probe.stopped_at <= t1
    expect(out.state is RunState.CANCELLED, f"W3: ended {out.state.value}, not cancelled")
    error = out.error
    abandoned = list(error.details.get("abandoned", [])) if error is not None else []
    return (t1 - t0) * 1e3, stopped, abandoned


def case_cooperative(quick: bool) -> Result:
    """The cooperative tool: cancel -> result ms, and whether the tool stopped."""
    runs = 5 if quick else 30
    cfg = RunConfig()
    ms: list[float] = []
    stopped: list[float] = []
    with Runtime(tools=[sliced]) as rt:
        _cancel_once(rt, "sliced", cfg)  # warm-up
        for _ in range(runs):
            t, s, abandoned = _cancel_once(rt, "sliced", cfg)
            expect(not abandoned, f"W3: a cooperative tool was abandoned: {abandoned}")
            ms.append(t)
            stopped.append(1.0 if s else 0.0)
    expect(all(stopped), "W3: a cooperative tool was still running when result() returned")
    return {
        "metrics": {"cancel_ms": metric(ms, "ms"), "tool_stopped": metric(stopped, "yes/no")},
        "info": cpu_note(),
    }


def case_noncooperative(quick: bool) -> Result:
    """A tool in `time.sleep(10)`, cancel_grace=0.05: CANCELLED after the grace, abandoned."""
    runs = 5 if quick else 20
    cfg = RunConfig(cancel_grace=GRACE)
    ms: list[float] = []
    abandoned_ok: list[float] = []
    # Every run leaves one abandoned thread sleeping out its 10 s; allow them all.
    with Runtime(tools=[sleeper], max_abandoned=runs + 10) as rt:
        for _ in range(runs):
            t, _stopped, abandoned = _cancel_once(rt, "sleeper", cfg)
            ms.append(t)
            abandoned_ok.append(1.0 if abandoned else 0.0)
    expect(all(abandoned_ok), "W3: the non-cooperative call was not reported abandoned")
    return {
        "metrics": {
            "cancel_ms": metric(ms, "ms"),
            "abandoned_reported": metric(abandoned_ok, "yes/no"),
        },
        "config": f"RunConfig(cancel_grace={GRACE})",
    }


def case_floor(quick: bool) -> Result:
    """Floor: a plain thread waiting on an event in 10 ms slices; set() -> join() ms."""
    ms = []
    for _ in range(6 if quick else 31):
        event = threading.Event()

        def work(ev: threading.Event = event) -> None:
            for _ in range(1000):
                if ev.wait(0.01):
                    return

        thread = threading.Thread(target=work)
        thread.start()
        time.sleep(TOOL_START_TO_CANCEL)
        t0 = time.perf_counter()
        event.set()
        thread.join()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"metrics": {"cancel_ms": metric(ms[1:], "ms")}}


CASES = {
    "cooperative": case_cooperative,
    "noncooperative": case_noncooperative,
    "floor": case_floor,
}
