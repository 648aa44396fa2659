"""`Runtime`: the facade a host embeds. It owns the shared machinery and the live runs.

One runtime holds one dispatcher (supervisors' threads), one timer thread, one worker pool
for blocking user code, a pool of `hook_workers` hook threads, one lazily started asyncio
loop, and a store. Its `RunHost` keeps its own directory of runs; it stops only what it started
(docs/pykka.md T9): it never calls `ActorRegistry.stop_all()`. Only `actors/__init__.py` and
the CLI import this module (tests/test_layers.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.aloop import AsyncRunner
from steerable.actors._engine.clock import Clock, SystemClock
from steerable.actors._engine.executor import Executor
from steerable.actors._engine.log import get_logger
from steerable.actors._engine.mux import Dispatcher
from steerable.actors._engine.pool import WorkerPool
from steerable.actors._engine.timer import TimerService
from steerable.actors._stores.replay import Replay, outcome_of, replay_of
from steerable.actors._stores.store import (
    CheckpointStore,
    Lease,
    MemoryStore,
    RevisionInfo,
    StoredRun,
)
from steerable.actors._tools.tool import Tool
from steerable.protocol import (
    AgentError,
    ApprovalRequest,
    Compatibility,
    ErrorCode,
    ForkOrigin,
    HookName,
    RunConfig,
    RunOutcome,
    RunState,
    SteerableError,
    SteeringMode,
    new_run_id,
    new_trace_id,
)
from steerable.protocol.codec import check_storable

from .cell import RunCell
from .events import EventStream
from .executors import Executors
from .factory import Agent, Hook, RunEntry, agent_name, tool_table
from .handle import RunHandle
from .host import RunHost
from .jobs import Accept
from .observing import Observability, ObservingFace
from .offload import HostIO, async_form, in_thread
from .ownership import DEFAULT_LEASE_TTL, RunOwnership
from .runtrees import RunTree, build_tree, check_compatible
from .services import Services

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["Agent", "RunTree", "Runtime", "Services", "agent_name"]

_log = get_logger("steerable.runtime")


class Runtime(ObservingFace):
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
        dispatcher = Dispatcher(threads=dispatcher_threads, name="steerable-dispatch")
        timer = TimerService(self.clock, name="steerable-timer")
        pool = WorkerPool(
            max_workers=max_workers,
            prestart=prestart_workers,
            max_abandoned=max_abandoned,
            name="ToolWorker",
        )
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

    def _cell_of(self, stored: StoredRun) -> RunCell:
        snap = stored.snapshot
        return RunCell(
            snap.run_id,
            snap.trace_id,
            snap.parent_run_id,
            self._observing.event_log(snap.trace_id),
            next_seq=max([snap.last_seq, *(m.seq for m in stored.messages)]) + 1,
        )

    def _settled(self, stored: StoredRun) -> RunHandle:
        cell = self._cell_of(stored)
        cell.revision = stored.snapshot.revision
        cell.stored.set()
        cell.settle(outcome_of(stored.snapshot))
        return RunHandle(self.directory, cell)

    def _adopted(self, lease: Lease, agent: Agent, started: float) -> RunHandle:
        """Resume a run the lease keeper claimed for adoption at monotonic `started`."""
        cell = self._cell_of(self.store.load(lease.run_id))
        self.leases.claimed(cell, lease, started)
        return self._resume_claimed(cell, agent, None, None, None, None, override=False)

    def _resume_claimed(
        self,
        cell: RunCell,
        agent: Agent,
        accept: Accept | None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None,
        compatibility: Compatibility | None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None,
        *,
        override: bool,
    ) -> RunHandle:
        """Resume a run whose lease `cell` holds; the lease is released if it cannot run."""
        run_id = cell.run_id
        try:
            self.ownership.absorb(run_id)
            # Read again under the lease: the previous owner may have written until the claim.
            stored = self.store.load(run_id)
            snap = stored.snapshot
            if snap.state.is_terminal:
                self.leases.release(run_id)
                return self._settled(stored)
            cell.next_seq = max([snap.last_seq, *(m.seq for m in stored.messages)]) + 1
            cell.revision = snap.revision
            cell.stored.set()  # the store holds it already
            entry = self._entry(cell, agent, snap.config, accept, hooks, compatibility, tools)
            check_compatible(snap, entry, compatibility, override)
            cell.state = snap.state
            self.directory.launch(entry, self._factory.restoring(entry, stored))
        except BaseException:
            self.leases.release(run_id)
            raise
        return RunHandle(self.directory, cell)

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

    # ------------------------------------------------------------------ run-addressed

    def send(
        self,
        run_id: str,
        content: str,
        mode: SteeringMode | str | None = None,
        message_id: str | None = None,
        *,
        timeout: float = 10.0,
    ) -> int:
        """Send a user message to a run wherever it lives; returns its inbox `seq`.

        A run that lives here gets `handle.send`. For a run another process owns, the
        message is stored, then this waits up to `timeout` for the owner to give it its seq;
        a run nobody holds gets it in its inbox for its next owner. `message_id` makes a
        retried send one message (for a run that does not live here: docs/durability.md).

        Raises:
            SteerableError: `not_found` (unknown run), `run_ended` (terminal run).
            ValueError: as `RunHandle.send`.
            TimeoutError: the owner did not take it within `timeout` (it stays stored).
        """
        return self.ownership.send(run_id, content, mode, message_id, timeout)

    def cancel(self, run_id: str, reason: str = "cancelled", *, timeout: float = 10.0) -> bool:
        """Cancel a run wherever it lives; False if it is terminal or already cancelling.

        Raises:
            SteerableError: `not_found` for an unknown run.
        """
        return self.ownership.cancel(run_id, reason, timeout)

    def approve(self, run_id: str, call_id: str, *, timeout: float = 10.0) -> bool:
        """Approve a pending call of a run wherever it lives; True if it settled one."""
        return self.ownership.decide(run_id, call_id, True, "", timeout)

    def deny(self, run_id: str, call_id: str, reason: str = "", *, timeout: float = 10.0) -> bool:
        """Deny a pending call of a run wherever it lives; True if it settled one."""
        return self.ownership.decide(run_id, call_id, False, reason, timeout)

    def pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        """The calls of a run (wherever it lives) waiting for a person's approval."""
        return self.ownership.pending_approvals(run_id)

    def state(self, run_id: str) -> RunState:
        """A run's state: live here, else as last stored (`not_found` if unknown)."""
        return self.ownership.state(run_id)

    def outcome(self, run_id: str, timeout: float | None = None) -> RunOutcome:
        """Wait for a run's outcome wherever it lives (following the store if elsewhere).

        Raises:
            TimeoutError: not terminal within `timeout`.
            SteerableError: `not_found`; `run_owned` if this runtime lost it to another.
        """
        return self.ownership.outcome(run_id, timeout)

    def events(self, run_id: str, start: int = 0, timeout: float | None = None) -> EventStream:
        """The events of a run that lives here, from seq `start` (as `handle.events()`).

        Raises:
            SteerableError: `not_found` for a run that does not live in this runtime (events
                are not stored yet: docs/durability.md).
        """
        return self.handle(run_id).events(start, timeout)

    def replay(self, run_id: str, revision: int | None = None) -> Replay:
        """A run's transcript and events up to `revision` (default: the latest), read-only.

        Nothing is executed: no agent, tool or hook is called (R23).
        """
        return replay_of(self.store.load(run_id, revision))

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every stored revision of a run, oldest first."""
        return self.store.revisions(run_id)

    def unfinished(self) -> list[str]:
        """Ids of stored runs that are not terminal and not live here (candidates to resume)."""
        return [
            r.run_id
            for r in self.store.runs()
            if not r.state.is_terminal and self.directory.get(r.run_id) is None
        ]

    def tree(self, run_id: str) -> RunTree:
        """A run and its subagents, recursively, each with its current state.

        Built from the store (every run checkpoints at its boundaries) and the live runs here.

        Raises:
            SteerableError: `not_found` if neither knows the run.
        """
        return build_tree(self.store, self.directory, run_id)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on a live run (active or passivated).

        Raises:
            SteerableError: code `not_found` if no live run has this id.
        """
        entry = self.directory.get(run_id)
        if entry is None:
            raise SteerableError(
                AgentError.of(ErrorCode.NOT_FOUND, f"no live run {run_id!r}", run_id=run_id)
            )
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

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, timeout: float = 5.0, *, cancel_runs: bool | None = None) -> list[str]:
        """Stop every run and every thread this runtime started.

        Args:
            timeout: Seconds to wait in all (live runs to end, workers to finish).
            cancel_runs: True cancels live runs (they end CANCELLED). False parks them: they
                stop where they stand, resumable from their last checkpoint by this or another
                process (`rt.resume`), and their handles' `result()` raises `SteerableError`
                (`run_ended`). Default: park when the store is durable (a routine deploy must
                not cancel the runs waiting for a person), cancel with an in-memory store
                (nothing could resume them).

        Returns:
            The names of threads still alive because their tool never returned (abandoned
            workers, daemon threads); everything else is gone. A second call (from any thread)
            waits until the first has finished and returns the same names.

        Raises:
            RuntimeError: Called from one of this runtime's own threads (inside a tool, a
                hook, a sync `decide` or `accept`): it cannot wait for the thread it runs on.
                Nothing is stopped; call it from the host's thread (or use `ashutdown`).
            TypeError: `timeout` is not a number. Nothing is stopped.
        """
        if self._on_own_thread():
            raise RuntimeError(
                "Runtime.shutdown() called from one of the runtime's own threads (a tool, a "
                "hook or a decide): it cannot wait for itself; nothing was stopped. Call it "
                "from the host's thread (e.g. after result() returns)."
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be seconds as a number, not {timeout!r}")
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            self._shut_down.wait()
            return list(self._left)
        try:
            self._left = self._shutdown(timeout, cancel_runs)
        finally:
            self._shut_down.set()
        return list(self._left)

    def _on_own_thread(self) -> bool:
        thread = threading.current_thread()
        services = self.services
        return (
            services.dispatcher.owns_thread(thread)
            or services.timer.owns_thread(thread)
            or services.pool.owns_thread(thread)
            or services.hook_pool.owns_thread(thread)
            or services.aloop.owns_thread(thread)
            or self._observing.feed.owns_thread(thread)
        )

    def _shutdown(self, timeout: float, cancel_runs: bool | None) -> list[str]:
        if cancel_runs is None:
            cancel_runs = not self.store.durable
        deadline = self.clock.now() + timeout
        # Operations stored from now on wait for the next owner of their run.
        self.ownership.stop_watching(timeout=max(0.1, deadline - self.clock.now()))
        self.host_io.shutdown()
        live = self.directory.entries()
        if cancel_runs:
            for entry in live:
                RunHandle(self.directory, entry.cell).cancel("runtime shutdown")
            for entry in live:
                try:
                    entry.cell.future.result(max(0.0, deadline - self.clock.now()))
                except TimeoutError:
                    _log.warning("run_not_settled_at_shutdown", run_id=entry.cell.run_id)
        for entry in self.directory.close():
            if not entry.cell.future.done():
                entry.cell.future.set_exception(_shut_down())
                entry.cell.events.close()
            ref = entry.ref
            if ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.stop(block=False)
        services = self.services
        # Hooks still pending when a run ended run after its outcome: let them finish first.
        services.hooks_draining.wait(deadline - self.clock.now())
        services.dispatcher.stop(timeout=max(0.1, deadline - self.clock.now()))
        self.ownership.stop(timeout=max(0.1, deadline - self.clock.now()))
        services.timer.stop(timeout=max(0.1, deadline - self.clock.now()))
        left = services.pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.hook_pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.aloop.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.executors.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += self._observing.close(self.clock.wall(), max(0.1, deadline - self.clock.now()))
        self.store.close()
        if left:
            _log.warning("threads_abandoned_at_shutdown", threads=left)
        return left

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
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()

    # ------------------------------------------------------------------ internals

    def _entry(
        self,
        cell: RunCell,
        agent: Agent,
        config: RunConfig,
        accept: Accept | None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None,
        compatibility: Compatibility | None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None,
    ) -> RunEntry:
        if self._closed:
            raise _shut_down()
        if tools:
            # A run's own tools: their executors must exist (Ray: installed) before it starts.
            self.services.executors.check([t for t in tools if isinstance(t, Tool)])
        return self._factory.entry(
            cell,
            agent,
            config,
            tools=self._factory.run_tools(tools),
            hooks=self._merge_hooks(hooks),
            accept=accept,
            compatibility=compatibility,
        )

    def _merge_hooks(
        self, hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None
    ) -> dict[HookName, list[Hook]]:
        with self._lock:
            merged = {name: list(cbs) for name, cbs in self._hooks.items() if cbs}
        for name, cbs in (hooks or {}).items():
            callbacks = [cbs] if callable(cbs) else list(cbs)
            merged.setdefault(HookName(name), []).extend(callbacks)
        return merged


def _optional_text(value: object, what: str) -> None:
    if value is not None:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str or None, not {type(value).__name__}")
        check_storable(value, what=what)


def _shut_down() -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.RUN_ENDED, "the runtime is shut down"))
