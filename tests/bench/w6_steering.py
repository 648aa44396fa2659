"""W6: steering a run that is busy in a 200 ms cooperative tool.

The host sends as soon as the tool has started. Figures per mode: ms from `send()` to the agent
seeing the message (a timestamp taken inside `decide` when `view.delivered` holds it); for
"queue", also ms from the tool returning to the agent seeing the message (the boundary's cost;
the target allows 2 ms). Floors (a thread and a `queue.Queue`): the same hand-offs done by hand.
"""

from __future__ import annotations

import queue
import threading
import time

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import Finish, Plan, RunState, RunView, ToolCall

from ._common import Result, cpu_note, expect, metric

BUSY = 0.2


class _Probe:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.returned_at = 0.0
        self.seen_at = 0.0
        self.seen: tuple[str, ...] = ()


_probe = _Probe()


@tool
def busy(ctx: ToolContext) -> str:
    """Work 200 ms, stopping at once if cancelled."""
    probe = _probe
    probe.started.set()
    if ctx.cancel_event.wait(BUSY):
        probe.returned_at = time.perf_counter()
        ctx.raise_if_cancelled()
    probe.returned_at = time.perf_counter()
    return "done"


class SteeredAgent:
    """Plans one `busy` call; on the next decision records when it saw the user's message."""

    name = "w6"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        if self.calls == 1:
            return Plan(steps=(ToolCall(name="busy"),))
        if view.delivered and not _probe.seen_at:
            _probe.seen_at = time.perf_counter()
            _probe.seen = tuple(m.content for m in view.delivered)
        return Finish(output="ok")


def _steer_once(rt: Runtime, mode: str) -> tuple[float, float]:
    global _probe  # noqa: PLW0603 - one probe per run
    _probe = probe = _Probe()
    handle = rt.start("w6", agent=SteeredAgent())
    expect(probe.started.wait(10), "W6: the tool never started")
    t0 = time.perf_counter()
    handle.send("change of plan", mode=mode)
    out = handle.result(timeout=10)
    expect(out.state is RunState.FINISHED, f"W6 {mode}: ended {out.state.value}: {out.errors}")
    expect(probe.seen == ("change of plan",), f"W6 {mode}: the next decision saw {probe.seen}")
    expect(out.metrics.messages_delivered == 1, f"W6 {mode}: delivered {out.metrics}")
    return (probe.seen_at - t0) * 1e3, (probe.seen_at - probe.returned_at) * 1e3


def case_steerable(quick: bool) -> Result:
    """send(mode="queue") and send(mode="interrupt") into a run busy in a 200 ms tool."""
    runs = 3 if quick else 15
    with Runtime(tools=[busy]) as rt:
        _steer_once(rt, "interrupt")  # warm-up
        queued = [_steer_once(rt, "queue") for _ in range(runs)]
        interrupted = [_steer_once(rt, "interrupt") for _ in range(runs)]
    for send_to_seen, _ in interrupted:
        expect(send_to_seen < BUSY * 1e3, "W6 interrupt: the tool was not interrupted")
    return {
        "metrics": {
            "queue_send_to_seen_ms": metric([q[0] for q in queued], "ms"),
            "queue_boundary_ms": metric([q[1] for q in queued], "ms"),
            "interrupt_send_to_seen_ms": metric([i[0] for i in interrupted], "ms"),
        },
        "info": cpu_note(),
    }


def case_floor(quick: bool) -> Result:
    """Floor: a worker thread busy 200 ms, then reading a queue; or blocked on the queue."""
    runs = 3 if quick else 15
    queued: list[tuple[float, float]] = []
    interrupted: list[float] = []
    for _ in range(runs + 1):
        inbox: queue.Queue[str] = queue.Queue()
        started = threading.Event()
        marks: dict[str, float] = {}

        def work_then_read(
            inbox: queue.Queue[str] = inbox,
            started: threading.Event = started,
            marks: dict[str, float] = marks,
        ) -> None:
            started.set()
            threading.Event().wait(BUSY)
            marks["returned"] = time.perf_counter()
            inbox.get_nowait()
            marks["seen"] = time.perf_counter()

        thread = threading.Thread(target=work_then_read)
        thread.start()
        started.wait()
        t0 = time.perf_counter()
        inbox.put("change of plan")
        thread.join()
        queued.append(((marks["seen"] - t0) * 1e3, (marks["seen"] - marks["returned"]) * 1e3))

        def read(
            inbox: queue.Queue[str] = inbox,
            started: threading.Event = started,
            marks: dict[str, float] = marks,
        ) -> None:
            started.set()
            inbox.get(timeout=BUSY)
            marks["seen"] = time.perf_counter()

        started.clear()
        thread = threading.Thread(target=read)
        thread.start()
        started.wait()
        t0 = time.perf_counter()
        inbox.put("change of plan")
        thread.join()
        interrupted.append((marks["seen"] - t0) * 1e3)
    return {
        "metrics": {
            "queue_send_to_seen_ms": metric([q[0] for q in queued[1:]], "ms"),
            "queue_boundary_ms": metric([q[1] for q in queued[1:]], "ms"),
            "interrupt_send_to_seen_ms": metric(interrupted[1:], "ms"),
        }
    }


CASES = {"steerable": case_steerable, "floor": case_floor}
