"""W1: sequential iterations of (decide -> 1 no-op tool returning a short string), then Finish.

Figures: µs per iteration at 50, 200 and 2,000 iterations (wall time from `start()` to
`result()` returning, divided by the iterations), checkpoints in memory (the default
`MemoryStore`) and, once it exists, in `SqliteStore`; flatness = µs/iter at 2,000 / at 50.
Floors: a plain Python loop calling the same decide and tool, and raw pykka: two
`ThreadingActor`s, two `ask` round trips per iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pykka

from steerable.actors import CheckpointStore, MemoryStore, Runtime, tool
from steerable.protocol import Finish, Plan, RunConfig, RunState, RunView, ToolCall

from ._common import (
    Result,
    cpu_note,
    expect,
    metric,
    not_available,
    sqlite_available,
    sqlite_store,
    temp_dir,
)

SIZES = (50, 200, 2000)


@tool
def noop() -> str:
    """Return a short string."""
    return "ok"


class LoopAgent:
    """Plans one `noop` call per decision, `n` times, then finishes. Answers instantly."""

    name = "w1"

    def __init__(self, n: int, tool_name: str = "noop") -> None:
        self.n = n
        self.calls = 0
        self._plan = Plan(steps=(ToolCall(name=tool_name),))
        self._finish = Finish(output="done")

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        return self._plan if self.calls <= self.n else self._finish


def config_for(n: int) -> RunConfig:
    """Budgets large enough for an `n`-iteration run."""
    return RunConfig(max_steps=n + 10, max_model_calls=n + 10)


def run_once(rt: Runtime, n: int, agent_factory: Callable[[int], Any] = LoopAgent) -> float:
    """One W1 run of `n` iterations; returns µs per iteration; checks the outcome."""
    agent = agent_factory(n)
    t0 = time.perf_counter()
    handle = rt.start("w1", agent=agent, config=config_for(n))
    out = handle.result(timeout=120)
    dt = time.perf_counter() - t0
    expect(out.state is RunState.FINISHED, f"W1 n={n}: ended {out.state.value}, {out.errors}")
    expect(out.metrics.steps == n, f"W1 n={n}: {out.metrics.steps} steps")
    expect(out.metrics.model_calls == n + 1, f"W1 n={n}: {out.metrics.model_calls} model calls")
    return dt / n * 1e6


def reps_for(n: int, quick: bool) -> int:
    """Repetitions per size (after one warm-up run)."""
    if quick:
        return 3
    return {50: 21, 200: 15, 2000: 7}.get(n, 5)


def _measure(store: CheckpointStore | None, quick: bool) -> Result:
    sizes = (50,) if quick else SIZES
    metrics = {}
    medians: dict[int, float] = {}
    with Runtime(store=store, tools=[noop]) as rt:
        run_once(rt, 50)  # warm-up: imports, worker threads, caches
        for n in sizes:
            samples = [run_once(rt, n) for _ in range(reps_for(n, quick))]
            metrics[f"us_per_iter_{n}"] = metric(samples, "µs/iter")
            medians[n] = sorted(samples)[len(samples) // 2]
    if 2000 in medians:
        metrics["flatness_2000_vs_50"] = metric([medians[2000] / medians[50]], "x")
    return {"metrics": metrics, "info": cpu_note()}


def case_memory(quick: bool) -> Result:
    """W1 with the default in-memory store."""
    result = _measure(None, quick)
    result["config"] = "Runtime() defaults, MemoryStore"
    return result


def case_sqlite(quick: bool) -> Result:
    """W1 with `SqliteStore` (when available)."""
    if not sqlite_available():
        return not_available("steerable.actors.SqliteStore does not exist yet")
    with temp_dir() as d:
        result = _measure(sqlite_store(d / "w1.db"), quick)
    result["config"] = "Runtime(store=SqliteStore(tmp))"
    return result


class _MemoryNoLeases(MemoryStore):
    """A `MemoryStore` without ownership: no lease is registered, claimed or checked."""

    fences = False
    register_new = CheckpointStore.register_new
    claim = CheckpointStore.claim
    renew = CheckpointStore.renew
    release_lease = CheckpointStore.release_lease


def _sqlite_no_leases(path: Path) -> CheckpointStore:
    from steerable.actors import SqliteStore

    class _SqliteNoLeases(SqliteStore):
        """A `SqliteStore` whose runs hold no lease: no write is fenced (no lease row read)."""

        fences = False
        register_new = CheckpointStore.register_new
        claim = CheckpointStore.claim
        renew = CheckpointStore.renew
        release_lease = CheckpointStore.release_lease

    return _SqliteNoLeases(path)


def _leases_overhead(on: CheckpointStore, off: CheckpointStore, quick: bool) -> Result:
    """W1 at 200 iterations, leases on and off, alternating (the same load for both)."""
    n = 50 if quick else 200
    with Runtime(store=on, tools=[noop]) as rt_on, Runtime(store=off, tools=[noop]) as rt_off:
        run_once(rt_on, 50)
        run_once(rt_off, 50)
        with_leases, without = [], []
        for _ in range(reps_for(n, quick)):
            with_leases.append(run_once(rt_on, n))
            without.append(run_once(rt_off, n))
    overhead = [(a / b - 1.0) * 100 for a, b in zip(with_leases, without, strict=True)]
    return {
        "metrics": {
            f"us_per_iter_{n}_leases_on": metric(with_leases, "µs/iter"),
            f"us_per_iter_{n}_leases_off": metric(without, "µs/iter"),
            "leases_overhead_pct": metric(overhead, "%"),
        }
    }


def case_leases_memory(quick: bool) -> Result:
    """W1 with leases on vs off, `MemoryStore` (docs/deployment.md: no cost you will notice)."""
    result = _leases_overhead(MemoryStore(), _MemoryNoLeases(), quick)
    result["config"] = "MemoryStore vs a MemoryStore without ownership, alternating"
    return result


def case_leases_sqlite(quick: bool) -> Result:
    """W1 with leases on vs off, `SqliteStore`."""
    if not sqlite_available():
        return not_available("steerable.actors.SqliteStore does not exist yet")
    with temp_dir() as d:
        result = _leases_overhead(sqlite_store(d / "on.db"), _sqlite_no_leases(d / "off.db"), quick)
    result["config"] = "SqliteStore vs a SqliteStore without ownership, alternating"
    return result


_RICH_BUILDERS = (
    "tool_started",
    "tool_retry",
    "tool_finished",
    "subagent_started",
    "subagent_finished",
    "run_ended",
)
"""The payload builders of `steerable.actors._machine.events` the thin case stubs."""


def _thin(*args: object) -> dict[str, Any]:
    return {}


@contextmanager
def thin_events() -> Iterator[None]:
    """While inside: the machine's event payloads are `{}` (kind, seq, phase and time stay),
    and `reasoning_finished` carries no decision preview: W1 without the richer events.

    A bench-only patch of private names (tests/test_event_payloads.py checks that it still
    reaches every payload W1 emits); `approval_requested` is left alone (the host reads it).
    """
    from steerable.actors._machine import events, machine

    saved = {name: getattr(events, name) for name in _RICH_BUILDERS}
    saved_preview = machine.decision_preview  # type: ignore[attr-defined]
    for name in _RICH_BUILDERS:
        setattr(events, name, _thin)
    machine.decision_preview = _thin  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        for name, builder in saved.items():
            setattr(events, name, builder)
        machine.decision_preview = saved_preview  # type: ignore[attr-defined]


def _cpu_once(rt: Runtime, n: int) -> tuple[float, float]:
    """One W1 run: (wall µs/iter, process CPU µs/iter: every thread's, waits left out)."""
    c0 = time.process_time()
    wall = run_once(rt, n)
    return wall, (time.process_time() - c0) / n * 1e6


def case_rich_events(quick: bool) -> Result:
    """W1 with the richer event payloads vs thin ones (issue 14's budget: ≤5% slower),
    alternating in one process, `MemoryStore`; CPU time beside wall time."""
    n = 50 if quick else 200
    rich_wall, rich_cpu, thin_wall, thin_cpu = [], [], [], []
    with Runtime(tools=[noop]) as rt:
        run_once(rt, 50)
        with thin_events():
            run_once(rt, 50)
        for _ in range(reps_for(n, quick)):
            wall, cpu = _cpu_once(rt, n)
            rich_wall.append(wall)
            rich_cpu.append(cpu)
            with thin_events():
                wall, cpu = _cpu_once(rt, n)
            thin_wall.append(wall)
            thin_cpu.append(cpu)
    return {
        "metrics": {
            f"us_per_iter_{n}_rich": metric(rich_wall, "µs/iter"),
            f"us_per_iter_{n}_thin": metric(thin_wall, "µs/iter"),
            f"cpu_us_per_iter_{n}_rich": metric(rich_cpu, "µs/iter"),
            f"cpu_us_per_iter_{n}_thin": metric(thin_cpu, "µs/iter"),
            "rich_events_overhead_pct": metric(
                [(a / b - 1.0) * 100 for a, b in zip(rich_wall, thin_wall, strict=True)], "%"
            ),
            "rich_events_cpu_overhead_pct": metric(
                [(a / b - 1.0) * 100 for a, b in zip(rich_cpu, thin_cpu, strict=True)], "%"
            ),
        },
        "config": "Runtime() defaults, MemoryStore; rich vs thin payloads, alternating",
    }


def case_floor_loop(quick: bool) -> Result:
    """Floor: a plain Python loop calling decide and the tool function."""
    samples: dict[int, list[float]] = {}
    for n in (50,) if quick else SIZES:
        out = []
        for _ in range(reps_for(n, quick) + 1):
            agent = LoopAgent(n)
            fn = noop.fn
            t0 = time.perf_counter()
            while True:
                decision = agent.decide(None)  # type: ignore[arg-type]
                if isinstance(decision, Finish):
                    break
                fn()
            out.append((time.perf_counter() - t0) / n * 1e6)
        samples[n] = out[1:]
    return {"metrics": {f"us_per_iter_{n}": metric(s, "µs/iter") for n, s in samples.items()}}


class _Decider(pykka.ThreadingActor):
    def __init__(self, agent: LoopAgent) -> None:
        super().__init__()
        self.agent = agent

    def on_receive(self, message: Any) -> Any:
        return self.agent.decide(message)


class _Tool(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return noop.fn()


def case_floor_pykka(quick: bool) -> Result:
    """Floor: raw pykka, two ThreadingActors, two `ask` round trips per iteration."""
    samples: dict[int, list[float]] = {}
    for n in (50,) if quick else SIZES:
        out = []
        for _ in range(reps_for(n, quick) + 1):
            agent = LoopAgent(n)
            decider = _Decider.start(agent)
            worker = _Tool.start()
            try:
                t0 = time.perf_counter()
                while True:
                    decision = decider.ask(None)
                    if isinstance(decision, Finish):
                        break
                    worker.ask("call")
                out.append((time.perf_counter() - t0) / n * 1e6)
            finally:
                decider.stop()
                worker.stop()
        samples[n] = out[1:]
    return {"metrics": {f"us_per_iter_{n}": metric(s, "µs/iter") for n, s in samples.items()}}


CASES = {
    "memory": case_memory,
    "sqlite": case_sqlite,
    "leases_memory": case_leases_memory,
    "leases_sqlite": case_leases_sqlite,
    "rich_events": case_rich_events,
    "floor_loop": case_floor_loop,
    "floor_pykka": case_floor_pykka,
}
