"""`Runtime`: the facade a host embeds. It owns the shared machinery and the live runs.

One runtime holds one dispatcher (supervisors' threads), one timer thread, one worker pool
for blocking user code, one hook worker, one lazily started asyncio loop, and a store. It
keeps its own directory of runs and stops only what it started (PYKKA.md T9): it never calls
`ActorRegistry.stop_all()`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pykka
import structlog

from steerable.protocol import (
    AgentError,
    AgentSpec,
    CapabilitySnapshot,
    Compatibility,
    ErrorCode,
    HookName,
    HostMessage,
    RunConfig,
    RunEvent,
    SteerableError,
    SteeringMode,
    new_run_id,
    new_trace_id,
)

from ._aloop import AsyncRunner
from ._cell import RunCell
from ._clock import Clock, SystemClock
from ._events import EventLog
from ._handle import RunHandle
from ._jobs import Accept
from ._machine import RunMachine
from ._mux import Dispatcher
from ._pool import WorkerPool
from ._store import CheckpointStore, MemoryStore
from ._supervisor import Begin, HostMsg, RunSupervisor
from ._timer import TimerService
from ._tool import Tool, tool

__all__ = ["Agent", "Runtime", "Services"]

_log = structlog.get_logger("steerable.runtime")

Agent = Any
"""An agent: any object with `decide(view) -> Decision` (plain or async) and optional `name`."""

Hook = Callable[[RunEvent], object]


@dataclass(slots=True)
class Services:
    """The shared machinery every supervisor of one runtime uses."""

    clock: Clock
    dispatcher: Dispatcher
    timer: TimerService
    pool: WorkerPool
    hook_pool: WorkerPool
    aloop: AsyncRunner
    store: CheckpointStore
    hook_timeout: float
    run_ended: Callable[[str], None]


@dataclass(slots=True)
class _Live:
    cell: RunCell
    ref: pykka.ActorRef[RunSupervisor]
    config: RunConfig
    children: list[str] = field(default_factory=list)


def agent_name(agent: Agent) -> str:
    """An agent's name: its `name` attribute, else its class name."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else type(agent).__name__


def _as_tool(obj: Tool[Any, Any] | Callable[..., Any]) -> Tool[Any, Any]:
    return obj if isinstance(obj, Tool) else tool(obj)


class Runtime:
    """Runs agent runs. Use as a context manager, or call `shutdown()` when done.

    Args:
        store: Where checkpoints go. Default: a `MemoryStore` (nothing survives the process).
            The runtime closes its store on shutdown.
        tools: Tools every run may call (`@tool`-decorated, or plain functions).
        agents: Agents available as subagents, by name.
        config: The default `RunConfig` of runs started without one.
        clock: The time source (a `ManualClock` in tests).
        max_workers: Most tool/decide worker threads at once. Default 256.
        prestart_workers: Workers started ahead of demand. Default 0.
        max_abandoned: Abandoned (hung) worker threads tolerated before new calls are refused
            with `resource_exhausted`. Default 64.
        dispatcher_threads: Threads that run all supervisors. Default 1.
        hook_timeout: Seconds a run waits for its hooks before giving up on them. Default 5.
        thread_stack_size: If set, calls `threading.stack_size()` with it (process-global!)
            before starting threads. Default None: the process's setting is left alone.
    """

    def __init__(
        self,
        *,
        store: CheckpointStore | None = None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] = (),
        agents: Mapping[str, Agent] | None = None,
        config: RunConfig | None = None,
        clock: Clock | None = None,
        max_workers: int = 256,
        prestart_workers: int = 0,
        max_abandoned: int = 64,
        dispatcher_threads: int = 1,
        hook_timeout: float = 5.0,
        thread_stack_size: int | None = None,
    ) -> None:
        if thread_stack_size is not None:
            threading.stack_size(thread_stack_size)
        self.clock: Clock = clock or SystemClock()
        self.store: CheckpointStore = store if store is not None else MemoryStore()
        self.tools: dict[str, Tool[Any, Any]] = {}
        for t in tools:
            wrapped = _as_tool(t)
            self.tools[wrapped.spec.name] = wrapped
        self.agents: dict[str, Agent] = dict(agents or {})
        self.config = config or RunConfig()
        self._hooks: dict[HookName, list[Hook]] = {}
        self._lock = threading.Lock()
        self._runs: dict[str, _Live] = {}
        self._closed = False
        self._runs_started = 0
        self._runs_ended = 0
        dispatcher = Dispatcher(threads=dispatcher_threads, name="steerable-dispatch")
        timer = TimerService(self.clock, name="steerable-timer")
        pool = WorkerPool(
            max_workers=max_workers,
            prestart=prestart_workers,
            max_abandoned=max_abandoned,
            name="ToolWorker",
        )
        hook_pool = WorkerPool(max_workers=1, max_abandoned=max_abandoned, name="steerable-hooks")
        self.services = Services(
            clock=self.clock,
            dispatcher=dispatcher,
            timer=timer,
            pool=pool,
            hook_pool=hook_pool,
            aloop=AsyncRunner(name="steerable-asyncio"),
            store=self.store,
            hook_timeout=hook_timeout,
            run_ended=self._run_ended,
        )
        dispatcher.start()
        timer.start()
        pool.start()

    # ------------------------------------------------------------------ configuration

    def on(self, hook: HookName | str, callback: Hook) -> Callable[[], None]:
        """Register a lifecycle hook for runs started from now on; returns an unregister.

        `callback(event)` runs on the hook worker (never on a supervisor), with the `RunEvent`
        of its moment; if it raises, the run records `hook_error` and goes on (R13).
        """
        name = HookName(hook)
        with self._lock:
            self._hooks.setdefault(name, []).append(callback)

        def unregister() -> None:
            with self._lock:
                callbacks = self._hooks.get(name, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unregister

    # ------------------------------------------------------------------ runs

    def start(
        self,
        task: str,
        *,
        agent: Agent,
        config: RunConfig | None = None,
        session_id: str | None = None,
        task_id: str | None = None,
        accept: Accept | None = None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None = None,
        compatibility: Compatibility | None = None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None = None,
    ) -> RunHandle:
        """Start a run of `agent` on `task`; returns at once with its handle.

        Args:
            task: The task text the agent sees.
            agent: The deciding object (`decide(view)`, plain or async).
            config: Limits and policies (default: the runtime's).
            session_id: The host's session id (R3), recorded on the run.
            task_id: The host's task id (R3); a new attempt at a task is a new run.
            accept: The delivery check of R9: `accept(output, view)` returns None to accept a
                Finish, or a string saying what is missing. None accepts every Finish.
            hooks: Per-run hooks by name, added to the runtime's.
            compatibility: Fingerprints compared on resume (R22).
            tools: Tools for this run only, added to (or replacing by name) the runtime's.

        Raises:
            SteerableError: code `run_ended` if the runtime is shut down.
        """
        if not callable(getattr(agent, "decide", None)):
            raise TypeError(f"agent {agent!r} has no decide(view) method")
        run_tools = dict(self.tools)
        for t in tools or ():
            wrapped = _as_tool(t)
            run_tools[wrapped.spec.name] = wrapped
        cfg = config or self.config
        run_id = new_run_id()
        trace_id = new_trace_id()
        cell = RunCell(run_id, trace_id, None, EventLog(trace_id))
        name = agent_name(agent)
        capabilities = CapabilitySnapshot.of(
            [t.spec for t in run_tools.values()],
            [AgentSpec(name=name, version=str(getattr(agent, "version", "1")))]
            + [
                AgentSpec(name=n, version=str(getattr(a, "version", "1")))
                for n, a in self.agents.items()
            ],
        )
        merged = self._merge_hooks(hooks)

        def factory(sup: RunSupervisor) -> RunMachine:
            return RunMachine(
                sup,
                run_id=run_id,
                trace_id=trace_id,
                task=task,
                agent=name,
                config=cfg,
                tools=run_tools,
                capabilities=capabilities,
                compatibility=compatibility,
                session_id=session_id,
                task_id=task_id,
                created_at=self.clock.wall(),
            )

        with self._lock:
            if self._closed:
                raise _shut_down()
            ref = RunSupervisor.start(
                services=self.services,
                cell=cell,
                machine_factory=factory,
                agent=agent,
                accept=accept,
                tools=run_tools,
                hooks=merged,
            )
            self._runs[run_id] = _Live(cell, ref, cfg)
            self._runs_started += 1
        ref.tell(Begin())
        return RunHandle(self, cell)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on a live run.

        Raises:
            SteerableError: code `not_found` if no live run has this id.
        """
        with self._lock:
            live = self._runs.get(run_id)
        if live is None:
            raise SteerableError(
                AgentError.of(ErrorCode.NOT_FOUND, f"no live run {run_id!r}", run_id=run_id)
            )
        return RunHandle(self, live.cell)

    def statistics(self) -> dict[str, int]:
        """Runtime-level metrics (R28): runs, threads, workers, timers, queue depths."""
        pool = self.services.pool.statistics()
        dispatcher = self.services.dispatcher.statistics()
        with self._lock:
            live = len(self._runs)
        return {
            "runs_active": live,
            "runs_started": self._runs_started,
            "runs_ended": self._runs_ended,
            "threads_total": threading.active_count(),
            "workers_live": pool["workers_live"],
            "workers_busy": pool["workers_busy"],
            "workers_abandoned": pool["workers_abandoned"],
            "abandoned_total": pool["abandoned_total"],
            "jobs_queued": pool["jobs_queued"],
            "dispatcher_queue_depth": dispatcher["ready_queue_depth"],
            "actors_live": dispatcher["actors_live"],
            "timers_pending": self.services.timer.statistics()["timers_pending"],
        }

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, timeout: float = 5.0, *, cancel_runs: bool = True) -> list[str]:
        """Stop every run and every thread this runtime started.

        Args:
            timeout: Seconds to wait in all (live runs to end, workers to finish).
            cancel_runs: Cancel live runs (they end CANCELLED). If False, live runs are
                stopped where they stand (resumable from their last checkpoint with a durable
                store) and their handles' `result()` raises `SteerableError` (`run_ended`).

        Returns:
            The names of threads still alive because their tool never returned (abandoned
            workers, daemon threads); everything else is gone.
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            live = list(self._runs.values())
        deadline = self.clock.now() + timeout
        if cancel_runs:
            for run in live:
                RunHandle(self, run.cell).cancel("runtime shutdown")
            for run in live:
                try:
                    run.cell.future.result(max(0.0, deadline - self.clock.now()))
                except TimeoutError:
                    _log.warning("run_not_settled_at_shutdown", run_id=run.cell.run_id)
        for run in live:
            if not run.cell.future.done():
                run.cell.future.set_exception(_shut_down())
                run.cell.events.close()
            with contextlib.suppress(pykka.ActorDeadError):
                run.ref.stop(block=False)
        services = self.services
        services.dispatcher.stop(timeout=max(0.1, deadline - self.clock.now()))
        services.timer.stop(timeout=max(0.1, deadline - self.clock.now()))
        left = services.pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.hook_pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        services.aloop.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        self.store.close()
        if left:
            _log.warning("threads_abandoned_at_shutdown", threads=left)
        return left

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ internals

    def _merge_hooks(
        self, hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None
    ) -> dict[HookName, list[Hook]]:
        with self._lock:
            merged = {name: list(cbs) for name, cbs in self._hooks.items() if cbs}
        for name, cbs in (hooks or {}).items():
            callbacks = [cbs] if callable(cbs) else list(cbs)
            merged.setdefault(HookName(name), []).extend(callbacks)
        return merged

    def _steering(self, handle: RunHandle) -> SteeringMode:
        with self._lock:
            live = self._runs.get(handle.run_id)
        return live.config.steering if live is not None else SteeringMode.QUEUE

    def _post(self, cell: RunCell, build: Callable[[int], HostMessage]) -> HostMessage:
        with self._lock:
            live = self._runs.get(cell.run_id)
        if live is None:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.RUN_ENDED, f"run {cell.run_id} is not live", run_id=cell.run_id
                )
            )
        ref = live.ref
        store = self.store

        def deliver(message: HostMessage) -> None:
            store.append_message(cell.run_id, message)  # durable before send() returns
            try:
                ref.tell(HostMsg(message))
            except pykka.ActorDeadError:
                raise SteerableError(
                    AgentError.of(
                        ErrorCode.RUN_ENDED,
                        f"run {cell.run_id} ended",
                        run_id=cell.run_id,
                    )
                ) from None

        return cell.accept(build, deliver)

    def _run_ended(self, run_id: str) -> None:
        with self._lock:
            if self._runs.pop(run_id, None) is not None:
                self._runs_ended += 1


def _shut_down() -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.RUN_ENDED, "the runtime is shut down"))
