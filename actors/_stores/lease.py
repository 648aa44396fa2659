"""Run ownership in the store contract: owners, leases with epochs, fencing (docs/durability.md).

A stored run has at most one owner at a time: a runtime instance (unique per process start)
that holds the run's **lease**. A lease has an **epoch** (+1 on every claim) and an expiry on the
store's own clock. Every write a run makes is checked against the epoch its store object holds,
in the same transaction as the write; a write that finds another owner or a newer epoch is
refused (fenced) and the store tells its fence listeners, so the run stops in that process.

`LeaseTable` is the in-memory implementation `MemoryStore` uses; `SqliteStore` keeps the same
table in its database (the `leases` table).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from steerable.protocol import AgentError, ErrorCode, SteerableError
from steerable.protocol._base import slot_twin

__all__ = [
    "FenceListeners",
    "Lease",
    "LeaseTable",
    "Owner",
    "lease_lost",
    "message_fenced",
    "owner_gone",
    "run_owned",
]


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a run: a runtime instance id (unique per process start), with host and pid.

    Only `instance_id` decides ownership; `host` and `pid` are for humans (`run_owned`'s details,
    `steerable runs`).
    """

    instance_id: str
    host: str
    pid: int

    @classmethod
    def new(cls) -> Owner:
        """A fresh owner identity for this process."""
        # Unique per process start, not per process: a pid is reused, 128 random bits are not.
        return cls(os.urandom(16).hex(), socket.gethostname(), os.getpid())

    def as_details(self) -> dict[str, Any]:
        """The owner as msgpack-able error details."""
        return {"instance_id": self.instance_id, "host": self.host, "pid": self.pid}


@dataclass(frozen=True, slots=True)
class Lease:
    """A run's lease as the store holds it.

    Attributes:
        run_id: The run.
        owner: Its owner.
        epoch: The claim counter; +1 on every claim.
        expires_at: When the lease expires, in seconds on the store's clock (0: released).
        agent: The agent the run records (for adoption); "" when unknown.
    """

    run_id: str
    owner: Owner
    epoch: int
    expires_at: float
    agent: str = ""


_LeaseTwin = slot_twin(Lease)
_new = object.__new__


def _lease(run_id: str, owner: Owner, epoch: int, expires_at: float, agent: str) -> Lease:
    """`Lease(...)` through its twin (`slot_twin`): a table makes two or three a run, where the
    frozen dataclass's `__init__` makes five `object.__setattr__` calls."""
    lease: Any = _new(_LeaseTwin)
    lease.run_id = run_id
    lease.owner = owner
    lease.epoch = epoch
    lease.expires_at = expires_at
    lease.agent = agent
    lease.__class__ = Lease
    return lease  # type: ignore[no-any-return]


_HOST = socket.gethostname()


def owner_gone(owner: Owner) -> bool:
    """Whether `owner` is surely dead: a process of this machine whose pid no longer exists.

    A lease of a dead process need not be waited out (a SIGKILLed worker's runs are taken at
    once). A reused pid only makes a dead owner look alive: the lease then expires as usual.
    A frozen (SIGSTOP) process still exists, so its leases run to their expiry.
    """
    if owner.host != _HOST or owner.pid == os.getpid() or owner.pid <= 0:
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: another user's live process
        return False
    return False


def run_owned(run_id: str, owner: Owner, expires_in: float) -> SteerableError:
    """The error for a claim on a run another live owner holds."""
    return SteerableError(
        AgentError.of(
            ErrorCode.RUN_OWNED,
            f"run {run_id} is owned by {owner.host} pid {owner.pid} (instance "
            f"{owner.instance_id[:8]}); its lease expires in {max(0.0, expires_in):.2f}s",
            run_id=run_id,
            owner=owner.as_details(),
            expires_in=round(max(0.0, expires_in), 3),
        )
    )


def lease_lost(run_id: str, epoch: int, consequence: str) -> SteerableError:
    """`run_owned` for a run this process held at `epoch` and another runtime took over."""
    return SteerableError(
        AgentError.of(
            ErrorCode.RUN_OWNED,
            f"run {run_id} lost its lease (epoch {epoch}): another runtime owns it now; "
            + consequence,
            run_id=run_id,
            epoch=epoch,
        )
    )


def message_fenced(run_id: str, epoch: int) -> SteerableError:
    """The error for a host message to a run whose lease this store object no longer holds."""
    return lease_lost(run_id, epoch, "the message was not stored")


class FenceListeners:
    """Callbacks told `(run_id)` when a store refused one of that run's writes (fenced out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []

    def add(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Register `callback`; returns a function that unregisters it."""
        with self._lock:
            self._callbacks.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def fire(self, run_ids: Iterable[str]) -> None:
        """Tell every listener about every fenced run (called outside the store's locks)."""
        with self._lock:
            callbacks = list(self._callbacks)
        for run_id in run_ids:
            for callback in callbacks:
                callback(run_id)


class LeaseTable:
    """Leases in memory, on a monotonic clock: `MemoryStore`'s ownership (one process).

    Not thread-safe by itself: the store calls it under its own lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.leases: dict[str, Lease] = {}
        self.held: dict[str, tuple[Owner, int]] = {}
        """Runs this store object writes for: run id -> (owner, epoch)."""

    def register_new(self, run_id: str, owner: Owner) -> None:
        """A new run of `owner`: epoch 1, its lease row is made by its first write."""
        self.held[run_id] = (owner, 1)

    def claim(
        self, run_id: str, owner: Owner, ttl: float, *, force: bool, agent: str = ""
    ) -> Lease:
        """Take the run's lease (epoch + 1) unless another live owner holds it."""
        now = self.clock()
        old = self.leases.get(run_id)
        if (
            old is not None
            and not force
            and old.owner.instance_id != owner.instance_id
            and old.expires_at > now
        ):
            raise run_owned(run_id, old.owner, old.expires_at - now)
        lease = _lease(
            run_id,
            owner,
            (old.epoch if old else 0) + 1,
            now + ttl,
            agent or (old.agent if old else ""),
        )
        self.leases[run_id] = lease
        self.held[run_id] = (owner, lease.epoch)
        return lease

    def check(self, run_id: str, ttl: float, agent: str = "") -> bool:
        """Whether this store object may write for `run_id` now (True for unheld runs)."""
        held = self.held.get(run_id)
        if held is None:
            return True
        owner, epoch = held
        lease = self.leases.get(run_id)
        if lease is None:
            if epoch == 1:  # a new run's first write makes its lease
                self.leases[run_id] = _lease(run_id, owner, 1, self.clock() + ttl, agent)
                return True
        elif (lease.owner.instance_id, lease.epoch) == (owner.instance_id, epoch):
            if agent and not lease.agent:
                self.leases[run_id] = _lease(run_id, owner, epoch, lease.expires_at, agent)
            return True
        del self.held[run_id]
        return False

    def renew(self, owner: Owner, run_ids: Iterable[str], ttl: float) -> set[str]:
        """Extend `owner`'s leases of `run_ids`; return those it no longer holds."""
        expires = self.clock() + ttl
        lost: set[str] = set()
        for run_id in run_ids:
            held = self.held.get(run_id)
            lease = self.leases.get(run_id)
            if held is None and lease is not None and lease.owner.instance_id == owner.instance_id:
                continue  # its terminal write (or a release) gave it up: ending, not taken
            if held is None or held[0].instance_id != owner.instance_id:
                lost.add(run_id)
            elif lease is None:
                if held[1] != 1:  # a new run's lease appears with its first write
                    lost.add(run_id)
            elif (lease.owner.instance_id, lease.epoch) != (owner.instance_id, held[1]):
                lost.add(run_id)
                del self.held[run_id]
            else:
                self.leases[run_id] = _lease(run_id, lease.owner, lease.epoch, expires, lease.agent)
        return lost

    def release(self, run_id: str, owner: Owner) -> None:
        """Give the lease up (expiry 0) if `owner` still holds it."""
        held = self.held.pop(run_id, None)
        lease = self.leases.get(run_id)
        if (
            held is not None
            and lease is not None
            and (lease.owner.instance_id, lease.epoch) == (held[0].instance_id, held[1])
        ):
            self.leases[run_id] = _lease(run_id, lease.owner, lease.epoch, 0.0, lease.agent)

    def ended(self, run_id: str) -> None:
        """A run's terminal checkpoint was written: nobody needs its lease any more."""
        self.held.pop(run_id, None)
        lease = self.leases.get(run_id)
        if lease is not None:
            self.leases[run_id] = _lease(run_id, lease.owner, lease.epoch, 0.0, lease.agent)

    def expired(self, run_id: str) -> bool:
        """Whether nobody holds a live lease of `run_id`."""
        lease = self.leases.get(run_id)
        return lease is None or lease.expires_at <= self.clock()
