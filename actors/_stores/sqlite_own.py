"""`SqliteStore`'s ownership: leases, claims, renewals and run-addressed operations in SQL.

A mixin of `SqliteStore` (split from sqlite.py along its seam): the writer thread fences
checkpoints and journal entries (sqlite.py, `_fence_ok`); this part claims, renews and
releases leases, adopts orphans, and stores operations addressed to runs another process
owns (docs/durability.md, "Ownership" and "Steering from any process").
"""

from __future__ import annotations

import queue
import socket
import sqlite3
import threading
import time
from collections.abc import Collection
from typing import Any

from steerable.protocol import RunState

from .lease import Lease, Owner, owner_gone, run_owned
from .store import not_found

__all__ = ["SqliteOwnership"]


class SqliteOwnership:
    """Ownership in SQL for `SqliteStore` (which provides the connections and the writer)."""

    _held: dict[str, tuple[Owner, int]]
    _held_lock: threading.Lock
    _ttl: float
    _queue: queue.SimpleQueue[Any]
    _closed: bool

    def _reader(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def flush(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

    @staticmethod
    def _now() -> float:
        """The store's clock: the machine's clock, which every process on it shares (a
        SQLite file is only ever shared by processes of one machine)."""
        return time.time()

    def _transaction(self) -> sqlite3.Connection:
        self._check_open()
        conn = self._reader()
        conn.execute("BEGIN IMMEDIATE")
        return conn

    def register_new(self, run_id: str, owner: Owner, ttl: float) -> None:
        """A new run of `owner`: its first write creates its lease (epoch 1)."""
        self._ttl = ttl
        with self._held_lock:
            self._held[run_id] = (owner, 1)

    def claim(self, run_id: str, owner: Owner, ttl: float, *, force: bool = False) -> Lease:
        """Take the run's lease (epoch + 1) in one transaction.

        Raises:
            SteerableError: `not_found`; `run_owned` if another owner's lease is live.
        """
        self.flush()
        conn = self._transaction()
        try:
            run = conn.execute("SELECT agent FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if run is None:
                raise not_found(run_id)
            lease = self._claim_row(conn, run_id, run[0], owner, ttl, force=force)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        with self._held_lock:
            self._held[run_id] = (owner, lease.epoch)
        return lease

    def _claim_row(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        agent: str,
        owner: Owner,
        ttl: float,
        *,
        force: bool,
    ) -> Lease:
        now = self._now()
        row = conn.execute(
            "SELECT owner, host, pid, epoch, expires_at FROM leases WHERE run_id=?", (run_id,)
        ).fetchone()
        if row is not None and not force and row[0] != owner.instance_id and row[4] > now:
            holder = Owner(row[0], row[1], row[2])
            if not owner_gone(holder):
                raise run_owned(run_id, holder, row[4] - now)
        epoch = (row[3] if row is not None else 0) + 1
        conn.execute(
            "INSERT OR REPLACE INTO leases VALUES (?,?,?,?,?,?,?)",
            (run_id, owner.instance_id, owner.host, owner.pid, epoch, now + ttl, agent),
        )
        return Lease(run_id, owner, epoch, now + ttl, agent)

    def renew(self, owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
        """Extend `owner`'s live leases in one statement; returns the held runs it lost."""
        self._ttl = ttl
        conn = self._transaction()
        try:
            conn.execute(
                "UPDATE leases SET expires_at=? WHERE owner=? AND expires_at>0",
                (self._now() + ttl, owner.instance_id),
            )
            rows = conn.execute(
                "SELECT run_id, epoch FROM leases WHERE owner=? AND expires_at>0",
                (owner.instance_id,),
            ).fetchall()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        mine = dict(rows)
        lost: set[str] = set()
        with self._held_lock:
            for run_id in run_ids:
                held = self._held.get(run_id)
                if held is None or held[0].instance_id != owner.instance_id:
                    lost.add(run_id)
                elif mine.get(run_id) != held[1] and not (held[1] == 1 and run_id not in mine):
                    lost.add(run_id)
                    del self._held[run_id]
        if lost:
            # A new run (epoch 1) not in `mine` may be unwritten yet, or taken: look.
            lost = {r for r in lost if not self._unwritten_new(r, owner)}
        return lost

    def _unwritten_new(self, run_id: str, owner: Owner) -> bool:
        with self._held_lock:
            held = self._held.get(run_id)
        if held is None or held[1] != 1 or held[0].instance_id != owner.instance_id:
            return False
        row = self._reader().execute("SELECT 1 FROM leases WHERE run_id=?", (run_id,)).fetchone()
        return row is None

    def release(self, run_id: str, owner: Owner) -> None:
        """Give up the lease once this run's queued writes are stored (writer order)."""
        with self._held_lock:
            held = self._held.pop(run_id, None)
        if held is not None and held[0].instance_id == owner.instance_id and not self._closed:
            self._queue.put((("release", run_id, owner.instance_id, held[1]), None))

    def claim_orphans(
        self, owner: Owner, ttl: float, agents: Collection[str], limit: int = 16
    ) -> tuple[list[Lease], list[tuple[str, str]]]:
        """Claim expired, non-terminal top-level runs of known agents, in one transaction."""
        terminal = [s.value for s in RunState if s.is_terminal]
        marks = ",".join("?" * len(terminal))
        conn = self._transaction()
        taken: list[Lease] = []
        left: list[tuple[str, str]] = []
        try:
            rows = conn.execute(
                "SELECT r.run_id, r.agent, l.owner, l.host, l.pid, l.expires_at "
                "FROM runs r LEFT JOIN leases l USING (run_id) "
                f"WHERE r.parent_run_id IS NULL AND r.state NOT IN ({marks}) "
                "AND (l.run_id IS NULL OR l.expires_at<=? OR l.host=?) ORDER BY r.run_id",
                (*terminal, self._now(), socket.gethostname()),
            ).fetchall()
            now = self._now()
            for run_id, agent, holder, host, pid, expires_at in rows:
                live = holder is not None and expires_at > now
                if live and (
                    holder == owner.instance_id or not owner_gone(Owner(holder, host, pid))
                ):
                    continue
                if agent not in agents:
                    left.append((run_id, agent))
                elif len(taken) < limit:
                    taken.append(self._claim_row(conn, run_id, agent, owner, ttl, force=True))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        with self._held_lock:
            for lease in taken:
                self._held[lease.run_id] = (owner, lease.epoch)
        return taken, left

    def lease(self, run_id: str) -> Lease | None:
        """The run's stored lease, or None if it was never claimed."""
        row = (
            self._reader()
            .execute(
                "SELECT owner, host, pid, epoch, expires_at, agent FROM leases WHERE run_id=?",
                (run_id,),
            )
            .fetchone()
        )
        if row is None:
            return None
        return Lease(run_id, Owner(row[0], row[1], row[2]), row[3], row[4], row[5])
