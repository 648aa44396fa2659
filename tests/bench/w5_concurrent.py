"""W5: 1,000 concurrent runs, each 5 iterations of (decide -> tool sleeping 10 ms), all at once.

Figures: wall seconds from the first `start()` to the last `result()`, peak RSS (the process's
VmHWM, interpreter and imports included, as the anchors count it) and peak OS thread count
(sampled every 5 ms). Each case runs in its own process. Floors: asyncio (one task per run) and
plain threads (one thread per run).
"""

from __future__ import annotations

import asyncio
import threading
import time

from steerable.actors import Runtime, tool
from steerable.protocol import RunState

from ._common import ProcSampler, Result, cpu_note, expect, metric, proc_status
from .w1_loop import LoopAgent, config_for

ITERATIONS = 5
SLEEP = 0.01


def runs_for(quick: bool) -> int:
    """Concurrent runs: 1,000 (quick: 100)."""
    return 100 if quick else 1000


@tool
def nap() -> str:
    """Sleep 10 ms."""
    time.sleep(SLEEP)  # the workload: a blocking tool
    return "ok"


def reps_for(quick: bool) -> int:
    """Repetitions in one process (after a 100-run warm-up); peaks are over all of them."""
    return 1 if quick else 3


def _result(walls: list[float], sampler: ProcSampler, baseline_mb: float, runs: int) -> Result:
    return {
        "metrics": {
            "wall_s": metric(walls, "s"),
            "peak_rss_mb": metric([sampler.peak_rss_mb], "MB"),
            "peak_threads": metric([sampler.peak_threads], "threads"),
        },
        "info": {"runs": runs, "rss_before_mb": baseline_mb, **cpu_note()},
    }


def case_steerable(quick: bool) -> Result:
    """1,000 runs on one default Runtime (1 dispatcher thread, up to 256 workers)."""
    n = runs_for(quick)
    baseline = proc_status()["VmRSS"] / 1024
    cfg = config_for(ITERATIONS)

    def once(count: int) -> float:
        with Runtime(tools=[nap]) as rt:
            t0 = time.perf_counter()
            handles = [
                rt.start("w5", agent=LoopAgent(ITERATIONS, "nap"), config=cfg) for _ in range(count)
            ]
            outs = [h.result(timeout=120) for h in handles]
            wall = time.perf_counter() - t0
        bad = [o for o in outs if o.state is not RunState.FINISHED or o.metrics.steps != 5]
        expect(not bad, f"W5: {len(bad)} of {count} runs did not finish 5 steps: {bad[:1]}")
        return wall

    with ProcSampler() as sampler:
        if not quick:
            once(100)  # warm-up
        walls = [once(n) for _ in range(reps_for(quick))]
    result = _result(walls, sampler, baseline, n)
    result["config"] = "Runtime() defaults (max_workers=256, dispatcher_threads=1)"
    return result


def case_floor_asyncio(quick: bool) -> Result:
    """Floor: one asyncio task per run, awaiting asyncio.sleep(0.01) five times."""
    n = runs_for(quick)
    baseline = proc_status()["VmRSS"] / 1024

    async def one() -> int:
        for _ in range(ITERATIONS):
            await asyncio.sleep(SLEEP)
        return ITERATIONS

    async def main() -> list[int]:
        return await asyncio.gather(*(one() for _ in range(n)))

    walls = []
    with ProcSampler() as sampler:
        for _ in range(reps_for(quick)):
            t0 = time.perf_counter()
            done = asyncio.run(main())
            walls.append(time.perf_counter() - t0)
            expect(sum(done) == n * ITERATIONS, "W5 floor: asyncio tasks lost")
    return _result(walls, sampler, baseline, n)


def case_floor_threads(quick: bool) -> Result:
    """Floor: one thread per run, time.sleep(0.01) five times."""
    n = runs_for(quick)
    baseline = proc_status()["VmRSS"] / 1024

    def one() -> None:
        for _ in range(ITERATIONS):
            time.sleep(SLEEP)

    walls = []
    with ProcSampler() as sampler:
        for _ in range(reps_for(quick)):
            t0 = time.perf_counter()
            threads = [threading.Thread(target=one) for _ in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            walls.append(time.perf_counter() - t0)
    return _result(walls, sampler, baseline, n)


CASES = {
    "steerable": case_steerable,
    "floor_asyncio": case_floor_asyncio,
    "floor_threads": case_floor_threads,
}
