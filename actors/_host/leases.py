"""`LeaseKeeper`: one thread per runtime that renews the leases of all its runs, and adopts.

Every live run of a runtime (active or passivated) holds its store lease. One renewal pass
for all of them runs every `lease_ttl / 3`; a run whose lease the store no longer gives this
runtime (another process claimed it) is told so at once and stops (docs/durability.md,
"Ownership"). A run also keeps a local deadline on the monotonic clock, set conservatively
from the start of the last successful renewal: past it the run starts no tool until a
renewal says it still holds the lease (a process frozen past its lease wakes up fenced).
With `adopt_orphans`, the same thread claims stored runs whose lease expired and resumes them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from steerable.actors._engine.log import get_logger
from steerable.actors._stores.store import CheckpointStore, Lease, Owner

if TYPE_CHECKING:
    from .cell import RunCell

__all__ = ["LeaseKeeper"]

_log = get_logger("steerable.leases")


class LeaseKeeper:
    """Renews a runtime's leases; tells `on_lost(run_id)` of every lease lost.

    Args:
        store: The runtime's store.
        owner: The runtime's identity.
        ttl: Seconds a lease lasts unless renewed.
        on_lost: Called (on this thread or the store's writer) for a run that lost its lease.
        on_renewed: Called for a run that waited for a renewal to start its tools.
        adopt: Called after each renewal pass to adopt orphans (None: no adoption).
    """

    def __init__(
        self,
        store: CheckpointStore,
        owner: Owner,
        ttl: float,
        on_lost: Callable[[str], None],
        on_renewed: Callable[[str], None],
        adopt: Callable[[], None] | None = None,
    ) -> None:
        if not ttl > 0 or math.isinf(ttl):
            raise ValueError(f"lease_ttl must be a positive number of seconds, not {ttl!r}")
        self.store = store
        self.owner = owner
        self.ttl = ttl
        self.interval = ttl / 3
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._adopt = adopt
        self._lock = threading.Lock()
        self._runs: dict[str, RunCell] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._remove_listener = store.add_fence_listener(self._fenced)
        self._thread: threading.Thread | None = None
        if store.fences:
            self._thread = threading.Thread(target=self._loop, name="steerable-leases", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ runs

    def new_run(self, cell: RunCell) -> None:
        """A new run (start, fork, new child): epoch 1 from its first write."""
        started = time.monotonic()
        self.store.register_new(cell.run_id, self.owner, self.ttl)
        self._track(cell, 1, started)

    def claim(self, cell: RunCell, *, force: bool = False) -> Lease:
        """Claim a stored run for `cell` (resume, child resume).

        Raises:
            SteerableError: `run_owned` (unless `force`), `not_found`.
        """
        started = time.monotonic()
        lease = self.store.claim(cell.run_id, self.owner, self.ttl, force=force)
        self._track(cell, lease.epoch, started)
        return lease

    def claimed(self, cell: RunCell, lease: Lease, started: float) -> None:
        """Track a run claimed elsewhere (adoption) at monotonic time `started`."""
        self._track(cell, lease.epoch, started)

    def _track(self, cell: RunCell, epoch: int, started: float) -> None:
        cell.epoch = epoch
        cell.lease_deadline = started + self.ttl if self.store.fences else math.inf
        with self._lock:
            self._runs[cell.run_id] = cell

    def release(self, run_id: str) -> None:
        """Give a run's lease up (it is parked at shutdown, or refused after its claim)."""
        with self._lock:
            self._runs.pop(run_id, None)
        self.store.release_lease(run_id, self.owner)

    def forget(self, run_id: str) -> None:
        """The run ended (its terminal write released the lease) or was fenced out."""
        with self._lock:
            self._runs.pop(run_id, None)

    def holds(self, run_id: str) -> bool:
        """Whether this runtime tracks the run's lease."""
        with self._lock:
            return run_id in self._runs

    def poke(self) -> None:
        """Renew now (a run waits for a renewal to start a tool)."""
        self._wake.set()

    # ------------------------------------------------------------------ thread

    def _fenced(self, run_id: str) -> None:
        with self._lock:
            mine = self._runs.pop(run_id, None) is not None
        if mine:
            _log.warning("lease_lost", run_id=run_id, why="a write was fenced out")
            self._on_lost(run_id)

    def renew_now(self) -> None:
        """One renewal pass for every tracked run."""
        started = time.monotonic()
        with self._lock:
            cells = dict(self._runs)
        if not cells:
            return
        try:
            lost = self.store.renew(self.owner, list(cells), self.ttl)
        except Exception:  # noqa: BLE001 - a failed pass is retried at the next interval
            _log.warning("lease_renewal_failed", exc_info=True)
            return
        if lost:
            lost = {r for r in lost if not self._ended_here(r, cells[r].epoch)}
        deadline = started + self.ttl
        waiting: list[str] = []
        for run_id, cell in cells.items():
            if run_id in lost:
                continue
            cell.lease_deadline = deadline
            if cell.lease_wait:
                cell.lease_wait = False
                waiting.append(run_id)
        for run_id in waiting:
            self._on_renewed(run_id)
        for run_id in lost:
            with self._lock:
                mine = self._runs.pop(run_id, None) is not None
            if mine:
                _log.warning("lease_lost", run_id=run_id, why="renewal found another owner")
                self._on_lost(run_id)

    def _ended_here(self, run_id: str, epoch: int) -> bool:
        """Whether a run the store no longer counts as held ended here instead of being taken.

        A run's terminal write releases its lease on the store's writer thread; if that lands
        between this pass's look at the tracked runs and the store's renewal, the store reports
        the run as not held. The lease row still names this runtime at the run's epoch then
        (nobody claimed it), so the run is not told it was taken over.
        """
        try:
            lease = self.store.lease(run_id)
        except Exception:  # noqa: BLE001 - unreadable: the store's answer stands
            return False
        return (
            lease is not None
            and lease.owner.instance_id == self.owner.instance_id
            and lease.epoch == epoch
        )

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopping:
                return
            self.renew_now()
            if self._adopt is not None and not self._stopping:
                try:
                    self._adopt()
                except Exception:  # noqa: BLE001 - adoption is retried at the next interval
                    _log.warning("adoption_failed", exc_info=True)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop renewing (the runtime shuts down); leases are released by the caller."""
        self._stopping = True
        self._wake.set()
        self._remove_listener()
        if self._thread is not None:
            self._thread.join(timeout)

    def tracked(self) -> list[str]:
        """Ids of the runs whose leases this keeper holds."""
        with self._lock:
            return list(self._runs)
