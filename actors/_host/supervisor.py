"""`RunSupervisor`: the actor that owns one run. A thin shell around the pure `RunMachine`.

It never blocks and never runs user code (docs/pykka.md T2): `decide`, tools and hooks run on
worker threads or the runtime's event loop and report back with `tell`; timers are messages
from the runtime's timer thread. Supervisors own no thread: they are multiplexed on the
runtime's dispatcher (docs/pykka.md, last section), which makes "never block" load-bearing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.base import SteerableActor
from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.log import get_logger
from steerable.actors._engine.mux import MuxActor, tell_now
from steerable.actors._machine.effects import CallJob, ChildJob, TimerKind
from steerable.actors._machine.machine import MODEL_KEY, RunMachine
from steerable.actors._machine.preview import preview
from steerable.actors._tools.tool import Tool, ToolContext
from steerable.protocol import (
    HOOK_EVENTS,
    AgentError,
    ApprovalRequest,
    ErrorCode,
    EventKind,
    HookName,
    Phase,
    RunEvent,
    RunOutcome,
    RunState,
    RunView,
    SideEffect,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)

from .jobs import Accept, Decided, DecideJob, HookDone, HookJob, ToolDone, ToolJob
from .live import LiveEvent, ModelCallContext
from .messages import (
    Begin,
    CancelNow,
    ChildDone,
    HostMsg,
    LeaseLost,
    LeaseRenewed,
    Stored,
    StoreFailed,
    TimerFired,
    lease_lost_error,
)

if TYPE_CHECKING:
    from .cell import RunCell
    from .services import Services

__all__ = ["RunSupervisor"]

_log = get_logger("steerable.supervisor")


@dataclass(slots=True)
class _Work:
    job: DecideJob | ToolJob
    scope: CancelScope
    attempt: int
    handle: Any = None  # AsyncHandle for async work, RemoteHandle for remote work
    remote: bool = False  # runs on an executor (a worker process, a Ray task): killable


class RunSupervisor(SteerableActor, MuxActor):
    """Owns one run: its machine, its in-flight work, its timers and its hooks.

    Created by the `Runtime`; hosts talk to it only through a `RunHandle`.
    """

    def __init__(
        self,
        *,
        services: Services,
        cell: RunCell,
        machine_factory: Callable[[RunSupervisor], RunMachine],
        agent: Any,
        accept: Accept | None,
        tools: Mapping[str, Tool[Any, Any]],
        hooks: Mapping[HookName, Sequence[Callable[[RunEvent], object]]],
    ) -> None:
        super().__init__(dispatcher=services.dispatcher)
        self.services = services
        self.cell = cell
        self.agent = agent
        self.accept = accept
        self.tools = tools
        self.hooks = hooks
        self._async_decide = inspect.iscoroutinefunction(getattr(agent, "decide", None))
        self._work: dict[str, _Work] = {}
        self._children: dict[str, str] = {}  # call id -> child run id, while it runs
        # The latest revision the store holds: a restored run came from it.
        self._stored = cell.revision
        self._held: list[tuple[int, CallJob]] = []  # writes waiting for their checkpoint
        self._durable = services.store.durable
        # A model call waiting for the run's previous checkpoint: (revision needed, args).
        self._held_decide: tuple[int, tuple[int, RunView, float]] | None = None
        # The run_ended event of a terminal state whose checkpoint is not stored yet.
        self._ended: tuple[Phase | None, dict[str, Any]] | None = None
        self._store_error: AgentError | None = None  # the store gave up a write of this run
        self._final_state: RunState | None = None  # what the host sees instead of the machine's
        self._timers: dict[tuple[TimerKind, str], Any] = {}
        self._hooks_pending = 0
        self._wall = services.clock.wall()
        self._hook_jobs: list[HookJob] = []
        self._outcome: RunOutcome | None = None
        self._fenced = False
        self._published = False  # the outcome is settled; hooks still pending run after it
        self._draining = False  # counted in services.hooks_draining until its hooks are done

        self.machine = machine_factory(self)

    @property
    def _log(self) -> Any:
        # Bound on use: binding a structlog logger costs tens of microseconds, and most runs
        # never log (T12: the run's ids travel with every line it does log).
        return _log.bind(run_id=self.cell.run_id, trace_id=self.cell.trace_id)

    # ------------------------------------------------------------------ inbox

    def handle(self, message: object) -> object:
        """Apply one message to the machine, then publish the state the host reads."""
        if self._fenced:  # fenced out: nothing more reaches the machine
            return None
        clock = self.services.clock
        now = clock.now()
        # One wall-clock reading per message: every event of one step carries the same time.
        self._wall = clock.wall()
        handler = _HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message, now)
        machine = self.machine
        self.cell.state = machine.state if self._final_state is None else self._final_state
        if (
            machine.parked
            and not self._hooks_pending
            and not self._work
            and self._stored >= machine.revision  # a passivated run lives in its checkpoint
        ):
            self.services.host.park(self)
        return None

    def _on_tool_done(self, message: ToolDone, now: float) -> None:
        work = self._work.get(message.call_id)
        if work is not None and work.attempt == message.attempt:
            del self._work[message.call_id]
            work.scope.detach()
        self.machine.tool_done(message.call_id, message.attempt, message.value, message.error, now)

    def _on_decided(self, message: Decided, now: float) -> None:
        work = self._work.pop(MODEL_KEY, None)
        if work is not None:
            work.scope.detach()
        if message.accept_error is not None:
            self.machine.record_error(message.accept_error)
        self.machine.decided(
            message.model_call,
            message.decision,
            message.verdict,
            message.error,
            message.elapsed,
            now,
        )

    def _on_timer(self, message: TimerFired, now: float) -> None:
        self._timers.pop((message.kind, message.key), None)
        if message.kind is TimerKind.GRACE and message.key == "hooks":
            self._hooks_timed_out()
        else:
            self.machine.timer(message.kind, message.key, message.attempt, now)

    def _on_host(self, message: HostMsg, now: float) -> None:
        self.machine.host(message.message, now)

    def _on_cancel_now(self, message: CancelNow, now: float) -> None:
        self.machine.cancel_now(message.reason, now)

    def _on_lease_lost(self, message: LeaseLost, now: float) -> None:
        """Another runtime owns the run: stop at once, start nothing, write nothing.

        The store keeps the state the new owner continues from; this process only tells its
        host (a `lease_lost` event, and `result()` raises `run_owned`).
        """
        self._fenced = True
        cell = self.cell
        self._log.warning("run_fenced_out", epoch=cell.epoch)
        self._held.clear()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        children, self._children = list(self._children.values()), {}
        for child in children:  # fenced with their parent: they must not write either
            self.services.host.lease_lost(child)
        for key in list(self._work):
            self.abandon_work(key)
        cell.scope.cancel("lease lost")
        cell.events.append(
            cell.run_id,
            EventKind.LEASE_LOST,
            None,
            self._wall,
            {"epoch": cell.epoch},
            cell.parent_run_id,
        )
        cell.close_approvals()
        self.services.host.run_ended(cell.run_id)
        if not cell.future.done():
            cell.future.set_exception(lease_lost_error(cell.run_id, cell.epoch))
        if cell.owns_events:
            cell.events.close()
        self.actor_ref.stop(block=False)

    def _on_lease_renewed(self, message: LeaseRenewed, now: float) -> None:
        self._on_stored(Stored(self._stored), now)

    def _on_child_done(self, message: ChildDone, now: float) -> None:
        if self._children.pop(message.call_id, None) is not None:
            self.machine.child_done(message.call_id, message.outcome, now)

    def _on_live(self, message: LiveEvent, now: float) -> None:
        # Only while its call is in flight: a cancelled stream's late deltas, or an abandoned
        # tool's progress, must not follow the events of what came after.
        if message.call_id is not None:
            if message.call_id not in self._work:
                return
            phase = Phase.EXECUTE
        else:
            if message.model_call != self.machine.model_in_flight:
                return
            phase = Phase.REASON
        cell = self.cell
        data = {"live": True, **message.data}
        cell.events.append(cell.run_id, message.kind, phase, self._wall, data,
                           cell.parent_run_id)  # fmt: skip

    def _on_hook_done(self, message: HookDone, now: float) -> None:
        self._hook_done(message.errors)

    def _on_begin(self, message: Begin, now: float) -> None:
        if message.resume:
            self.machine.resume(now, message.messages, wake=message.wake)
        else:
            self.machine.start(now)

    def on_handler_error(self, message: object, exc: BaseException) -> None:
        """A defect in steerable itself: record it and end the run in ERROR (R6)."""
        self._log.error("supervisor_defect", message=type(message).__name__, exc_info=exc)
        error = AgentError.of(
            ErrorCode.INTERNAL_ERROR,
            f"steerable defect while handling {type(message).__name__}: "
            f"{type(exc).__name__}: {exc}",
        )
        try:
            if not self.machine.is_terminal:
                self.machine.abort(error)
            self.cell.state = self.machine.state
        except BaseException as again:  # noqa: BLE001 - last resort: settle the host's future
            self._log.error("supervisor_abort_failed", exc_info=again)
            self.outcome_published(self.cell.fail(error))

    def stopping(self) -> None:
        """On stop: cancel timers; in-flight work of a live run is abandoned."""
        self._held_decide = None
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._draining:  # stopped by the runtime's shutdown before its hooks were done
            self._draining = False
            self.services.hooks_draining.leave()
        for key in list(self._work):
            self.abandon_work(key)

    # ------------------------------------------------------------------ Effects port

    def decide(self, model_call: int, view: RunView, deadline: float) -> None:
        """Run the agent's decide on a worker (or the event loop for `async def decide`).

        With a durable store, the model call after a safe boundary starts only once the
        checkpoint before that boundary is stored: a run never gets more than one boundary
        ahead of its store (a store that retries a write holds its runs back; one that gives
        it up ends them in ERROR `store_unavailable`).
        """
        needed = self.cell.revision - 1
        if self._durable and self._stored < needed:
            self._held_decide = (needed, (model_call, view, deadline))
            return
        self._start_decide(model_call, view, deadline)

    def _start_decide(self, model_call: int, view: RunView, deadline: float) -> None:
        scope = self.cell.scope.child(deadline)
        view = dataclasses.replace(view, call=ModelCallContext(model_call, scope, self.actor_ref))
        job = DecideJob(
            self.agent, view, self.accept, self.actor_ref, model_call, self.services.clock
        )
        work = _Work(job, scope, model_call)
        self._work[MODEL_KEY] = work
        if self._async_decide:
            started = self.services.clock.now()
            handle = work.handle = self.services.aloop.submit(
                job.coroutine, lambda value, exc: job.report(started, value, exc)
            )
            # A cancel or an interrupt reaches the coroutine at once: its HTTP request is
            # closed (the provider stops billing) instead of running on until abandoned.
            scope.on_cancel(lambda _reason: handle.cancel())
        elif not self.services.pool.submit(job):
            job.report(self.services.clock.now(), None, RuntimeError("the runtime is shut down"))

    def dispatch(self, job: CallJob) -> None:
        """Run one tool call attempt on a worker, or on the event loop for `async def` tools.

        Write-ahead (R4, R21): a call with side effects starts only once the checkpoint that
        holds its idempotency key is stored, so a crash can never leave a write whose key no
        checkpoint knows. Side-effect-free calls start at once.
        """
        tool = self.tools[job.tool]
        if tool.spec.side_effect is not SideEffect.NONE and self._stored < self.cell.revision:
            self._held.append((self.cell.revision, job))
            return
        self._start_call(tool, job)

    def _on_stored(self, message: Stored, now: float) -> None:
        self._stored = max(self._stored, message.revision)
        held, self._held = self._held, []
        for revision, job in held:
            if revision <= self._stored:
                self._start_call(self.tools[job.tool], job)
            else:
                self._held.append((revision, job))
        if self._held_decide is not None and self._held_decide[0] <= self._stored:
            args = self._held_decide[1]
            self._held_decide = None
            self._start_decide(*args)
        if self._ended is not None and self._stored >= self.cell.revision:
            phase, data = self._ended
            self._ended = None
            self._emit(EventKind.RUN_ENDED, phase, data)
            self._finish()

    def _on_store_failed(self, message: StoreFailed, now: float) -> None:
        """The store gave up a write: the run cannot go on without losing what it does.

        It ends in ERROR `store_unavailable` (at once: its work is abandoned), and writes
        nothing more; the store keeps the run's last stored revision, which a later
        `resume()` continues from. A terminal state whose checkpoint was not stored is
        reported as that error, never as the state the store does not hold.
        """
        if self._store_error is not None:
            return
        cause = message.error
        what = "a journal entry" if message.revision < 0 else f"revision {message.revision}"
        error = AgentError.of(
            cause.code,  # store_unavailable; internal_error for a write the codec refused
            f"the store could not keep {what} of run {self.cell.run_id}: {cause.message}",
            **{
                **cause.details,
                "run_id": self.cell.run_id,
                "revision": message.revision,
                "stored_revision": self._stored,
            },
        )
        self._store_error = error
        self._log.error("store_unavailable", revision=message.revision, error=cause.message)
        machine = self.machine
        if not machine.is_terminal:
            machine.abort(error)
            return
        outcome = self._outcome
        if self._ended is None or outcome is None:
            return  # its terminal revision was stored: this was a late journal entry
        self._ended = None
        self._outcome = outcome.model_copy(
            update={
                "state": RunState.ERROR,
                "output": None,
                "errors": (*outcome.errors, error),
                "revision": self._stored,
            }
        )
        self._final_state = self.cell.state = RunState.ERROR
        self._emit(EventKind.ERROR, None, {"code": error.code.value, "message": error.message})
        self._emit(
            EventKind.RUN_ENDED,
            None,
            {
                "state": RunState.ERROR.value,
                "error": error.code.value,
                "message": preview(error.message),
                "output": None,
                "revision": self._stored,
            },
        )
        self._finish()

    def _release_held(self, key: str, error: AgentError | None) -> bool:
        """Drop a call still waiting for its checkpoint; report `error` for it if given."""
        for index, (_, job) in enumerate(self._held):
            if job.call_id == key:
                del self._held[index]
                if error is not None:
                    self.actor_ref.tell(ToolDone(job.call_id, job.attempt, None, error))
                return True
        return False

    def _tool_emitter(self, call_id: str) -> Callable[[str, dict[str, Any], bool], None]:
        """`ToolContext.emit` of one call: a `LiveEvent` told to this supervisor."""
        ref = self.actor_ref

        def emit(name: str, data: dict[str, Any], live: bool) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                tell_now(ref, LiveEvent(EventKind.CUSTOM, {**data, "live": live}, call_id=call_id))

        return emit

    def _start_call(self, tool: Tool[Any, Any], job: CallJob) -> None:
        services = self.services
        cell = self.cell
        if time.monotonic() >= cell.lease_deadline:
            # Past the lease's sure deadline (a frozen process, a starved renewer): no tool
            # starts until a renewal says the run is still ours (docs/durability.md).
            self._held.append((-1, job))
            cell.lease_wait = True
            services.host.poke_leases()
            return
        scope = self.cell.scope.child(job.deadline)
        ctx = ToolContext(
            run_id=self.cell.run_id,
            trace_id=self.cell.trace_id,
            call_id=job.call_id,
            tool=job.tool,
            idempotency_key=job.idempotency_key,
            attempt=job.attempt,
            deadline=job.deadline,
            scope=scope,
            now=services.clock.now,
            emit=self._tool_emitter(job.call_id),
        )
        tool_job = ToolJob(tool, job.arguments, ctx, self.actor_ref)
        work = _Work(tool_job, scope, job.attempt)
        self._work[job.call_id] = work
        if tool.executor is not None:
            work.remote = True
            work.handle = tool_job.submit_remote(services.executors.get(tool.executor))
        elif tool.is_async:
            work.handle = services.aloop.submit(tool_job.coroutine, tool_job.report)
        elif services.pool.is_saturated_by_abandoned():
            abandoned = services.pool.statistics()["workers_abandoned"]
            self.actor_ref.tell(
                ToolDone(
                    job.call_id,
                    job.attempt,
                    None,
                    AgentError.of(
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"too many abandoned tool threads ({abandoned}); refusing new calls",
                        abandoned=abandoned,
                        tool=job.tool,
                        call_id=job.call_id,
                    ),
                )
            )
        elif not services.pool.submit(tool_job):
            tool_job.report(None, RuntimeError("the runtime is shut down"))

    def start_child(self, job: ChildJob) -> None:
        """Start (or resume) the child run of a subagent call (R3: its own run id)."""
        self._children[job.call_id] = job.run_id
        self.services.host.start_child(self.cell, job)

    def cancel_work(self, key: str, reason: str) -> None:
        """Signal a call's (or the model call's) cancel scope; async work is cancelled too.

        A child run is cancelled through its own inbox, so it records CANCELLED in order.
        """
        child = self._children.get(key)
        if child is not None:
            self.services.host.cancel_child(child, reason)
            return
        work = self._work.get(key)
        if work is not None:
            work.scope.cancel(reason)
        elif key == MODEL_KEY and self._held_decide is not None:
            # Started, then cancelled at once, as an unheld call would be: the agent still
            # sees the messages its view delivers (each delivered message is seen once).
            args = self._held_decide[1]
            self._held_decide = None
            self._start_decide(*args)
            self._work[MODEL_KEY].scope.cancel(reason)
        elif self._held:
            self._release_held(
                key,
                AgentError.of(
                    ErrorCode.CANCELLED,
                    f"{key} was cancelled ({reason}) before it started",
                    call_id=key,
                    reason=reason,
                ),
            )

    def abandon_work(self, key: str) -> bool:
        """Stop waiting for work that did not stop; its worker is never reused (T3).

        Remote work (a process-isolated tool, a Ray task) is killed instead: True then, as
        nothing of the call runs on (docs/isolation.md). False: a thread was left running.
        """
        child = self._children.pop(key, None)
        if child is not None:
            self.services.host.cancel_child(child, "abandoned by its parent")
            return False
        work = self._work.pop(key, None)
        if work is None:
            if key == MODEL_KEY:
                self._held_decide = None
            self._release_held(key, None)
            return False
        if work.remote:
            work.scope.detach()
            # Killed before the scope is cancelled: the cooperative signal has had its chance.
            return work.handle is None or bool(work.handle.kill())
        work.scope.cancel("abandoned")
        work.scope.detach()
        if work.handle is not None:
            work.handle.cancel()
        else:
            self.services.pool.abandon(work.job)
        return False

    def schedule(self, kind: TimerKind, key: str, attempt: int, at: float) -> None:
        """Fire `TimerFired(kind, key, attempt)` into this actor's inbox at `at`."""
        old = self._timers.pop((kind, key), None)
        if old is not None:
            old.cancel()
        ref = self.actor_ref
        message = TimerFired(kind, key, attempt)

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):  # the run ended first
                ref.tell(message)

        self._timers[(kind, key)] = self.services.timer.schedule_at(at, fire)

    def unschedule(self, kind: TimerKind, key: str) -> None:
        """Cancel a pending timer."""
        handle = self._timers.pop((kind, key), None)
        if handle is not None:
            handle.cancel()

    def emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        """Append to the event stream; fire the hooks of this moment on a hook worker.

        `run_ended` waits for the terminal checkpoint to be stored: hosts and `on_finish`
        hooks learn the state the store holds.
        """
        if (
            kind is EventKind.RUN_ENDED
            and self._durable
            and self._store_error is None
            and self._stored < self.cell.revision
        ):
            self._ended = (phase, data)
            return
        if kind is EventKind.RUN_ENDED and self._store_error is not None and "revision" in data:
            data = {**data, "revision": self._stored}  # what the store holds, as the outcome
        self._emit(kind, phase, data)

    def _emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        cell = self.cell
        if kind is EventKind.APPROVAL_REQUESTED:
            cell.approval_requested(
                ApprovalRequest(
                    call_id=data["call_id"],
                    tool=data["tool"],
                    arguments=data["arguments"],
                    run_id=cell.run_id,
                )
            )
        elif kind is EventKind.APPROVAL_SETTLED:
            cell.approval_settled(data["call_id"])
        at = self._wall
        seq = cell.events.append(cell.run_id, kind, phase, at, data, cell.parent_run_id)
        hook = HOOK_EVENTS.get(kind) if self.hooks else None
        if hook is not None:
            callbacks = self.hooks.get(hook)
            if callbacks:
                event = RunEvent(
                    run_id=cell.run_id,
                    trace_id=cell.trace_id,
                    seq=seq,
                    kind=kind,
                    phase=phase,
                    at=at,
                    data=data,
                    parent_run_id=cell.parent_run_id,
                )
                job = HookJob(callbacks, event, self.actor_ref)
                # One hook job of this run at a time: its hooks stay in order while other
                # runs' hooks use other hook workers (a hung hook costs only its own run).
                self._hook_jobs.append(job)
                self._hooks_pending += 1
                if len(self._hook_jobs) == 1:
                    self._submit_hook()

    def journal(self, result: ToolResult | SubagentResult) -> None:
        """Store a result as it arrives (the durable inbox of tool results).

        Every store keeps it: a passivated run's finished calls live only here until the
        plan completes.
        """
        if self._store_error is not None:
            return
        self.services.store.journal(self.cell.run_id, result, on_failed=self._failure_callback(-1))

    def _failure_callback(self, revision: int) -> Callable[[AgentError], None]:
        ref = self.actor_ref
        cell = self.cell

        def on_failed(error: AgentError) -> None:  # on the store's writer thread
            cell.store_failed(error)
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(StoreFailed(revision, error))

        return on_failed

    def checkpoint(
        self,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> None:
        """Write one revision (a durable store encodes and writes on its own thread).

        Nothing is written once the store gave up a write of this run: a later revision
        would be stored on top of a missing one.
        """
        if self._store_error is not None:
            return
        snapshot["updated_at"] = self._wall
        store = self.services.store
        on_stored = None
        on_failed = None
        if store.durable:
            on_failed = self._failure_callback(revision)
            ref = self.actor_ref
            stored_event = self.cell.stored

            def on_stored() -> None:
                stored_event.set()
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(Stored(revision))
        else:
            self._stored = revision  # an in-process store has it once the call returns
            self.cell.stored.set()
        cell = self.cell
        cell.revision = revision
        store.write_checkpoint(
            cell.run_id, revision, snapshot, entries_from, entries, on_stored, on_failed=on_failed
        )
        cell.events.append(
            cell.run_id,
            EventKind.CHECKPOINT,
            None,
            snapshot["updated_at"],
            {"revision": revision},
            cell.parent_run_id,
        )

    def settled(self, outcome: RunOutcome) -> None:
        """Terminal: publish the outcome once its checkpoint is stored, never later: hooks
        still pending then (on_finish among them) run after it.

        The supervisor stays until they are done, or given up after `hook_timeout`, to keep
        them in order; their errors can no longer reach the published outcome and are logged
        (docs/states-and-errors.md "Phases and hooks").
        """
        if self._store_error is not None and outcome.revision > self._stored:
            # What the store holds: the run's last stored revision (-1: none).
            outcome = outcome.model_copy(update={"revision": self._stored})
        self._outcome = outcome
        self.cell.state = outcome.state
        self.cell.close_approvals()
        self._finish()

    def _finish(self) -> None:
        if self._outcome is None or self._ended is not None:
            return  # not yet, or its checkpoint is still on its way to the store
        if self._hooks_pending:
            # Counted before the outcome is published: a host that returns from result()
            # and shuts down at once must find these hooks in the drain, not miss them.
            self.services.hooks_draining.enter()
            self._draining = True
        self._publish()
        if self._hooks_pending:
            at = self.services.clock.now() + self.services.hook_timeout
            self.schedule(TimerKind.GRACE, "hooks", 0, at)
        else:
            self.actor_ref.stop(block=False)  # queued: handled after this message

    # ------------------------------------------------------------------ hooks and ending

    def _submit_hook(self) -> None:
        while self._hook_jobs and not self.services.hook_pool.submit(self._hook_jobs[0]):
            self._hook_jobs.pop(0)  # the runtime is shutting down: the hook cannot run
            self._hooks_pending -= 1

    def _hook_done(self, errors: list[AgentError]) -> None:
        self._hooks_pending -= 1
        if self._hook_jobs:
            self._hook_jobs.pop(0)
            self._submit_hook()
        for error in errors:
            if self._published:
                self._log.warning(
                    "hook_error_after_end", error=error.message, hook=error.details.get("hook")
                )
                continue
            self._log.warning("hook_error", error=error.message)
            if self._outcome is None:
                self.machine.record_error(error)
            else:  # the outcome waits for its checkpoint to be stored: it can still say so
                self._outcome = self._outcome.model_copy(
                    update={"errors": (*self._outcome.errors, error)}
                )
        if self._published and self._hooks_pending <= 0:
            self.unschedule(TimerKind.GRACE, "hooks")
            self._drained()

    def _hooks_timed_out(self) -> None:
        if not self._published:
            return
        if self._hook_jobs:
            # Only the first is on a worker; the rest never started and are dropped.
            self.services.hook_pool.abandon(self._hook_jobs[0])
        self._log.warning(
            "hooks_abandoned_after_end",
            timeout=self.services.hook_timeout,
            pending=self._hooks_pending,
        )
        self._hooks_pending = 0
        self._hook_jobs.clear()
        self._drained()

    def _drained(self) -> None:
        if self._draining:
            self._draining = False
            self.services.hooks_draining.leave()
        self.actor_ref.stop(block=False)  # queued: handled after this message

    def _publish(self) -> None:
        outcome = self._outcome
        if outcome is None or self._ended is not None:
            return
        self._outcome = None
        self._published = True
        # Leave the directory first: once result() returns, the run is no longer live.
        self.services.host.run_ended(self.cell.run_id)
        self.cell.settle(outcome)
        self.outcome_published(outcome)

    def outcome_published(self, outcome: RunOutcome) -> None:
        """The run's outcome is settled on its cell. A top-level run tells nobody else."""

    # ------------------------------------------------------------------ Parkable

    def inbox_empty(self) -> bool:
        """Whether no message waits in this actor's inbox."""
        return self.actor_inbox.empty()

    def parked_state(self) -> tuple[float | None, dict[str, dict[str, Any]]]:
        """The run's deadline and the validated arguments of its unfinished calls.

        The store holds secrets only as references, so a woken run gets these from memory.
        """
        machine = self.machine
        return machine.deadline, {c.call_id: c.arguments for c in machine.plan if c.result is None}

    def stop_parked(self) -> None:
        """Stop without waiting: the run now lives in the store until its next message."""
        self.actor_ref.stop(block=False)


_HANDLERS: dict[type, Callable[[RunSupervisor, Any, float], None]] = {
    ToolDone: RunSupervisor._on_tool_done,
    Decided: RunSupervisor._on_decided,
    TimerFired: RunSupervisor._on_timer,
    HostMsg: RunSupervisor._on_host,
    ChildDone: RunSupervisor._on_child_done,
    CancelNow: RunSupervisor._on_cancel_now,
    Stored: RunSupervisor._on_stored,
    LeaseLost: RunSupervisor._on_lease_lost,
    LeaseRenewed: RunSupervisor._on_lease_renewed,
    StoreFailed: RunSupervisor._on_store_failed,
    HookDone: RunSupervisor._on_hook_done,
    LiveEvent: RunSupervisor._on_live,
    Begin: RunSupervisor._on_begin,
}
"""One handler per message type: a dict lookup, not a chain of isinstance checks."""
