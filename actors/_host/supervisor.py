"""`RunSupervisor`: the actor that owns one run. A thin shell around the pure `RunMachine`.

It never blocks and never runs user code (docs/pykka.md T2): `decide`, tools and hooks run on
worker threads or the runtime's event loop and report back with `tell`; timers are messages
from the runtime's timer thread. Supervisors own no thread: they are multiplexed on the
runtime's dispatcher (docs/pykka.md, last section), which makes "never block" load-bearing.

This module holds the inbox (one handler per message type) and the fencing reaction; the
work in flight lives in supervisor_work.py, events, checkpoints, hooks and the ending in
supervisor_ending.py (its bases).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, cast

from steerable.actors._engine.base import SteerableActor
from steerable.actors._engine.inline import serving_inline
from steerable.actors._engine.log import get_logger
from steerable.actors._engine.mux import MuxActor
from steerable.actors._engine.timer import TimerHandle
from steerable.actors._machine.effects import CallJob, Effects, TimerKind
from steerable.actors._machine.machine import MODEL_KEY, RunMachine
from steerable.actors._tools.tool import Tool
from steerable.protocol import (
    AgentError,
    ErrorCode,
    EventKind,
    HookName,
    Phase,
    RunEvent,
    RunOutcome,
    RunState,
    RunView,
    TranscriptEntry,
)

from .jobs import Accept, Decided, HookDone, HookJob, ToolDone
from .live import LiveEvent
from .messages import (
    Alarm,
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
from .supervisor_ending import InlineCommit, SupervisorEnding
from .supervisor_work import _Work

if TYPE_CHECKING:
    from .cell import RunCell
    from .services import Services

__all__ = ["RunSupervisor"]

_log = get_logger("steerable.supervisor")


class RunSupervisor(SupervisorEnding, SteerableActor, MuxActor):
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
        self._step_events: list[tuple[EventKind, Phase | None, dict[str, Any]]] | None = None
        # The `on_failed` of every journal write (one per tool result): made on first use.
        self._journal_failed: Callable[[AgentError], None] | None = None
        self._final_state: RunState | None = None  # what the host sees instead of the machine's
        self._timers: dict[tuple[TimerKind, str], tuple[float, int, int]] = {}
        self._timer_seq = 0
        self._alarm: TimerHandle | None = None
        self._alarm_at = math.inf
        self._hooks_pending = 0
        self._wall = services.clock.wall()
        self._hook_jobs: list[HookJob] = []
        self._outcome: RunOutcome | None = None
        self._fenced = False
        self._published = False  # the outcome is settled; hooks still pending run after it
        self._draining = False  # counted in services.hooks_draining until its hooks are done
        self._inline_commit = InlineCommit()

        # The machine reaches this supervisor only through `port`, which `stopping` empties.
        self.port = _Port(self)
        self.machine = machine_factory(self)

    @property
    def effects(self) -> Effects:
        """The effects port the run's machine acts through (emptied when this stops)."""
        return cast(Effects, self.port)

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
            self._step_events = []
            try:
                handler(self, message, now)
            finally:
                pending, self._step_events = self._step_events, None
                if pending:
                    cell = self.cell
                    cell.events.append_step(cell.run_id, self._wall, cell.parent_run_id, pending)
        machine = self.machine
        self.cell.state = machine.state if self._final_state is None else self._final_state
        if self._durable and not self._fenced:
            # This step's events, in one batch, for readers in other processes (an in-memory
            # store gets a run's events when its outcome is published: RunCell.settle).
            self.cell.events.store_pending()
            if self._stored < self.cell.revision and serving_inline():
                # Its writes were queued without waking the store's writer (decision 0004).
                if self._held_decide is not None:
                    # Its model call waits: it commits them here rather than have the writer
                    # woken to wake it, and goes on at once on this thread.
                    self._commit_now(now)
                elif self._held or self._ended is not None or machine.parked:
                    # Waits that concurrent runs reach together (outcomes, approvals): the
                    # writer commits them in one transaction.
                    self.services.store.commit_soon()
        if (
            machine.parked
            and not self._hooks_pending
            and not self._work
            and self._stored >= machine.revision  # a passivated run lives in its checkpoint
        ):
            self.services.host.park(self)
        return None

    def _commit_now(self, now: float) -> None:
        inline = self._inline_commit
        inline.thread = get_ident()
        try:
            self.services.store.commit_now(self.cell.run_id)
        finally:
            inline.thread = None
        if inline.revision > self._stored:
            # What the `Stored` messages of that commit would have done, next on this thread.
            self._on_stored(Stored(inline.revision), now)

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
        # From outside the run's own timers (a passivated run's deadline, told on its wake).
        self._timers.pop((message.kind, message.key), None)
        self._timer_fired(message.kind, message.key, message.attempt, now)

    def _on_alarm(self, message: Alarm, now: float) -> None:
        self._ring(now)

    def _timer_fired(self, kind: TimerKind, key: str, attempt: int, now: float) -> None:
        if kind is TimerKind.GRACE and key == "hooks":
            self._hooks_timed_out()
        else:
            self.machine.timer(kind, key, attempt, now)

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
        self._flush_events()
        cell = self.cell
        self._log.warning("run_fenced_out", epoch=cell.epoch)
        self._held.clear()
        self._cancel_timers()
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
        self._flush_events()
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
        self._cancel_timers()
        if self._draining:  # stopped by the runtime's shutdown before its hooks were done
            self._draining = False
            self.services.hooks_draining.leave()
        for key in list(self._work):
            self.abandon_work(key)
        # The machine refers back to its supervisor (its effects port), and its parts to the
        # machine: without those cycles a finished run (supervisor, cell, event history,
        # machine, transcript) is freed by reference counting as soon as the host drops its
        # handle, instead of lingering until a full collection.
        self.port.detach()
        if self.machine.is_terminal and self._published:
            self._compact()
        self.machine.release()

    def _compact(self) -> None:
        # After the outcome went out (and the GIL to the host waiting for it): none of this
        # is on the host's path. A store's failure here loses nothing; it is logged.
        try:
            self.services.store.compact(self.cell.run_id)
        except Exception:  # noqa: BLE001 - a store's housekeeping must not break the stop
            self._log.warning("store_compact_failed", exc_info=True)

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

    def parked_transcript(self) -> list[TranscriptEntry]:
        """The run's transcript as stored at its parked revision (its wake may reuse it)."""
        return self.machine.transcript

    def stop_parked(self) -> None:
        """Stop without waiting: the run now lives in the store until its next message."""
        self.actor_ref.stop(block=False)


def _ignore(*args: object, **kwargs: object) -> None:
    return None


_EFFECTS = (
    "abandon_work",
    "cancel_work",
    "checkpoint",
    "decide",
    "dispatch",
    "emit",
    "journal",
    "schedule",
    "settled",
    "start_child",
    "unschedule",
)


class _Port:
    """A machine's effects port: its supervisor's bound methods, emptied when it stops.

    As cheap to call as the supervisor itself (one attribute, one bound method). The machine
    and its parts keep the port, not the supervisor, so once `detach` ran nothing of the
    machine leads back to the supervisor, its cell or its event history.
    """

    __slots__ = _EFFECTS

    def __init__(self, supervisor: RunSupervisor) -> None:
        for name in _EFFECTS:
            setattr(self, name, getattr(supervisor, name))

    def detach(self) -> None:
        """Ignore every effect from now on (the supervisor stopped)."""
        for name in _EFFECTS:
            setattr(self, name, _ignore)


_HANDLERS: dict[type, Callable[[RunSupervisor, Any, float], None]] = {
    ToolDone: RunSupervisor._on_tool_done,
    Decided: RunSupervisor._on_decided,
    TimerFired: RunSupervisor._on_timer,
    Alarm: RunSupervisor._on_alarm,
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
