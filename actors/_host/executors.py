"""The runtime's executors: the process pool (started on first need) and named ones (Ray).

docs/isolation.md. A tool with `isolation="process"` runs on the runtime's `ProcessPool`; a tool
with `executor="name"` on the executor the runtime was given under that name ("ray" gets a
default `RayExecutor` when none is given). Every executor a tool names is checked when the
runtime (or a run with its own tools) is built, so a missing one, or a missing Ray, is an error
there and not at the first call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.executor import Executor
from steerable.actors._tools.placement import PROCESS
from steerable.actors._tools.remote import ENTRY
from steerable.actors._tools.tool import Tool

if TYPE_CHECKING:
    from steerable.actors._engine.procpool import ProcessPool

__all__ = ["Executors"]


class Executors:
    """The executors of one runtime, by name; thread-safe."""

    def __init__(
        self,
        given: Mapping[str, Executor] | None,
        *,
        process_workers: int,
        max_processes: int,
    ) -> None:
        given = dict(given or {})
        if PROCESS in given:
            raise ValueError(
                "'process' is the runtime's own process pool; configure it with "
                "process_workers= and max_processes="
            )
        self._named: dict[str, Executor] = given
        self._process_workers = process_workers
        self._max_processes = max_processes
        self._pool: ProcessPool | None = None
        self._preload: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        for executor in given.values():
            executor.start()

    def check(self, tools: Iterable[Tool[Any, Any]]) -> None:
        """Make sure every executor these tools name exists; warm the process pool if needed.

        Raises:
            ValueError: A tool names an executor the runtime does not have.
            ImportError: A tool uses executor="ray" and Ray is not installed.
        """
        needs_pool = False
        for t in tools:
            where = t.executor
            if where is None:
                continue
            if where == PROCESS:
                needs_pool = True
                self._preload.add(t.fn.__module__)
                continue
            with self._lock:
                if where in self._named:
                    continue
                if where != "ray":
                    raise ValueError(
                        f"tool {t.name!r} runs on executor {where!r}, which this runtime does "
                        f"not have (Runtime(executors={{{where!r}: ...}}))"
                    )
                from steerable.actors._engine.rayexec import RayExecutor

                executor = RayExecutor()
                executor.start()
                self._named[where] = executor
        if needs_pool:
            self.process_pool()

    def get(self, name: str) -> Executor:
        """The executor called `name` ("process": the process pool, started on first use).

        Raises:
            KeyError: No such executor (a run's tools are checked before it starts).
        """
        if name == PROCESS:
            return self.process_pool()
        return self._named[name]

    def process_pool(self) -> ProcessPool:
        """The runtime's process pool, started on first use."""
        with self._lock:
            pool = self._pool
            if pool is None:
                if self._closed:
                    raise RuntimeError("the runtime is shut down")
                # Imported here: multiprocessing is not free, and most runtimes never need it.
                from steerable.actors._engine.procpool import ProcessPool

                modules = sorted({ENTRY.partition(":")[0], *self._preload} - {"__main__"})
                pool = self._pool = ProcessPool(
                    workers=self._process_workers,
                    max_workers=self._max_processes,
                    preload=modules,
                    name="steerable-procpool",
                )
                pool.start()
            return pool

    def statistics(self) -> dict[str, int]:
        """The process pool's counters (zeros if it never started) and the named executors'."""
        with self._lock:
            named = list(self._named.values())
        stats = self._pool_statistics()
        for executor in named:
            stats.update(executor.statistics())
        return stats

    def _pool_statistics(self) -> dict[str, int]:
        pool = self._pool
        if pool is None:
            return dict.fromkeys(
                (
                    "processes_live",
                    "processes_idle",
                    "processes_busy",
                    "process_calls_queued",
                    "process_calls",
                    "process_kills",
                    "process_crashes",
                    "processes_started",
                ),
                0,
            )
        return pool.statistics()

    def shutdown(self, timeout: float) -> list[str]:
        """Stop the process pool and every named executor; returns what is still alive."""
        with self._lock:
            self._closed = True
            pool = self._pool
            named = list(self._named.values())
        left: list[str] = []
        if pool is not None:
            left += pool.shutdown(timeout)
        for executor in named:
            left += executor.shutdown(timeout)
        return left
