"""`ProcessPool`: warm worker processes that run one call each at a time and can be killed.

A thread cannot be killed (docs/pykka.md T3); a process can. Workers are started with the
`forkserver` method (never a plain `fork` of the threaded host), each in its own process group,
so that killing a call is one `killpg(SIGKILL)` that ends the tool's own children too. A fresh
worker replaces a killed or dead one, started by the pool's monitor thread, off the critical
path of whoever killed it.

One monitor thread (`steerable-procpool`) waits on every worker's pipe and exit sentinel: it
delivers results, notices deaths (reported as `crashed` with the exit status), starts workers and
hands queued calls to workers as they become idle. `submit`, `signal` and `kill` never wait for
a worker.

No orphan: a worker exits when its pipe to the host closes, and on Linux the kernel kills it
when its parent (the forkserver, which exits with the host) dies, even while it spins in C
code. No zombie: the forkserver reaps its children and the monitor collects their status.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from .clock import SystemClock
from .executor import OutcomeKind, RemoteOutcome, RemoteTask
from .log import get_logger
from .procworker import worker_main

__all__ = ["ProcessCall", "ProcessPool"]

_log = get_logger("steerable.procpool")
_clock = SystemClock()  # real time: shutdown waits for real processes
_numbers = itertools.count(1)
_MAX_START_FAILURES = 3  # consecutive workers dying before "ready": stop trying, fail the queue

OnDone = Callable[[RemoteOutcome], None]


class _Worker:
    """The pool's record of one worker process. Fields are guarded by the pool's lock."""

    __slots__ = (
        "call",
        "conn",
        "conn_open",
        "exitcode",
        "exiting",
        "killed",
        "name",
        "pid",
        "proc",
        "ready",
        "reaped",
        "send_lock",
    )

    def __init__(self, name: str, proc: Any, conn: Any) -> None:
        self.name = name
        self.proc = proc
        self.conn = conn
        self.pid: int = proc.pid
        self.ready = False
        self.conn_open = True
        self.killed = False
        self.call: ProcessCall | None = None
        self.send_lock = threading.Lock()
        self.exitcode: int | None = None
        self.exiting = False  # its exit sentinel fired: it takes no more calls
        self.reaped = threading.Event()

    def send(self, message: list[Any]) -> None:
        """Send one message; the caller holds `send_lock`. A dead worker's pipe is ignored."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send_bytes(msgpack.packb(message, use_bin_type=True))

    def usable(self) -> bool:
        """Whether the worker may take a call (lock held)."""
        return not self.killed and not self.exiting and self.conn_open

    def kill_group(self) -> None:
        # The worker leads its own group (procworker.worker_main): the tool's children die too.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        except PermissionError:  # pragma: no cover - the pid was reused by someone else's
            pass


_QUEUED, _RUNNING, _OVER = 0, 1, 2


class ProcessCall:
    """A call submitted to a `ProcessPool`: `signal()` it, or `kill()` it."""

    __slots__ = ("_on_done", "_pool", "_state", "_worker", "number", "task")

    def __init__(self, pool: ProcessPool, task: RemoteTask, on_done: OnDone) -> None:
        self._pool = pool
        self.task = task
        self._on_done = on_done
        self.number = next(_numbers)
        self._state = _QUEUED
        self._worker: _Worker | None = None

    def signal(self, reason: str) -> None:
        """Set the call's cancel scope in its worker; a call not started yet never starts."""
        self._pool._signal(self, reason)

    def kill(self) -> bool:
        """SIGKILL the call's worker group (a queued call is dropped). Never blocks.

        Returns:
            True: nothing of the call runs on, and `on_done` will not be called for it.
        """
        return self._pool._kill(self)

    def _finish(self, outcome: RemoteOutcome) -> None:
        try:
            self._on_done(outcome)
        except BaseException as exc:  # noqa: BLE001 - a broken callback must not stop the pool
            with contextlib.suppress(Exception):
                _log.error("on_done_raised", error=repr(exc), exc_info=exc)


class ProcessPool:
    """A pool of warm worker processes; implements `Executor` (see actors/_engine/executor.py).

    Args:
        workers: Processes kept warm (started by `start()`, replaced when they die). Default 2.
        max_workers: Most processes at once; calls beyond that queue. Default 8.
        preload: Modules each worker imports before it reports ready (the tool modules and the
            entry point's module), so that the first call does not pay for the imports.
        name: Name prefix of the monitor thread and the workers. Default "steerable-procpool".
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        max_workers: int = 8,
        preload: Sequence[str] = (),
        name: str = "steerable-procpool",
    ) -> None:
        if max_workers < 1 or workers < 0:
            raise ValueError("max_workers must be at least 1 and workers not negative")
        self._warm = min(workers, max_workers)
        self._max = max_workers
        self._preload = tuple(preload)
        self._name = name
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._queue: deque[ProcessCall] = deque()
        self._starting = 0  # workers the monitor was asked to start
        self._launching = 0  # workers the monitor is starting (not in _workers yet)
        self._start_failures = 0
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._closed = False
        self._stats = dict.fromkeys(
            ("calls", "killed", "crashed", "workers_started", "start_failures"), 0
        )

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        """Start the monitor thread and the warm workers (asynchronously). Idempotent.

        Raises:
            RuntimeError: The pool is shut down, or the platform has no `forkserver`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("ProcessPool is shut down")
            if self._thread is not None:
                return
            if "forkserver" not in multiprocessing.get_all_start_methods():
                raise RuntimeError("process isolation needs the 'forkserver' start method (Unix)")
            self._wake_r, self._wake_w = os.pipe()
            self._starting = self._warm
            self._thread = threading.Thread(target=self._monitor, name=self._name, daemon=True)
            self._thread.start()

    def submit(self, task: RemoteTask, on_done: OnDone) -> ProcessCall:
        """Run `task` on an idle worker now, or queue it; never waits for a process to start.

        `on_done(outcome)` is called once, on the monitor thread (on the caller's thread for a
        pool that is shut down), unless `kill()` returned True first.
        """
        call = ProcessCall(self, task, on_done)
        if self._thread is None and not self._closed:
            self.start()
        worker: _Worker | None = None
        with self._lock:
            if self._closed:
                refused = True
            else:
                refused = False
                self._stats["calls"] += 1
                worker = self._idle_worker()
                if worker is None:
                    self._queue.append(call)
                    self._grow()
                else:
                    self._assign(worker, call)  # returns holding worker.send_lock
        if refused:
            call._finish(
                RemoteOutcome(OutcomeKind.REFUSED, message="the process pool is shut down")
            )
            return call
        if worker is not None:
            self._send_call(worker, call)
        else:
            self._wake()
        return call

    def shutdown(self, timeout: float = 5.0) -> list[str]:
        """Kill every worker (and its group), refuse queued calls, stop the monitor.

        Calls still running are reported `refused`. Idempotent.

        Returns:
            The names of worker processes still alive at the deadline (none, normally).
        """
        deadline = _clock.now() + max(0.0, timeout)
        with self._lock:
            already = self._closed
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            lost = [w.call for w in self._workers if w.call is not None]
            for worker in self._workers:
                worker.killed = True
                if worker.call is not None:
                    worker.call._state = _OVER
                    worker.call = None
            workers = list(self._workers)
            thread = self._thread
        if already:
            return []
        for worker in workers:
            worker.kill_group()
        for call in queued + [c for c in lost if c is not None]:
            call._finish(RemoteOutcome(OutcomeKind.REFUSED, message="the runtime shut down"))
        if thread is not None:
            self._wake()
            thread.join(max(0.0, deadline - _clock.now()))
        for worker in workers:
            worker.reaped.wait(max(0.0, deadline - _clock.now()))
        left = sorted(w.name for w in workers if not w.reaped.is_set())
        if thread is None or not thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._wake_r = self._wake_w = -1
        return left

    def statistics(self) -> dict[str, int]:
        """Counters: processes live/idle/busy, calls queued, calls, killed, crashed, starts."""
        with self._lock:
            live = [w for w in self._workers if not w.killed]
            busy = sum(1 for w in live if w.call is not None)
            idle = sum(1 for w in live if w.call is None and w.ready)
            return {
                "processes_live": len(self._workers),
                "processes_idle": idle,
                "processes_busy": busy,
                "process_calls_queued": len(self._queue),
                "process_calls": self._stats["calls"],
                "process_kills": self._stats["killed"],
                "process_crashes": self._stats["crashed"],
                "processes_started": self._stats["workers_started"],
            }

    def pids(self) -> list[int]:
        """The pids of this pool's worker processes (for tests and diagnostics)."""
        with self._lock:
            return [w.pid for w in self._workers]

    def __repr__(self) -> str:
        return f"<ProcessPool {self._name} workers={len(self._workers)}/{self._max}>"

    # ------------------------------------------------------------------ calls

    def _idle_worker(self) -> _Worker | None:
        for worker in self._workers:
            if worker.ready and worker.call is None and worker.usable():
                return worker
        return None

    def _grow(self) -> None:
        """Ask the monitor for another worker if the queue outgrows the starting ones (lock)."""
        live = sum(1 for w in self._workers if not w.killed)
        coming = self._starting + self._launching
        if coming < len(self._queue) and live + coming < self._max:
            self._starting += 1

    def _assign(self, worker: _Worker, call: ProcessCall) -> None:
        # Lock held. The send lock is taken before the pool lock is released, so a signal that
        # sees the call running always reaches the worker after the call itself.
        worker.call = call
        call._worker = worker
        call._state = _RUNNING
        worker.send_lock.acquire()

    def _send_call(self, worker: _Worker, call: ProcessCall) -> None:
        task = call.task
        limits = {k: task.options[k] for k in ("memory_limit", "cpu_seconds") if k in task.options}
        try:
            worker.send(
                ["call", call.number, task.entry, task.payload, task.remaining, limits or None]
            )
        finally:
            worker.send_lock.release()

    def _signal(self, call: ProcessCall, reason: str) -> None:
        with self._lock:
            if call._state == _QUEUED and call in self._queue:
                self._queue.remove(call)
                call._state = _OVER
                dropped = True
            else:
                dropped = False
            worker = call._worker if call._state == _RUNNING else None
        if dropped:
            call._finish(
                RemoteOutcome(OutcomeKind.CANCELLED, message=f"cancelled ({reason}) before it ran")
            )
        elif worker is not None:
            with worker.send_lock:
                worker.send(["cancel", call.number, reason])

    def _kill(self, call: ProcessCall) -> bool:
        with self._lock:
            state = call._state
            call._state = _OVER
            worker = call._worker
            if state == _QUEUED:
                with contextlib.suppress(ValueError):
                    self._queue.remove(call)
                return True
            if state == _OVER or worker is None or worker.call is not call:
                return True
            worker.killed = True
            worker.call = None
            self._stats["killed"] += 1
        worker.kill_group()
        self._wake()  # the monitor starts a replacement and reaps the dead one
        return True

    # ------------------------------------------------------------------ the monitor thread

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _monitor(self) -> None:
        try:
            self._monitor_loop()
        except BaseException as exc:  # noqa: BLE001 - a defect: say so, fail what waits
            with contextlib.suppress(Exception):
                _log.error("procpool_monitor_failed", error=repr(exc), exc_info=exc)
            with self._lock:
                self._closed = True
                lost = list(self._queue) + [w.call for w in self._workers if w.call is not None]
                self._queue.clear()
                workers = list(self._workers)
            for worker in workers:
                worker.kill_group()
            for call in lost:
                if call is not None:
                    call._finish(RemoteOutcome(OutcomeKind.FAILED, message=f"pool failed: {exc}"))

    def _monitor_loop(self) -> None:
        context = multiprocessing.get_context("forkserver")
        _preload_forkserver(context, self._preload)
        while True:
            self._start_wanted(context)
            with self._lock:
                if self._closed and not self._workers:
                    return
                waitables: dict[Any, tuple[str, _Worker | None]] = {self._wake_r: ("wake", None)}
                for w in self._workers:
                    if w.conn_open:
                        waitables[w.conn] = ("conn", w)
                    waitables[w.proc.sentinel] = ("exit", w)
            for ready in multiprocessing.connection.wait(list(waitables)):
                what, target = waitables[ready]
                if what == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                elif target is None or target.exiting:
                    continue
                elif what == "conn":
                    self._on_message(target)
                else:
                    self._on_exit(target)

    def _start_wanted(self, context: Any) -> None:
        while True:
            with self._lock:
                if self._closed or self._starting <= 0:
                    self._starting = 0
                    return
                self._starting -= 1
                self._launching += 1
            self._start_one(context)

    def _start_one(self, context: Any) -> None:
        name = f"{self._name}-worker-{next(_numbers)}"
        host_end, worker_end = context.Pipe(duplex=True)
        proc = context.Process(
            target=worker_main, args=(worker_end, os.getpid(), self._preload), name=name
        )
        proc.daemon = True
        try:
            proc.start()
        except Exception as exc:  # noqa: BLE001 - no worker: fail the queue if nothing can run it
            host_end.close()
            worker_end.close()
            _log.error("procpool_start_failed", error=repr(exc))
            with self._lock:
                self._launching -= 1
            self._start_failed(str(exc))
            return
        finally:
            with contextlib.suppress(Exception):
                worker_end.close()
        worker = _Worker(name, proc, host_end)
        with self._lock:
            self._stats["workers_started"] += 1
            self._launching -= 1
            self._workers.append(worker)
            late = self._closed  # shutdown came while it started: it missed the kill
            worker.killed = worker.killed or late
        if late:
            worker.kill_group()

    def _start_failed(self, why: str) -> None:
        with self._lock:
            self._start_failures += 1
            self._stats["start_failures"] += 1
            give_up = self._start_failures >= _MAX_START_FAILURES
            live = any(not w.killed for w in self._workers)
            failed: list[ProcessCall] = []
            if give_up and not live:
                failed = list(self._queue)
                self._queue.clear()
                for call in failed:
                    call._state = _OVER
                self._start_failures = 0
            elif not self._closed and self._queue and not give_up:
                self._starting += 1  # try again for the calls that wait
        for call in failed:
            call._finish(
                RemoteOutcome(OutcomeKind.FAILED, message=f"worker processes cannot start: {why}")
            )

    def _on_message(self, worker: _Worker) -> None:
        try:
            message = msgpack.unpackb(worker.conn.recv_bytes(), raw=False)
        except (EOFError, OSError):
            with self._lock:
                worker.conn_open = False  # the exit sentinel follows
            return
        except Exception as exc:  # noqa: BLE001 - a garbled message: treat the worker as broken
            _log.error("procpool_bad_message", worker=worker.name, error=repr(exc))
            with self._lock:
                worker.killed = worker.call is None or worker.killed
            worker.kill_group()
            return
        kind = message[0]
        if kind == "ready":
            self._on_ready(worker)
            return
        done: ProcessCall | None = None
        with self._lock:
            call = worker.call
            if call is not None and call.number == message[1] and call._state == _RUNNING:
                worker.call = None
                call._state = _OVER
                done = call
        if done is not None:
            if kind == "done":
                outcome = RemoteOutcome(OutcomeKind.DONE, payload=bytes(message[2]))
            else:
                outcome = RemoteOutcome(OutcomeKind.FAILED, message=str(message[2]))
            done._finish(outcome)
        self._on_ready(worker)

    def _on_ready(self, worker: _Worker) -> None:
        """The worker is idle: hand it the next queued call."""
        with self._lock:
            worker.ready = True
            self._start_failures = 0
            if not worker.usable() or self._closed or worker.call is not None or not self._queue:
                return
            call = self._queue.popleft()
            self._assign(worker, call)
        self._send_call(worker, call)

    def _on_exit(self, worker: _Worker) -> None:
        with self._lock:
            worker.exiting = True
        # A reply it sent just before it died still counts (its sentinel may be seen first).
        with contextlib.suppress(OSError, EOFError, ValueError):
            while worker.conn_open and worker.conn.poll(0):
                self._on_message(worker)
        worker.proc.join(0)  # collects the status the forkserver reported
        code = worker.exitcode = worker.proc.exitcode
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            call = worker.call
            worker.call = None
            lost = call if call is not None and call._state == _RUNNING else None
            if lost is not None:
                lost._state = _OVER
                self._stats["crashed"] += 1
            never_ready = not worker.ready and not worker.killed
            live = sum(1 for w in self._workers if not w.killed)
            if not self._closed and not never_ready:
                # Refill the warm set, and start more for waiting calls.
                wanted = max(self._warm, min(len(self._queue), self._max)) - live
                self._starting = max(self._starting, wanted - self._launching)
        with contextlib.suppress(Exception):
            worker.conn.close()
        with contextlib.suppress(Exception):
            worker.proc.close()
        worker.reaped.set()
        if lost is not None:
            lost._finish(
                RemoteOutcome(
                    OutcomeKind.CRASHED, message=_describe_exit(code), details=_exit_details(code)
                )
            )
        if never_ready and not self._closed:
            self._start_failed(_describe_exit(code))


def _preload_forkserver(context: Any, modules: Sequence[str]) -> None:
    """Have the forkserver import our modules once, so that each fork starts warm.

    Effective only before the forkserver starts (it is one per host process); the host's own
    preload list (default `["__main__"]`) is kept and ours added to it.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    wanted = current + [
        m for m in ("steerable.actors._engine.procworker", *modules) if m not in current
    ]
    with contextlib.suppress(Exception):
        context.set_forkserver_preload(wanted)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker process ended (status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the worker process was killed by {name}"
    return f"the worker process exited with status {code}"


def _exit_details(code: int | None) -> dict[str, Any]:
    if code is None:
        return {}
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return {"signal": name, "signal_number": -code}
    return {"exit_status": code}
