"""Where W5's time goes: CPU per thread role, GC per generation, GIL waits, worker starts.

python -m tests.bench.profile_w5 [--runs 1000] [--reps 3] [--gc on|off]
    W5 (tests/bench/w5_concurrent.py: N runs of 5 x (decide -> 10 ms tool), all started at
    once) after a 100-run warm-up, each repetition on a fresh default `Runtime`. Per
    repetition it prints:
    - wall and process CPU from the first `start()` to the last `result()`, user and system;
    - CPU per thread role (`time.thread_time` at each thread's end): the host thread's
      `start()` loop, the dispatcher, the workers (decide, tools, and the supervisors they
      handle inline), the timer;
    - the cyclic collector's CPU per thread role and generation (`gc.callbacks`, thread
      CPU, so a GIL switch inside a collection is not counted);
    - the tools' oversleep: how long after its 10 ms `time.sleep` a tool got the GIL back
      (a lower bound of the GIL waits, one per tool call);
    - worker thread starts: how many, and the wall time the submitting thread (a
      dispatcher, or a worker handling a supervisor inline) spent in them.
    `--gc off` disables the collector for the measured part (GC's share is the difference).
    On a shared machine compare figures from the same minute.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from steerable.actors import Runtime, tool
from steerable.actors._engine import pool as poolmod
from steerable.protocol import RunState

from .w1_loop import LoopAgent, config_for
from .w5_concurrent import ITERATIONS, SLEEP

_cpu: defaultdict[str, float] = defaultdict(float)
_gc_cpu: defaultdict[tuple[str, int], float] = defaultdict(float)
_gc_start: dict[int, float] = {}
_late: list[float] = []
_spawns: list[float] = []


def _role() -> str:
    name = threading.current_thread().name
    return name.rstrip("0123456789").rstrip("-") or name


@tool
def nap() -> str:
    """Sleep 10 ms; record how late the thread got the GIL back."""
    t0 = time.perf_counter()
    time.sleep(SLEEP)  # the workload: a blocking tool
    _late.append(time.perf_counter() - t0 - SLEEP)
    return "ok"


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    ident = threading.get_ident()
    if phase == "start":
        _gc_start[ident] = time.thread_time()
        return
    started = _gc_start.pop(ident, None)
    if started is not None:
        _gc_cpu[(_role(), int(info["generation"]))] += time.thread_time() - started


def _instrument() -> None:
    """Count each thread's CPU when it ends, and time worker starts (test-only patches)."""
    run = threading.Thread.run

    def counted_run(self: threading.Thread) -> None:
        try:
            run(self)
        finally:
            _cpu[_role()] += time.thread_time()

    threading.Thread.run = counted_run  # type: ignore[method-assign]
    start: Callable[..., Any] = poolmod.ToolWorker.start.__func__  # type: ignore[attr-defined]

    def timed_start(cls: type[poolmod.ToolWorker], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return start(cls, *args, **kwargs)
        finally:
            _spawns.append(time.perf_counter() - t0)

    poolmod.ToolWorker.start = classmethod(timed_start)  # type: ignore[assignment,method-assign]
    gc.callbacks.append(_on_gc)


def _once(runs: int, gc_off: bool) -> None:
    cfg = config_for(ITERATIONS)
    for table in (_cpu, _gc_cpu):
        table.clear()
    _late.clear()
    _spawns.clear()
    if gc_off:
        gc.disable()
    try:
        cpu0, wall0, times0 = time.process_time(), time.perf_counter(), _times()
        with Runtime(tools=[nap]) as rt:
            main0 = time.thread_time()
            handles = [
                rt.start("w5", agent=LoopAgent(ITERATIONS, "nap"), config=cfg) for _ in range(runs)
            ]
            start_cpu = time.thread_time() - main0
            outs = [h.result(timeout=120) for h in handles]
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            times1 = _times()
            gc_window = dict(_gc_cpu)  # collections up to the last result, not at shutdown
    finally:
        gc.enable()
    bad = [o for o in outs if o.state is not RunState.FINISHED or o.metrics.steps != ITERATIONS]
    if bad:
        raise SystemExit(f"W5: {len(bad)} runs did not finish: {bad[:1]}")
    user, system = times1[0] - times0[0], times1[1] - times0[1]
    print(f"\nwall {wall:.2f} s, process CPU {cpu:.2f} s (user {user:.2f}, system {system:.2f})")
    roles = {k: round(v, 3) for k, v in sorted(_cpu.items(), key=lambda kv: -kv[1])}
    print(
        f"  host thread's start() loop: {start_cpu:.3f} s CPU ({start_cpu / runs * 1e6:.0f} µs/run)"
    )
    print(f"  CPU of the runtime's threads by role (whole life, shutdown included): {roles}")
    gc_total = sum(gc_window.values())
    by_gen = {f"{role}/gen{gen}": round(v, 3) for (role, gen), v in sorted(gc_window.items())}
    print(f"  GC CPU {gc_total:.3f} s ({gc_total / cpu:.0%} of the process CPU): {by_gen}")
    late = sorted(_late)
    print(
        f"  tool oversleep (GIL waits) ms: p50 {late[len(late) // 2] * 1e3:.1f}, "
        f"p90 {late[len(late) * 9 // 10] * 1e3:.1f}, mean {statistics.mean(late) * 1e3:.1f}, "
        f"sum {sum(late):.1f} s over {len(late)} calls"
    )
    if _spawns:
        print(
            f"  worker starts: {len(_spawns)}, the submitting thread waited {sum(_spawns):.2f} s "
            f"in them (max {max(_spawns) * 1e3:.0f} ms)"
        )


def _times() -> tuple[float, float]:
    t = os.times()
    return t.user, t.system


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.profile_w5", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gc", choices=["on", "off"], default="on")
    args = parser.parse_args(argv)
    _instrument()
    with Runtime(tools=[nap]) as rt:  # warm-up: imports, caches, first thread starts
        cfg = config_for(ITERATIONS)
        warm = [rt.start("w5", agent=LoopAgent(ITERATIONS, "nap"), config=cfg) for _ in range(100)]
        for handle in warm:
            handle.result(timeout=60)
    del warm
    gc.collect()
    for _ in range(args.reps):
        _once(args.runs, args.gc == "off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
