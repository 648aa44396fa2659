"""W8: 10,000 runs parked waiting for user input (AskUser).

Every run's first decision is `AskUser`; once all runs are WAITING the process's OS threads and
RSS are read (/proc/self/status). Wake: for a few runs, one at a time, ms from `send()` to the
agent being called (a timestamp inside `decide`). Then every other run is answered and must
finish. Supervisors stay in memory on the dispatcher (no passivation yet). Floor: asyncio, one
task per parked run awaiting an `asyncio.Event`, woken from another thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from steerable.actors import RunHandle, Runtime
from steerable.protocol import AskUser, Finish, RunState, RunView

from ._common import ProcSampler, Result, cpu_note, expect, metric, proc_status

WAKE_SAMPLES = 20


def runs_for(quick: bool) -> int:
    """Parked runs: 10,000 (quick: 500)."""
    return 500 if quick else 10_000


class AskingAgent:
    """Asks the user first; answers Finish once a message was delivered. Shared by all runs."""

    name = "w8"

    def __init__(self) -> None:
        self._ask = AskUser(question="which one?")
        self.woken: dict[str, float] = {}

    def decide(self, view: RunView) -> AskUser | Finish:
        if not view.delivered:
            return self._ask
        self.woken[view.run_id] = time.perf_counter()
        return Finish(output=view.delivered[0].content)


def _wait_all(
    predicate: Callable[[RunHandle], bool], handles: list[RunHandle], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not all(predicate(h) for h in handles):
        expect(time.monotonic() < deadline, "W8: runs did not all park in time")
        time.sleep(0.02)


def case_steerable(quick: bool) -> Result:
    """10,000 parked runs on one default Runtime."""
    n = runs_for(quick)
    samples = 5 if quick else WAKE_SAMPLES
    agent = AskingAgent()
    baseline = proc_status()
    with ProcSampler(0.01) as sampler, Runtime() as rt:
        t0 = time.perf_counter()
        handles: list[RunHandle] = []
        batches: list[float] = []  # seconds per 1,000 start() calls: does start() slow down?
        while len(handles) < n:
            tb = time.perf_counter()
            handles += [rt.start("w8", agent=agent) for _ in range(min(1000, n - len(handles)))]
            batches.append(time.perf_counter() - tb)
        started = time.perf_counter() - t0
        _wait_all(lambda h: h.state is RunState.WAITING, handles, 300)
        parked_s = time.perf_counter() - t0
        time.sleep(0.2)  # let idle workers settle, then read the parked process
        parked = proc_status()
        stats = rt.statistics()
        wakes = []
        for h in handles[:samples]:
            t1 = time.perf_counter()
            h.send("answer")
            out = h.result(timeout=10)
            wakes.append((agent.woken[h.run_id] - t1) * 1e3)
            expect(out.state is RunState.FINISHED, f"W8: woken run ended {out.state.value}")
        t2 = time.perf_counter()
        for h in handles[samples:]:
            h.send("answer")
        outs = [h.result(timeout=120) for h in handles[samples:]]
        answer_rest_s = time.perf_counter() - t2
    bad = [o for o in outs if o.state is not RunState.FINISHED or o.output != "answer"]
    expect(not bad, f"W8: {len(bad)} runs did not finish with the answer")
    return {
        "metrics": {
            "parked_threads": metric([parked["Threads"]], "threads"),
            "parked_rss_mb": metric([parked["VmRSS"] / 1024], "MB"),
            "wake_ms": metric(wakes, "ms"),
            "park_all_s": metric([parked_s], "s"),
        },
        "info": {
            "runs": n,
            "start_calls_s": started,
            "start_s_per_1000": [round(b, 3) for b in batches],
            "answer_rest_s": answer_rest_s,
            "peak_threads": sampler.peak_threads,
            "peak_rss_mb": sampler.peak_rss_mb,
            "rss_before_mb": baseline["VmRSS"] / 1024,
            "statistics_parked": stats,
            **cpu_note(),
        },
    }


def case_floor_asyncio(quick: bool) -> Result:
    """Floor: 10,000 asyncio tasks parked on Events; woken from the main thread."""
    n = runs_for(quick)
    samples = 5 if quick else WAKE_SAMPLES
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="floor-loop")
    thread.start()
    woken: dict[int, float] = {}
    seen = threading.Event()

    async def park(i: int, event: asyncio.Event) -> None:
        await event.wait()
        woken[i] = time.perf_counter()
        seen.set()

    async def setup() -> tuple[list[asyncio.Event], list[asyncio.Task[None]]]:
        events = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(park(i, e)) for i, e in enumerate(events)]
        await asyncio.sleep(0.05)
        return events, tasks

    try:
        t0 = time.perf_counter()
        events, tasks = asyncio.run_coroutine_threadsafe(setup(), loop).result(60)
        parked_s = time.perf_counter() - t0
        time.sleep(0.1)
        parked = proc_status()
        wakes = []
        for i in range(samples):
            seen.clear()
            t1 = time.perf_counter()
            loop.call_soon_threadsafe(events[i].set)
            expect(seen.wait(10), "W8 floor: a task did not wake")
            wakes.append((woken[i] - t1) * 1e3)

        async def finish() -> None:
            for e in events:
                e.set()
            await asyncio.gather(*tasks)

        asyncio.run_coroutine_threadsafe(finish(), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    expect(len(woken) == n, f"W8 floor: {len(woken)} of {n} tasks woke")
    return {
        "metrics": {
            "parked_threads": metric([parked["Threads"]], "threads"),
            "parked_rss_mb": metric([parked["VmRSS"] / 1024], "MB"),
            "wake_ms": metric(wakes, "ms"),
            "park_all_s": metric([parked_s], "s"),
        }
    }


CASES = {"steerable": case_steerable, "floor_asyncio": case_floor_asyncio}
