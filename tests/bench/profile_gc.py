"""What the cyclic collector walks and costs in W5 and W1 (docs/performance.md, "Wave 4:
GC-tracked objects, session 6").

python -m tests.bench.profile_gc [w5|w5-kept|w1] [--runs N]
    w5: W5 once on a fresh `Runtime` after a 100-run warm-up: wall, process CPU, the
        collector's CPU (`gc.callbacks`, thread CPU) per generation, collections per
        generation, and the objects the collector tracks at the end with every handle held
        (after `gc.collect()`, per run).
    w5-kept: W5 three times on one `Runtime` (its `MemoryStore` keeps the earlier runs,
        handles dropped); the figures of the third repetition, and the tracked objects kept
        before it.
    w1: tracked objects a finished W1 run of N iterations (default 2,000) keeps, by type.
Tracked-object counts do not depend on the machine's load; CPU figures do (compare runs from
the same minute).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import Counter
from typing import Any

from steerable.actors import Runtime

from .w1_loop import LoopAgent, config_for, noop
from .w5_concurrent import ITERATIONS, nap


class _GcClock:
    """The collector's thread CPU per generation, while installed."""

    def __init__(self) -> None:
        self.per_gen = [0.0, 0.0, 0.0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.per_gen[info["generation"]] += time.thread_time() - self._start

    def __enter__(self) -> _GcClock:
        self._stats = [s["collections"] for s in gc.get_stats()]
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu
        self.collections = [
            s["collections"] - before for s, before in zip(gc.get_stats(), self._stats, strict=True)
        ]

    def line(self) -> str:
        gens = ", ".join(f"{x:.3f}" for x in self.per_gen)
        return (
            f"wall {self.wall:.2f} s, process CPU {self.cpu:.2f} s, collector CPU "
            f"{sum(self.per_gen):.3f} s (gen 0/1/2: {gens}), collections {self.collections}"
        )


def _w5(rt: Runtime, runs: int) -> list[Any]:
    cfg = config_for(ITERATIONS)
    handles = [rt.start("w5", agent=LoopAgent(ITERATIONS, "nap"), config=cfg) for _ in range(runs)]
    for handle in handles:
        handle.result(timeout=120)
    return handles


def w5(runs: int) -> None:
    with Runtime(tools=[nap]) as rt:
        _w5(rt, 100)
    gc.collect()
    with Runtime(tools=[nap]) as rt:
        base = len(gc.get_objects())
        with _GcClock() as clock:
            handles = _w5(rt, runs)
        gc.collect()
        tracked = len(gc.get_objects()) - base
        print(
            f"{clock.line()}; tracked objects with the handles held: {tracked / runs:.0f} per run"
        )
        del handles


def w5_kept(runs: int) -> None:
    with Runtime(tools=[nap]) as rt:
        _w5(rt, runs)
        _w5(rt, runs)
        gc.collect()
        kept = len(gc.get_objects())
        with _GcClock() as clock:
            _w5(rt, runs)
    print(f"third repetition: {clock.line()}; tracked objects kept before it: {kept}")


def w1(iterations: int) -> None:
    with Runtime(tools=[noop]) as rt:
        rt.start("w1", agent=LoopAgent(50), config=config_for(50)).result(timeout=60)
        gc.collect()
        base = {id(o) for o in gc.get_objects()}
        handle = rt.start("w1", agent=LoopAgent(iterations), config=config_for(iterations))
        handle.result(timeout=300)
        gc.collect()
        counts = Counter(type(o).__name__ for o in gc.get_objects() if id(o) not in base)
        counts["set"] -= 1  # `base` itself
        total = sum(counts.values())
        print(f"{total} tracked objects ({total / iterations:.1f} per iteration):")
        print(", ".join(f"{name} {n}" for name, n in counts.most_common(12)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.profile_gc")
    parser.add_argument("mode", choices=["w5", "w5-kept", "w1"], nargs="?", default="w5")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.mode == "w5":
        w5(args.runs or 1000)
    elif args.mode == "w5-kept":
        w5_kept(args.runs or 1000)
    else:
        w1(args.runs or 2000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
