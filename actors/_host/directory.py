"""`RunDirectory`: the runtime's own table of runs (never pykka's global registry, T9).

Each entry holds what it takes to run a run's supervisor: its cell, agent, tools, hooks and
config. An entry is ACTIVE (a live supervisor) or PASSIVATED (no actor, no thread: the run
waits for a person and its state is in the store). Host messages always go through here:
stored first, then told to the live supervisor or used to wake a passivated run
(docs/pykka.md T1, T6, T8).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable

import pykka

from steerable.actors._engine.log import get_logger
from steerable.actors._machine.effects import TimerKind
from steerable.actors._stores.store import CheckpointStore
from steerable.protocol import (
    AgentError,
    ErrorCode,
    HostMessage,
    SteerableError,
    SteeringMode,
    TranscriptEntry,
)

from .cell import RunCell
from .factory import Launch, RunEntry, RunFactory
from .messages import CancelNow, HostMsg, TimerFired
from .offload import HostIO
from .services import Parkable, Services

__all__ = ["RunDirectory", "RunEntry"]

_log = get_logger("steerable.directory")
_STORED_WAIT = 30.0  # seconds a message waits for its run's first stored revision

WARM_RUNS = 256
"""Passivated runs whose transcript stays in memory, so that their wake reads only the entries
written after it (`Store.reload`); the most recently parked ones, a bound on what it holds."""


def ended_error(run_id: str, why: str = "ended") -> SteerableError:
    """The error for a message to a run that is not live."""
    return SteerableError(AgentError.of(ErrorCode.RUN_ENDED, f"run {run_id} {why}", run_id=run_id))


class RunDirectory:
    """Live runs by id, active or passivated. Thread-safe. The `RunPort` of every handle.

    Args:
        services: The runtime's shared machinery.
        factory: Builds the supervisors it starts and wakes.
        passivate: Whether waiting runs give up their supervisor (default True).
    """

    def __init__(self, services: Services, factory: RunFactory, *, passivate: bool = True) -> None:
        self.services = services
        self.factory = factory
        self.passivate = passivate
        self._lock = threading.Lock()
        self._runs: dict[str, RunEntry] = {}
        self._warm: OrderedDict[str, list[TranscriptEntry]] = OrderedDict()  # under _lock
        self.started = 0
        self.ended = 0
        self.wakes = 0
        self.closed = False

    @property
    def store(self) -> CheckpointStore:
        """The runtime's store."""
        return self.services.store

    def get(self, run_id: str) -> RunEntry | None:
        """The entry of a live run, or None."""
        with self._lock:
            return self._runs.get(run_id)

    def entries(self) -> list[RunEntry]:
        """Every live entry."""
        with self._lock:
            return list(self._runs.values())

    def counts(self) -> tuple[int, int]:
        """(active, passivated) runs."""
        with self._lock:
            active = sum(1 for e in self._runs.values() if e.ref is not None)
            return active, len(self._runs) - active

    # ------------------------------------------------------------------ starting

    def launch(self, entry: RunEntry, launch: Launch) -> None:
        """Register `entry` and start its supervisor as `launch` says.

        Raises:
            SteerableError: `run_ended` once the runtime is shut down; `resource_exhausted` if
                no actor could be started.
        """
        with self._lock:
            if self.closed:
                raise ended_error(entry.cell.run_id, "cannot start: the runtime is shut down")
            if entry.cell.run_id in self._runs:
                raise SteerableError(
                    AgentError.of(
                        ErrorCode.INTERNAL_ERROR, f"run {entry.cell.run_id} is already live"
                    )
                )
            self._runs[entry.cell.run_id] = entry
            self.started += 1
        self._supervise(entry, launch)

    def _supervise(self, entry: RunEntry, launch: Launch) -> None:
        try:
            self.factory.supervise(entry, launch)
        except SteerableError:
            with self._lock:
                self._runs.pop(entry.cell.run_id, None)
            raise

    # ------------------------------------------------------------------ messages (RunPort)

    @property
    def host_io(self) -> HostIO:
        """The async face's threads (owned by the services, joined at shutdown)."""
        return self.services.host_io

    def wall(self) -> float:
        """Wall-clock seconds now."""
        return self.services.clock.wall()

    def steering(self, run_id: str) -> SteeringMode:
        """A live run's default steering mode (queue for a run that is not live)."""
        entry = self.get(run_id)
        return entry.config.steering if entry is not None else SteeringMode.QUEUE

    def cancel_now(self, cell: RunCell, reason: str) -> None:
        """Tell an active run's supervisor to cancel at once.

        A passivated run is woken by the stored CancelRequest that follows instead.
        """
        entry = self.get(cell.run_id)
        ref = None if entry is None else entry.ref
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(CancelNow(reason))

    def post(
        self,
        cell: RunCell,
        build: Callable[[int], HostMessage],
        store_it: Callable[[HostMessage], None] | None = None,
        *,
        message_id: str | None = None,
    ) -> HostMessage:
        """Accept a host message: assign its seq, store it, deliver or wake (in seq order).

        `store_it` stores the message instead of `append_message` (an operation another
        process stored for this run, taken into the inbox in one transaction). A
        `message_id` accepted before (here or stored) delivers nothing: the message returned
        carries the first one's seq.
        """
        entry = self.get(cell.run_id)
        if entry is None:
            raise ended_error(cell.run_id, "is not live")
        store = self.store
        if cell.store_error is not None:
            raise SteerableError(cell.store_error)
        if store.durable and not cell.stored.is_set() and not cell.stored.wait(_STORED_WAIT):
            # A message for a run the store does not know yet would be lost with it in a
            # crash: accepting means storing both (the first revision is milliseconds away).
            raise SteerableError(
                AgentError.of(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"run {cell.run_id} has no stored revision after {_STORED_WAIT}s; not accepted",
                    run_id=cell.run_id,
                )
            )
        if cell.store_error is not None:  # its first revision was given up while we waited
            raise SteerableError(cell.store_error)

        def deliver(message: HostMessage) -> None:
            if store_it is None and message_id is not None:
                store.append_message(cell.run_id, message, message_id=message_id)
            elif store_it is None:
                store.append_message(cell.run_id, message)  # stored before send() returns
            else:
                store_it(message)
            ref = entry.ref
            if ref is None:
                self._wake(entry)  # the stored message is among those the wake applies
                return
            try:
                ref.tell(HostMsg(message))
            except pykka.ActorDeadError:
                raise ended_error(cell.run_id) from None

        if message_id is None:
            return cell.accept(build, deliver)
        return cell.accept(
            build, deliver, message_id, lambda: store.message_seq(cell.run_id, message_id)
        )

    def deliver(self, run_id: str, message: object) -> None:
        """Tell a runtime message (a timer, a child's result) to a live run, waking it."""
        entry = self.get(run_id)
        if entry is None:
            return
        with entry.cell.lock:
            if entry.ref is None:
                self._wake(entry)
            ref = entry.ref
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # ended meanwhile: nothing to do
                ref.tell(message)

    # ------------------------------------------------------------------ passivation

    def park(self, sup: Parkable) -> None:
        """Passivate a parked run: its supervisor stops; its next message wakes it.

        Runs on the supervisor's (dispatcher) thread, after a handler. Under the cell's lock
        no host message can be told to the actor, so an empty inbox here stays empty.
        """
        if not self.passivate:
            return
        cell = sup.cell
        entry = self.get(cell.run_id)
        if entry is None or entry.ref is None or entry.ref.actor_urn != sup.actor_urn:
            return
        with cell.lock:
            if not sup.inbox_empty() or self.closed:
                return
            entry.ref = None
            entry.deadline, entry.arguments = sup.parked_state()
            # Under the cell's lock: a wake (which takes it first) finds what this park kept.
            self._keep_warm(cell.run_id, sup.parked_transcript())
        # Its timers are cancelled as it stops. Its checkpoint is stored (a supervisor parks
        # only then), so its wake may read the store without waiting for the writer's queue.
        sup.stop_parked()
        if entry.deadline is not None:
            # A parked run still has a deadline: the timer wakes it (R14).
            run_id = cell.run_id
            message = TimerFired(TimerKind.RUN_DEADLINE, "run", 0)
            self.services.timer.schedule_at(entry.deadline, lambda: self.deliver(run_id, message))

    def _keep_warm(self, run_id: str, transcript: list[TranscriptEntry]) -> None:
        with self._lock:
            self._warm[run_id] = transcript
            self._warm.move_to_end(run_id)
            if len(self._warm) > WARM_RUNS:
                self._warm.popitem(last=False)

    def _drop_warm(self, run_id: str) -> list[TranscriptEntry] | None:
        with self._lock:
            return self._warm.pop(run_id, None)

    def _wake(self, entry: RunEntry) -> None:
        """Restart a passivated run's supervisor from its checkpoint (caller holds cell.lock)."""
        run_id = entry.cell.run_id
        held = self._drop_warm(run_id)
        stored = self.store.load(run_id) if held is None else self.store.reload(run_id, held)
        self.wakes += 1
        self._supervise(entry, self.factory.restoring(entry, stored, wake=True))

    # ------------------------------------------------------------------ ending

    def fenced_parked(self, entry: RunEntry) -> None:
        """A passivated run lost its lease: it leaves this runtime without a write."""
        from steerable.protocol import EventKind

        from .messages import lease_lost_error

        cell = entry.cell
        with self._lock:
            if self._runs.get(cell.run_id) is not entry:
                return
            del self._runs[cell.run_id]
            self._warm.pop(cell.run_id, None)
        cell.events.append(
            cell.run_id,
            EventKind.LEASE_LOST,
            None,
            self.services.clock.wall(),
            {"epoch": cell.epoch},
            cell.parent_run_id,
        )
        cell.close_approvals()
        if not cell.future.done():
            cell.future.set_exception(lease_lost_error(cell.run_id, cell.epoch))
        if cell.owns_events:
            cell.events.close()

    def ended_run(self, run_id: str) -> None:
        """A run reached its terminal state and published its outcome."""
        with self._lock:
            self._warm.pop(run_id, None)
            if self._runs.pop(run_id, None) is not None:
                self.ended += 1

    def close(self) -> list[RunEntry]:
        """Refuse new runs; return the live entries."""
        with self._lock:
            self.closed = True
            return list(self._runs.values())
