"""ToolWorker actors and the WorkerPool that runs all blocking user code (docs/pykka.md T1-T3, W2).

Tools, the agent's `decide` and hooks block; supervisors must not (T2). So every such call is
a `Job` handed to this pool, which runs it on a worker thread. The job delivers its own result
(it tells its supervisor); the pool only schedules.

The pool keeps ONE shared queue of pending jobs. A worker that finishes a job takes the next
pending one itself, so a short `decide` never waits behind one slow tool in some worker's private
inbox (W2: round-robin over per-worker inboxes did exactly that). Workers are pykka actors only
for their thread, name and registry entry: a job reaches an idle worker by one `tell`, and a busy
worker never goes back through its inbox between jobs.

A hung tool cannot be killed (T3). The caller gives it up with `abandon()`: the worker is never
reused, stops itself when the tool finally returns, and a fresh worker takes its place on demand.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, ClassVar, Final

import pykka

from .clock import SystemClock
from .inline import collect_inline, service_inline
from .log import get_logger
from .slots import Job, StartFailureCallback, _Slot

if TYPE_CHECKING:
    from types import TracebackType

    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope

__all__ = ["Job", "ToolWorker", "WorkerPool"]

_log = get_logger("steerable.pool")

# Thread-name suffixes are process-wide so that two pools never produce the same name: leak
# checks and stack dumps identify a thread by name.
_worker_numbers = itertools.count(1)

# Real time, on purpose: shutdown bounds how long it waits for real threads.
_clock = SystemClock()

_RUN: Final = object()
"""What the pool tells a worker it hands a job to: "run your slot's job"."""


class ToolWorker(pykka.ThreadingActor):
    """A pooled worker thread: runs jobs handed to it by its `WorkerPool`, one at a time.

    Not started directly: the pool starts workers and names their threads `"{name}-{n}"`
    (`ToolWorker-1`, ...). Daemon threads, because a hung tool must not block host exit (T3).
    """

    use_daemon_thread: ClassVar[bool] = True

    def __init__(self, pool: WorkerPool, slot: _Slot) -> None:
        super().__init__()
        self._pool = pool
        self._slot = slot
        self._claim = _Claim(pool, slot)
        self._collected: list[Any] = []
        slot.ref = self.actor_ref

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        # The C SimpleQueue instead of pykka's queue.Queue: 6-9 µs less per iteration (W1).
        inbox: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        return inbox

    def _start_actor_loop(self) -> None:
        # pykka names threads "<class>-<global counter>"; ours carry the pool's name instead.
        thread = threading.Thread(
            target=self._actor_loop, name=self._slot.name, daemon=self.use_daemon_thread
        )
        self._slot.thread = thread
        try:
            thread.start()
        except BaseException:
            # T1: Actor.start() registered the ref before starting the thread; a thread that
            # never started must not leave a live-looking zombie in the registry.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            raise

    def on_receive(self, message: Any) -> None:
        """Run the job, then keep taking pending jobs from the pool until there are none.

        After each job this thread handles the messages the job's report sent to supervisors
        itself (handoff elision, `_engine/inline.py`); the first job those handlers submit is
        claimed for this thread, so a decide -> tool -> decide loop stays on one thread.
        """
        slot = self._slot
        # Told `_RUN`, not the job: the job is in the slot (set under the pool's lock before
        # the tell), and pykka's loop keeps the last message it got alive until the next one,
        # so an idle worker would keep its last job (a finished run's view) for as long.
        job: Job | None = slot.job if message is _RUN else message
        pool = self._pool
        # Reused for every job of this thread: two objects less per job on the hot path.
        collected = self._collected
        claim = self._claim
        while job is not None:
            # A job abandoned after it was handed over but before it started never runs.
            ran = not slot.abandoned
            claimed: Job | None = None
            if ran:
                collect_inline(collected)
                try:
                    _run_contained(job, slot.name)
                finally:
                    claim.job = None
                    _claims.current = claim
                    try:
                        service_inline(collected)
                    finally:
                        _claims.current = None
                claimed = claim.job
                claim.job = None
            job, stop = pool._job_finished(slot, job, ran=ran, claimed=claimed)
            if stop:
                # Abandoned, or the pool is closing: a tell to self, handled after this returns.
                self.stop()

    def on_stop(self) -> None:
        """Tell the pool this worker's thread is ending."""
        self._pool._worker_exited(self._slot)

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Last resort (on_receive contains everything): keep the pool's counts right."""
        self._pool._worker_exited(self._slot)


class _Claim:
    """The one job a worker may keep for itself while it handles supervisors inline."""

    __slots__ = ("job", "pool", "slot")

    def __init__(self, pool: WorkerPool, slot: _Slot) -> None:
        self.pool = pool
        self.slot = slot
        self.job: Job | None = None


_claims = threading.local()


def _run_contained(job: Job, worker: str) -> None:
    try:
        job.run()
    except BaseException as exc:  # noqa: BLE001
        # T7: any BaseException escaping a pykka handler (SystemExit, KeyboardInterrupt,
        # asyncio.CancelledError from a tool's own loop) makes pykka stop every actor in the
        # process. Contain it here; the job was supposed to report its own failure.
        _log_contained("job_raised", exc, worker=worker, job=type(job).__qualname__)


def _log_contained(event: str, exc: BaseException, **fields: str) -> None:
    # A broken logging setup must not turn a contained error into a dead worker.
    with contextlib.suppress(Exception):
        _log.error(event, error=repr(exc), exc_info=exc, **fields)


class WorkerPool:
    """A bounded pool of `ToolWorker` threads sharing one queue of pending jobs.

    `submit` hands a job to an idle worker, else starts a new worker while fewer than
    `max_workers` non-abandoned workers are alive, else queues it. All bookkeeping is O(1)
    under one lock. Never calls `ActorRegistry.stop_all()` (T9): it stops only its own workers.

    Args:
        max_workers: Most live, non-abandoned workers at once (the thread cap; abandoned
            workers do not count, so they are replaced on demand). Default 256 (W5 sweet spot).
        prestart: Workers `start()` starts ahead of demand, so the first burst of calls does not
            pay ~0.1-1 ms per thread start (W2). Clamped to `max_workers`. Default 0.
        max_abandoned: The bulkhead ceiling of abandoned workers still alive; at or above it
            `is_saturated_by_abandoned()` is True and the runtime refuses new calls with
            `resource_exhausted` (T3). The pool itself keeps accepting. Default 64.
        name: Thread-name prefix; threads are named `"{name}-{n}"`. Default "ToolWorker".
        max_idle: Most idle workers kept; a worker finishing its job beyond that stops (the
            pool shrinks after a burst). Default: `max(prestart, 32)`.
        on_start_failure: Called as `on_start_failure(job, exc)` (on whichever thread found
            out, never under the pool's lock) for a job the pool had accepted but can never
            run, because a worker thread could not be started and no live worker is left to take
            it (T1; `exc` is typically `RuntimeError("can't start new thread")`). It is never
            called for a job whose `submit` returned False. Without it such jobs are logged and
            dropped. Must not block or raise.
    """

    def __init__(
        self,
        *,
        max_workers: int = 256,
        prestart: int = 0,
        max_abandoned: int = 64,
        name: str = "ToolWorker",
        on_start_failure: StartFailureCallback | None = None,
        max_idle: int | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        if prestart < 0 or max_abandoned < 0:
            raise ValueError("prestart and max_abandoned must not be negative")
        self._max_workers = max_workers
        self._prestart = min(prestart, max_workers)
        # A burst (10,000 runs starting) must not leave its threads idle forever: workers
        # beyond this many idle ones stop when they finish their job.
        self._max_idle = max(self._prestart, 32) if max_idle is None else max_idle
        self._max_abandoned = max_abandoned
        self._name = name
        self._on_start_failure = on_start_failure
        # The condition's own lock, for the hot paths (submit, a job finished): `with` on the
        # lock itself takes it in C, `with` on the Condition through two Python calls.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Keyed by id(job): the dicts hold the job, so its id cannot be reused while present.
        self._pending: OrderedDict[int, Job] = OrderedDict()
        self._running: dict[int, _Slot] = {}  # handed to a worker, not yet returned
        self._idle: list[_Slot] = []  # LIFO: the most recently used thread is the warmest
        self._slots: set[_Slot] = set()  # every worker whose thread has not ended
        self._active = 0  # live workers that are not abandoned: what max_workers caps
        self._abandoned_alive = 0
        self._abandoned_total = 0
        self._jobs_run = 0
        self._threads_started = 0
        self._started = False
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether `shutdown()` has been called (then `submit` returns False)."""
        return self._closed

    def start(self) -> None:
        """Start the `prestart` workers. Idempotent; optional when `prestart` is 0.

        Raises:
            RuntimeError: The pool is shut down, or a thread could not be started (the workers
                started before it stay in the pool).
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("WorkerPool is shut down")
            if self._started:
                return
            self._started = True
            slots = [self._reserve(None) for _ in range(self._prestart - self._active)]
        for i, slot in enumerate(slots):
            try:
                self._launch(slot, None)
            except BaseException:
                with self._cond:
                    for unused in slots[i + 1 :]:
                        self._slots.discard(unused)
                        self._active -= 1
                    self._cond.notify_all()
                raise

    def submit(self, job: Job) -> bool:
        """Run `job` on a worker thread, now or when one frees up. Never blocks.

        Returns:
            True if the pool accepted the job: it will run, unless it is abandoned while queued,
            dropped at shutdown (`cancel_pending`) or reported to `on_start_failure`. False if
            the pool is shut down (see `closed`), or if no thread could be started for it and
            no live worker is left to take it later (T1: report `resource_exhausted`).

        Raises:
            ValueError: This very job object is already queued or running.
        """
        key = id(job)
        claim: _Claim | None = getattr(_claims, "current", None)
        with self._lock:
            if self._closed:
                return False
            if key in self._running or key in self._pending:
                raise ValueError(f"job already submitted: {job!r}")
            if (
                claim is not None
                and claim.job is None
                and claim.pool is self
                and not claim.slot.abandoned
            ):
                # Submitted by a supervisor this worker is handling inline: the worker takes it
                # next, with no thread to wake (handoff elision).
                claim.job = job
                self._running[key] = claim.slot
                return True
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                self._running[key] = slot
                ref = slot.ref
            elif self._active < self._max_workers:
                slot = self._reserve(job)
                ref = None
            else:
                self._pending[key] = job
                return True
        if ref is None:
            return self._launch(slot, job)
        try:
            ref.tell(_RUN)
        except pykka.ActorDeadError:
            # T9: a host's ActorRegistry.stop_all() stopped this idle worker behind our back;
            # its on_stop forgets it. Try again with the next worker.
            with self._cond:
                self._running.pop(key, None)
            return self.submit(job)
        return True

    def submit_if_idle(self, job: Job) -> bool:
        """Hand `job` to an idle worker now, if one is idle. Never blocks, never starts a thread.

        Returns:
            False, with nothing done, if no worker is idle, the pool is shut down, or the idle
            worker was stopped behind the pool's back (T9): the caller does the work another
            way. True once a worker has the job.
        """
        key = id(job)
        with self._lock:
            if self._closed or not self._idle:
                return False
            slot = self._idle.pop()
            slot.job = job
            self._running[key] = slot
            ref = slot.ref
        assert ref is not None
        try:
            ref.tell(_RUN)
        except pykka.ActorDeadError:  # its on_stop forgets the slot
            with self._cond:
                self._running.pop(key, None)
            return False
        return True

    def abandon(self, job: Job) -> bool:
        """Give up on `job` (it timed out or was cancelled); never blocks, never waits for it.

        Returns:
            False if no thread is held: the job was still queued (removed, it never runs) or has
            already finished or is unknown. True if it was handed to a worker: that worker is
            marked abandoned, is never reused, and stops itself when the job returns (if the job
            had not started yet, it never starts). Its place is refilled at once if jobs are
            waiting.
        """
        key = id(job)
        with self._cond:
            if self._pending.pop(key, None) is not None:
                return False
            slot = self._running.get(key)
            if slot is None:
                return False
            if slot.abandoned:
                return True
            # R15/T3: a thread cannot be killed; it leaves the capacity count instead.
            slot.abandoned = True
            self._active -= 1
            self._abandoned_alive += 1
            self._abandoned_total += 1
            self._cond.notify_all()
            if not self._pending or self._closed:
                return True
            _, waiting = self._pending.popitem(last=False)
            replacement = self._reserve(waiting)
        self._launch(replacement, waiting, caller_owns=False)
        return True

    def is_saturated_by_abandoned(self) -> bool:
        """Whether abandoned workers still alive reached `max_abandoned` (T3 bulkhead)."""
        return self._abandoned_alive >= self._max_abandoned

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether `thread` is one of this pool's workers (abandoned ones included)."""
        with self._cond:
            return any(slot.thread is thread for slot in self._slots)

    def shutdown(self, timeout: float = 5.0) -> list[str]:
        """Close the pool and stop its workers, waiting at most `timeout` seconds overall.

        Pending jobs are dropped (their `cancel_pending()` is called if they have one), idle
        workers are stopped, busy workers stop after their current job, waited for until the
        deadline. Abandoned workers are not waited for: their daemon threads end when their tool
        returns. Idempotent.

        Returns:
            Names of this pool's threads still alive at the deadline: abandoned or hung workers.
        """
        deadline = _clock.now() + max(0.0, timeout)
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            dropped = list(self._pending.values())
            self._pending.clear()
            slots = list(self._slots)
        for slot in idle:
            if slot.ref is not None:
                slot.ref.stop(block=False)
        for job in dropped:
            _cancel_pending(job)
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0, timeout=_remaining(deadline))
        for slot in slots:
            thread = slot.thread
            if not slot.abandoned and thread is not None and thread.ident is not None:
                thread.join(_remaining(deadline))
        with self._cond:
            starting = {slot for slot in self._slots if slot.thread is None}
        return sorted(
            slot.name
            for slot in slots
            if slot in starting or (slot.thread is not None and slot.thread.is_alive())
        )

    def statistics(self) -> dict[str, int]:
        """A consistent snapshot of the pool's counters (R28 metrics).

        `workers_busy` includes workers still starting; `workers_abandoned` counts abandoned
        workers whose thread is still alive, `abandoned_total` every abandon ever.
        """
        with self._cond:
            idle = len(self._idle)
            return {
                "workers_live": self._active + self._abandoned_alive,
                "workers_idle": idle,
                "workers_busy": self._active - idle,
                "workers_abandoned": self._abandoned_alive,
                "abandoned_total": self._abandoned_total,
                "jobs_queued": len(self._pending),
                "jobs_run": self._jobs_run,
                "threads_started": self._threads_started,
            }

    def __repr__(self) -> str:
        return f"<WorkerPool {self._name} workers={self._active}/{self._max_workers}>"

    # -- internals: everything below that touches state runs under self._cond ------------------

    def _reserve(self, job: Job | None) -> _Slot:
        """Count a new worker against capacity before its thread exists (lock held)."""
        slot = _Slot(f"{self._name}-{next(_worker_numbers)}")
        if job is not None:
            slot.job = job
            self._running[id(job)] = slot
        self._slots.add(slot)
        self._active += 1
        return slot

    def _launch(self, slot: _Slot, job: Job | None, *, caller_owns: bool = True) -> bool:
        """Start the worker for a reserved slot and hand it `job` (None: it starts idle)."""
        try:
            ref = ToolWorker.start(self, slot)
        except Exception as exc:  # T1: RuntimeError("can't start new thread"), MemoryError
            if job is None:
                with self._cond:
                    self._release_slot(slot)
                raise
            return self._start_failed(slot, job, exc, caller_owns=caller_owns)
        with self._cond:
            self._threads_started += 1
            if job is None and not self._closed:
                self._idle.append(slot)
                return True
        if job is not None:
            ref.tell(_RUN)  # its slot holds the job (`_reserve`)
        else:  # a prestarted worker that raced with shutdown stops at once
            ref.stop(block=False)
        return True

    def _start_failed(
        self, slot: _Slot, job: Job, exc: BaseException, *, caller_owns: bool
    ) -> bool:
        failed: list[Job] = []
        wake: pykka.ActorRef[ToolWorker] | None = None
        with self._cond:
            self._release_slot(slot)
            self._running.pop(id(job), None)
            if slot.abandoned:
                outcome = "dropped"  # given up while its thread was starting: nobody waits
            elif self._idle and not self._closed:
                # A worker went idle while this thread failed to start: it takes the job.
                outcome = "handed_over"
                idle = self._idle.pop()
                idle.job = job
                self._running[id(job)] = idle
                wake = idle.ref
            elif self._active > 0 and not self._closed:
                # Another worker will take it when it finishes its current job.
                outcome = "requeued"
                self._pending[id(job)] = job
                self._pending.move_to_end(id(job), last=False)
            else:
                # Nothing alive will ever take these: fail them now rather than strand them.
                outcome = "failed"
                failed.append(job)
                failed.extend(self._pending.values())
                self._pending.clear()
        if wake is not None:
            wake.tell(_RUN)
        _log_contained("worker_start_failed", exc, worker=slot.name, job_outcome=outcome)
        accepted = True
        if caller_owns and failed and failed[0] is job:
            failed.pop(0)
            accepted = False
        for lost in failed:
            self._report_start_failure(lost, exc)
        return accepted

    def _report_start_failure(self, job: Job, exc: BaseException) -> None:
        own = getattr(job, "start_failed", None)
        callback = self._on_start_failure
        try:
            if own is not None:
                own(exc)
            elif callback is not None:
                callback(job, exc)
            else:
                _log_contained("job_dropped_no_thread", exc, job=type(job).__qualname__)
        except BaseException as error:  # noqa: BLE001 - a broken callback must not break submit
            _log_contained("on_start_failure_raised", error, job=type(job).__qualname__)

    def _release_slot(self, slot: _Slot) -> None:
        """Forget a worker whose thread has ended or never started (lock held)."""
        if slot not in self._slots:
            return
        self._slots.discard(slot)
        if slot.abandoned:
            self._abandoned_alive -= 1
        else:
            self._active -= 1
        self._cond.notify_all()

    def _job_finished(
        self, slot: _Slot, job: Job, *, ran: bool, claimed: Job | None = None
    ) -> tuple[Job | None, bool]:
        """Called by a worker after each job: returns (next job or None, stop the worker).

        `claimed` is a job the worker took for itself while handling a supervisor inline.
        """
        resubmit = None
        with self._lock:
            if ran:
                self._jobs_run += 1
            self._running.pop(id(job), None)
            slot.job = None
            if claimed is not None and (slot.abandoned or self._closed):
                # This worker stops: its claimed job goes back to the pool like any other.
                self._running.pop(id(claimed), None)
                resubmit = claimed
            elif claimed is not None:
                slot.job = claimed
                return claimed, False
            stop = slot.abandoned or self._closed
            if not stop:
                if self._pending:
                    _, nxt = self._pending.popitem(last=False)
                    self._running[id(nxt)] = slot
                    slot.job = nxt
                    return nxt, False
                if len(self._idle) >= self._max_idle:
                    stop = True  # enough idle workers already: this thread ends
                else:
                    self._idle.append(slot)
        if resubmit is not None and not self.submit(resubmit):
            _cancel_pending(resubmit)  # the pool closed: the job learns it will never run
        return None, stop

    def _worker_exited(self, slot: _Slot) -> None:
        with self._cond:
            if slot in self._idle:  # only after an unexpected failure: O(n) is fine there
                self._idle.remove(slot)
            self._release_slot(slot)


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - _clock.now())


def _cancel_pending(job: Job) -> None:
    cancel = getattr(job, "cancel_pending", None)
    if cancel is None:
        return
    try:
        cancel()
    except BaseException as exc:  # noqa: BLE001 - one broken job must not stop the shutdown
        _log_contained("cancel_pending_raised", exc, job=type(job).__qualname__)
