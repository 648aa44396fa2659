"""Where W1's time goes: per-step timeline, per-thread cProfile, py-spy summaries.

python -m tests.bench.profile_w1 timeline [--iters 200] [--runs 5]
    Median µs between consecutive run events (reasoning_started -> reasoning_finished ...),
    i.e. the cost of each step of one iteration, from the events' own timestamps.
python -m tests.bench.profile_w1 cprofile [--cpu] [--iters 2000] [--runs 3] [--top 30]
    cProfile in every thread (the dispatcher, workers, main), merged; the top functions by
    own time, in µs per iteration (--cpu: per-thread CPU time, so blocking and GIL waits
    drop out). cProfile inflates small calls; compare shares, not sums.
python -m tests.bench.profile_w1 machine [--iters 2000] [--runs 5] [--profile] [--no-gc]
        [--store memory|none]
    The pure `RunMachine` driven on one thread with an in-line Effects (agent and tool
    called directly, checkpoints into a MemoryStore): the run loop's own cost per
    iteration with no thread hand-off, as wall and CPU (`time.thread_time`) time: on a
    shared machine compare the CPU column. --profile adds cProfile's top functions
    (internals: this mode follows the machine's constructor and may need updating when it
    changes); --no-gc disables the cyclic GC during the runs (GC's share is the difference);
    --store none drops each checkpoint after the machine built it (the machine's own cost).
python -m tests.bench.profile_w1 loop [--iters 2000] [--runs 5]
    Just run W1, for an external sampler:
    py-spy record --gil -r 2000 -f raw -o /tmp/w1.txt -- python -m tests.bench.profile_w1 loop
python -m tests.bench.profile_w1 spy FILE [--iters 2000] [--runs 5] [--top 30]
    Summarise a py-spy raw (collapsed) file: own and inclusive share per function.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from steerable.actors import Runtime
from steerable.protocol import EventKind

from .w1_loop import LoopAgent, config_for, noop, run_once


def timeline(iters: int, runs: int) -> None:
    """Median gap between consecutive events of the middle iterations, in µs."""
    gaps: dict[str, list[float]] = defaultdict(list)
    per_iter: list[float] = []
    with Runtime(tools=[noop]) as rt:
        run_once(rt, 50)
        for _ in range(runs):
            t0 = time.perf_counter()
            handle = rt.start("w1", agent=LoopAgent(iters), config=config_for(iters))
            handle.result(timeout=60)
            per_iter.append((time.perf_counter() - t0) / iters * 1e6)
            events = list(handle.events(timeout=5))
            # Skip the first and last 10% (start-up and finish).
            lo, hi = len(events) // 10, len(events) * 9 // 10
            for a, b in zip(events[lo:hi], events[lo + 1 : hi], strict=False):
                gaps[f"{a.kind.value} -> {b.kind.value}"].append((b.at - a.at) * 1e6)
    n_iter = statistics.median(per_iter)
    counts = {k: len(v) for k, v in gaps.items()}
    reasoning = counts.get(
        f"{EventKind.REASONING_STARTED.value} -> {EventKind.REASONING_FINISHED.value}", 1
    )
    print(f"W1 {iters} iterations x {runs} runs: {n_iter:.1f} µs/iter (median)\n")
    print(f"{'transition':<48} {'per iter':>8} {'median µs':>10} {'µs/iter':>8}")
    rows = []
    for key, values in gaps.items():
        per = len(values) / reasoning  # occurrences per iteration
        med = statistics.median(values)
        rows.append((med * per, key, per, med))
    for cost, key, per, med in sorted(rows, reverse=True):
        print(f"{key:<48} {per:>8.2f} {med:>10.1f} {cost:>8.1f}")
    total = sum(r[0] for r in rows)
    print(f"{'sum of medians (event-visible time)':<48} {'':>8} {'':>10} {total:>8.1f}")


def _profiled_threads(cpu: bool) -> tuple[list[cProfile.Profile], Any]:
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def boot(frame: Any, event: str, arg: Any) -> None:
        profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this bootstrap hook for the current thread

    threading.setprofile(boot)
    return profiles, boot


def cprofile(iters: int, runs: int, top: int, cpu: bool) -> None:
    """cProfile in every thread; top functions by own time per iteration.

    With `cpu`, each thread's profiler counts that thread's CPU time (`time.thread_time`), so
    blocking waits and waits for the GIL are left out: what remains is the work itself.
    """
    profiles, _ = _profiled_threads(cpu)
    main = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
    with Runtime(tools=[noop]) as rt:
        run_once(rt, 50)
        main.enable()
        for _ in range(runs):
            run_once(rt, iters)
        main.disable()
    threading.setprofile(None)
    stats = pstats.Stats(main)
    for p in profiles:
        stats.add(p)
    total_iters = iters * runs + 50
    everything = _top(stats, total_iters, 10**9)
    own_total = sum(row[0] for row in everything)
    clock = "CPU time (thread_time)" if cpu else "wall time"
    print(f"cProfile, {total_iters} iterations; own {clock} per iteration, all threads")
    print(f"total own time: {own_total:.1f} µs/iter")
    print(f"{'function':<72} {'calls/it':>8} {'own µs/it':>9} {'share':>6}")
    for us, nc, where in everything[:top]:
        print(f"{where[:72]:<72} {nc:>8.2f} {us:>9.2f} {us / own_total:>6.1%}")


class _InlineFx:
    """Effects applied in-line: decisions and tool calls queued for the driver loop."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.pending: list[tuple[str, Any]] = []
        self.outcome: Any = None

    def decide(self, model_call: int, view: Any, deadline: float) -> None:
        self.pending.append(("decide", (model_call, view)))

    def dispatch(self, job: Any) -> None:
        self.pending.append(("tool", job))

    def checkpoint(self, revision: int, snapshot: Any, entries_from: int, entries: Any) -> None:
        if self.store is not None:
            self.store.write_checkpoint(self.run_id, revision, snapshot, entries_from, entries)

    def settled(self, outcome: Any) -> None:
        self.outcome = outcome

    # The rest do nothing, as plain methods: a `__getattr__` that made a lambda per call
    # counted two driver calls per effect in the machine's figure.
    def emit(self, kind: Any, phase: Any, data: Any) -> None:
        pass

    def schedule(self, kind: Any, key: str, attempt: int, at: float) -> None:
        pass

    def unschedule(self, kind: Any, key: str) -> None:
        pass

    def journal(self, result: Any) -> None:
        pass

    def cancel_work(self, key: str, reason: str) -> None:
        pass

    def abandon_work(self, key: str) -> None:
        pass

    def start_child(self, job: Any) -> None:
        pass


def machine(
    iters: int, runs: int, profile: bool, top: int, *, gc_off: bool = False, store_kind: str = ""
) -> None:
    """The pure machine, on this thread, with effects applied in-line."""
    from steerable.actors import MemoryStore
    from steerable.actors._machine.machine import RunMachine
    from steerable.protocol import AgentSpec, CapabilitySnapshot

    store = None if store_kind == "none" else MemoryStore()
    tools = {"noop": noop}
    caps = CapabilitySnapshot.of([noop.spec], [AgentSpec(name="w1", version="1")])

    def one(n: int) -> tuple[float, float]:
        fx = _InlineFx(store, f"run_{n}_{time.perf_counter_ns()}")
        m = RunMachine(
            fx,
            run_id=fx.run_id,
            trace_id="trace",
            task="w1",
            agent="w1",
            config=config_for(n),
            tools=tools,
            capabilities=caps,
        )
        agent = LoopAgent(n)
        clock = time.monotonic
        t0 = time.perf_counter()
        c0 = time.thread_time()
        m.start(clock())
        while fx.pending:
            kind, item = fx.pending.pop(0)
            if kind == "decide":
                model_call, view = item
                m.decided(model_call, agent.decide(view), None, None, 0.0, clock())
            else:
                m.tool_done(item.call_id, item.attempt, noop.fn(), None, clock())
        cpu = (time.thread_time() - c0) / n * 1e6
        dt = (time.perf_counter() - t0) / n * 1e6
        if fx.outcome is None or fx.outcome.metrics.steps != n:
            raise RuntimeError(f"machine driver: run did not finish: {fx.outcome}")
        return dt, cpu

    one(50)
    prof = cProfile.Profile() if profile else None
    if gc_off:
        gc.collect()
        gc.disable()
    if prof is not None:
        prof.enable()
    try:
        samples = [one(iters) for _ in range(runs)]
    finally:
        if prof is not None:
            prof.disable()
        if gc_off:
            gc.enable()
    wall = [s[0] for s in samples]
    cpu = [s[1] for s in samples]
    where = "no store" if store is None else "MemoryStore"
    print(
        f"pure machine + {where}{', gc off' if gc_off else ''}, {iters} iterations: "
        f"{statistics.median(wall):.1f} µs/iter wall (min {min(wall):.1f}), "
        f"{statistics.median(cpu):.1f} µs/iter CPU (min {min(cpu):.1f})"
    )
    if prof is not None:
        rows = _top(pstats.Stats(prof), iters * runs, 10**9)
        # Deterministic, unlike the times: comparable however loaded the machine is.
        print(f"Python function calls per iteration: {sum(r[1] for r in rows):.1f}")
        print(f"{'function':<72} {'calls/it':>8} {'own µs/it':>9}")
        for tt, nc, where in rows[:top]:
            print(f"{where[:72]:<72} {nc:>8.2f} {tt:>9.2f}")


def _top(stats: pstats.Stats, iterations: int, top: int) -> list[tuple[float, float, str]]:
    """(own µs per iteration, calls per iteration, where) of the `top` functions by own time."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows = [
        (tt / iterations * 1e6, nc / iterations, f"{Path(f).name}:{ln}({fn})")
        for (f, ln, fn), (_cc, nc, tt, _ct, _callers) in raw.items()
    ]
    rows.sort(reverse=True)
    return rows[:top]


def loop(iters: int, runs: int) -> None:
    """Run W1 `runs` times (for an external profiler)."""
    with Runtime(tools=[noop]) as rt:
        run_once(rt, 50)
        for _ in range(runs):
            print(f"{run_once(rt, iters):.1f} µs/iter")


def spy(path: str, top: int) -> None:
    """Own and inclusive sample shares per function from a py-spy raw file."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue  # a torn sample (--nonblocking)
        count = int(count_s)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        thread = next((f for f in stack.split(";") if f.startswith("thread ")), "?")
        threads[thread] += count
        total += count
        if frames:
            own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    print(f"{total} samples")
    print("\nby thread:")
    for name, c in threads.most_common(10):
        print(f"  {c / total:6.1%}  {name}")
    print("\nown time:")
    for name, c in own.most_common(top):
        print(f"  {c / total:6.1%}  {name[:110]}")
    print("\ninclusive time:")
    for name, c in incl.most_common(top):
        print(f"  {c / total:6.1%}  {name[:110]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.profile_w1", description=__doc__)
    parser.add_argument("mode", choices=["timeline", "cprofile", "machine", "loop", "spy"])
    parser.add_argument("file", nargs="?", default="")
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--runs", type=int, default=0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--cpu", action="store_true", help="cprofile: per-thread CPU time")
    parser.add_argument("--profile", action="store_true", help="machine: add cProfile")
    parser.add_argument("--no-gc", action="store_true", help="machine: cyclic GC off")
    parser.add_argument(
        "--store", choices=["memory", "none"], default="memory", help="machine: checkpoints"
    )
    args = parser.parse_args(argv)
    if args.mode == "timeline":
        timeline(args.iters or 200, args.runs or 5)
    elif args.mode == "cprofile":
        cprofile(args.iters or 2000, args.runs or 3, args.top, args.cpu)
    elif args.mode == "machine":
        machine(
            args.iters or 2000,
            args.runs or 5,
            args.profile,
            args.top,
            gc_off=args.no_gc,
            store_kind=args.store,
        )
    elif args.mode == "loop":
        loop(args.iters or 2000, args.runs or 5)
    else:
        spy(args.file, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
