"""`Runtime`: the facade a host embeds. It owns the shared machinery and the live runs.

One runtime holds one dispatcher (supervisors' threads), one timer thread, one worker pool
for blocking user code, a pool of `hook_workers` hook threads, one lazily started asyncio
loop, and a store. Its `RunHost` keeps its own directory of runs; it stops only what it started
(docs/pykka.md T9): it never calls `ActorRegistry.stop_all()`. Only `actors/__init__.py` and
the CLI import this module (tests/test_layers.py).

Its bases hold the rest: launching.py (entries, resuming under a lease), addressing.py
(operations on a run by id), shutdown.py, observing.py (the feed and its bridges).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.aloop import AsyncRunner
from steerable.actors._engine.clock import Clock, SystemClock
from steerable.actors._engine.executor import Executor
from steerable.actors._engine.gcpolicy import tune_gc
from steerable.actors._engine.log import get_logger
from steerable.actors._engine.mux import Dispatcher
from steerable.actors._engine.pool import WorkerPool
from steerable.actors._engine.timer import TimerService
from steerable.actors._stores.memory import MemoryStore
from steerable.actors._stores.store import CheckpointStore
from steerable.actors._tools.tool import Tool
from steerable.protocol import (
    Compatibility,
    ForkOrigin,
    HookName,
    RunConfig,
    new_run_id,
    new_trace_id,
)
from steerable.protocol.codec import check_storable

from .addressing import RunAddressing
from .cell import RunCell
from .executors import Executors
from .factory import Agent, Hook, agent_name, tool_table
from .handle import RunHandle
from .host import RunHost
from .jobs import Accept
from .launching import RunLaunching, _optional_text
from .observing import Observability, ObservingFace
from .offload import HostIO, async_form, in_thread
from .ownership import DEFAULT_LEASE_TTL, RunOwnership
from .runtrees import RunTree
from .services import Services
from .shutdown import RuntimeShutdown

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["Agent", "RunTree", "Runtime", "Services", "agent_name"]

_log = get_logger("steerable.runtime")


class Runtime(RunLaunching, RunAddressing, RuntimeShutdown, ObservingFace):
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
        hook_timeout: Seconds a run's hooks still pending at its end may take, after its
            outcome is published, before they are given up. Default 5.
        thread_stack_size: If set, calls `threading.stack_size()` with it (process-global!)
            before starting threads. Default None: the process's setting is left alone.
        passivate: Runs waiting for a person give up their supervisor and are woken by
            their next message (docs/requirements.md "Passivation"). Default True.
        hook_workers: Threads that run hooks (each run's hooks run one at a time, in order;
            a hung hook holds one thread until `hook_timeout`). Default 8.
        lease_ttl: Seconds a run's lease lasts unless renewed (every `lease_ttl / 3`, one
            pass for all runs). Another process may take a run over this long after this
            one stopped renewing (frozen; a killed process's runs are taken at once on the
            same machine). Default 5 (docs/deployment.md).
        adopt_orphans: Claim and resume stored runs nobody holds (their owner crashed, froze
            or was killed) whose agent is registered in `agents`. Default False.
        executors: Named executors for tools with `executor=name`, e.g.
            `{"ray": RayExecutor(address="auto")}`; "ray" defaults to `RayExecutor()`.
        process_workers: Warm worker processes for `isolation="process"` tools, started with
            the runtime when such a tool is registered (else on first need). Default 2.
        max_processes: Most worker processes at once; calls beyond that queue. Default 8.
        hook_workers: Threads that run hooks (each run's hooks run one at a time, in order;
            a hung hook holds one thread until `hook_timeout`). Default 8.
        tracer_provider, meter_provider: OpenTelemetry providers (extra `steerable[otel]`) for
            spans of every run and the runtime's metrics (docs/observability.md). Default none.
        capture_content: Record message and tool content on spans. Default False.

    Raises:
        ValueError: A tool names an executor the runtime does not have.
        ImportError: A tool uses `executor="ray"` and Ray (`steerable[ray]`) is not installed.
    """

    tune_gc = staticmethod(tune_gc)
    """`Runtime.tune_gc()`: an opt-in collector policy for a long-lived host, called by the
    host once after startup, never by steerable (docs/host.md "Keeping the loop free")."""

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
        passivate: bool = True,
        hook_workers: int = 8,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        adopt_orphans: bool = False,
        executors: Mapping[str, Executor] | None = None,
        process_workers: int = 2,
        max_processes: int = 8,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
    ) -> None:
        if thread_stack_size is not None:
            threading.stack_size(thread_stack_size)
        self.clock: Clock = clock or SystemClock()
        self.store: CheckpointStore = store if store is not None else MemoryStore()
        self.tools: dict[str, Tool[Any, Any]] = tool_table(tools, "Runtime(tools=...)")
        self.agents: dict[str, Agent] = dict(agents or {})
        self.config = config or RunConfig()
        self._hooks: dict[HookName, list[Hook]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._shut_down = threading.Event()
        self._left: list[str] = []
        runtime_executors = Executors(
            executors, process_workers=process_workers, max_processes=max_processes
        )
        try:
            runtime_executors.check(self.tools.values())
        except BaseException:
            runtime_executors.shutdown(1.0)
            raise
        timer = TimerService(self.clock, name="steerable-timer")
        pool = WorkerPool(
            max_workers=max_workers,
            prestart=prestart_workers,
            max_abandoned=max_abandoned,
            name="ToolWorker",
        )
        # A store's writer hands the runs it wakes to an idle worker, on which the decide a
        # stored revision releases then starts (docs/decisions/0003-writer-handoff.md).
        dispatcher = Dispatcher(threads=dispatcher_threads, name="steerable-dispatch", helpers=pool)
        hook_pool = WorkerPool(
            max_workers=hook_workers, max_abandoned=max_abandoned, name="steerable-hooks"
        )
        self._host = RunHost(
            clock=self.clock,
            dispatcher=dispatcher,
            timer=timer,
            pool=pool,
            hook_pool=hook_pool,
            aloop=AsyncRunner(name="steerable-asyncio"),
            store=self.store,
            hook_timeout=hook_timeout,
            tools=self.tools,
            agents=self.agents,
            passivate=passivate,
            executors=runtime_executors,
        )
        self.services: Services = self._host.services
        self.host_io: HostIO = self.services.host_io
        """The threads of the async face (`astart`, `handle.asend`, ...)."""
        self.directory = self._host.directory
        self._factory = self._host.factory
        self._observing = Observability(
            self.statistics,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            capture_content=capture_content,
        )
        self._factory.on_entry = self._observing.entry_made
        self.ownership = RunOwnership(
            store=self.store,
            directory=self.directory,
            host=self._host,
            wall=self.clock.wall,
            agents=self.agents,
            ttl=lease_ttl,
            adopt=adopt_orphans,
            resume=self._adopted,
        )
        self.owner = self.ownership.owner
        """This runtime's identity as a run owner (unique per process start)."""
        self.leases = self.ownership.leases
        dispatcher.start()
        timer.start()
        pool.start()

    # ------------------------------------------------------------------ configuration

    def on(self, hook: HookName | str, callback: Hook) -> Callable[[], None]:
        """Register a lifecycle hook for runs started from now on; returns an unregister.

        `callback(event)` runs on a hook worker (never on a supervisor), with the `RunEvent`
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
        trace_id: str | None = None,
        traceparent: str | None = None,
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
            trace_id, traceparent: The trace the run joins (32 hex digits, or a W3C
                `traceparent` whose span the run's span nests under).

        Raises:
            SteerableError: code `run_ended` if the runtime is shut down.
            TypeError: `task` is not a `str` (None included), `session_id` or `task_id` is
                neither a `str` nor None, `config` is not a `RunConfig`, or `agent` has no
                `decide`. Nothing is started.
            ValueError: `task`, `session_id` or `task_id` cannot be stored (text that is
                not valid Unicode, or a task larger than
                `steerable.protocol.codec.MAX_VALUE_BYTES`), or `tools` holds two different
                tools of one name, or a malformed `trace_id` or `traceparent`. Nothing is
                started.
        """
        if not isinstance(task, str):
            raise TypeError(f"task must be a str, not {type(task).__name__}")
        check_storable(task, what="the task")
        _optional_text(session_id, "session_id")
        _optional_text(task_id, "task_id")
        run_id = new_run_id()
        trace_id, observed, abandon = self._observing.begin(
            run_id, agent, self.clock.wall(), trace_id=trace_id, traceparent=traceparent
        )
        try:
            entry = self._entry(
                RunCell(run_id, trace_id, None, self._observing.event_log(trace_id, observed)),
                agent,
                config or self.config,
                accept,
                hooks,
                compatibility,
                tools,
            )
        except BaseException:
            abandon()
            raise
        self.leases.new_run(entry.cell)
        self.directory.launch(
            entry,
            self._factory.fresh(entry, task, session_id=session_id, task_id=task_id),
        )
        return RunHandle(self.directory, entry.cell)

    def resume(
        self,
        run_id: str,
        *,
        agent: Agent,
        accept: Accept | None = None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None = None,
        compatibility: Compatibility | None = None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None = None,
        override: bool = False,
    ) -> RunHandle:
        """Continue a stored run (e.g. in a new process): same run id, revision + 1 (R3, R21).

        Before resuming, the checkpoint's capability snapshot (tools with their schemas and
        side effects, agents) and the host's fingerprints are compared with this runtime's
        (R22). Calls without a recorded result are re-dispatched with their original
        idempotency key when that is safe; other writes give the agent `side_effect_unknown`.
        A run that is already terminal gets a handle whose `result()` is its outcome.

        Args:
            run_id: The run to resume.
            agent: The agent that continues it.
            accept: The delivery check (R9).
            hooks: Per-run hooks, added to the runtime's.
            compatibility: The host's fingerprints now; compared with the checkpoint's.
            tools: Extra tools for this run.
            override: Resume even if the comparison finds differences (they are logged).

        Raises:
            SteerableError: `not_found`, `checkpoint_corrupt`, `checkpoint_incompatible` (a
                newer format, or different host fingerprints), `capability_mismatch`.
        """
        live = self.directory.get(run_id)
        if live is not None:
            return RunHandle(self.directory, live.cell)
        stored = self.store.load(run_id)
        if stored.snapshot.state.is_terminal:
            return self._settled(stored)
        cell = self._cell_of(stored)
        self.leases.claim(cell)  # run_owned if another live runtime holds it
        return self._resume_claimed(
            cell, agent, accept, hooks, compatibility, tools, override=override
        )

    def fork(
        self,
        run_id: str,
        revision: int | None = None,
        *,
        agent: Agent,
        config: RunConfig | None = None,
        accept: Accept | None = None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None = None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None = None,
    ) -> RunHandle:
        """Start a new run from a revision of another (time travel, R23).

        The fork has a new run id, records `forked_from`, keeps the origin's transcript and
        counters, and gives calls without a result new idempotency keys: re-executing a side
        effect is an explicit new write. Approvals are not carried over.

        Raises:
            SteerableError: `not_found` for an unknown run or revision.
        """
        stored = self.store.load(run_id, revision)
        snap = stored.snapshot
        new_id = new_run_id()
        trace_id = new_trace_id()
        entry = self._entry(
            RunCell(new_id, trace_id, None, self._observing.event_log(trace_id)),
            agent,
            config or snap.config,
            accept,
            hooks,
            None,
            tools,
        )
        origin = ForkOrigin(run_id=run_id, revision=snap.revision)
        self.leases.new_run(entry.cell)
        self.directory.launch(entry, self._factory.restoring(entry, stored, fork=origin))
        return RunHandle(self.directory, entry.cell)

    def statistics(self) -> dict[str, int]:
        """Runtime-level metrics (R28): runs, threads, workers, timers, queue depths."""
        pool = self.services.pool.statistics()
        dispatcher = self.services.dispatcher.statistics()
        active, passivated = self.directory.counts()
        return {
            "runs_active": active,
            "runs_passivated": passivated,
            "runs_started": self.directory.started,
            "runs_ended": self.directory.ended,
            "runs_woken": self.directory.wakes,
            "threads_total": threading.active_count(),
            "workers_live": pool["workers_live"],
            "workers_busy": pool["workers_busy"],
            "workers_abandoned": pool["workers_abandoned"],
            "abandoned_total": pool["abandoned_total"],
            "jobs_queued": pool["jobs_queued"],
            "dispatcher_queue_depth": dispatcher["ready_queue_depth"],
            "inbox_depth_total": dispatcher["inbox_depth_total"],
            "inbox_depth_max": dispatcher["inbox_depth_max"],
            "actors_live": dispatcher["actors_live"],
            **self.services.executors.statistics(),
            "timers_pending": self.services.timer.statistics()["timers_pending"],
            **self._observing.feed.statistics(),
        }

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ async face

    astart = async_form(start, lambda rt: rt.host_io)
    aresume = async_form(resume, lambda rt: rt.host_io)
    afork = async_form(fork, lambda rt: rt.host_io)

    async def ashutdown(
        self, timeout: float = 5.0, *, cancel_runs: bool | None = None
    ) -> list[str]:
        """`shutdown`, awaitable: the joins happen on a thread of their own, off the loop."""
        return await in_thread(
            lambda: self.shutdown(timeout, cancel_runs=cancel_runs), "steerable-shutdown"
        )

    async def __aenter__(self) -> Runtime:
        # The host's startup: the loop will not wait for a host thread to start while it serves.
        self.host_io.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()
