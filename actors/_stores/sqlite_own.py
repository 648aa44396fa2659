"""`SqliteStore`'s ownership: leases, claims, renewals and run-addressed operations in SQL.

A mixin of `SqliteStore` (split from sqlite.py along its seam): the writer thread fences
checkpoints and journal entries (sqlite_writer.py, `_fence_ok`); this part claims, renews and
releases leases, adopts orphans, and stores operations addressed to runs another process
owns (docs/durability.md, "Ownership" and "Steering from any process").
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING

from steerable.protocol import AgentError, ErrorCode, HostMessage, RunState, SteerableError
from steerable.protocol._codec import decode, encode

from .lease import Lease, Owner, message_fenced, owner_gone, run_owned
from .sqlite_queue import WriteQueue
from .store import not_found

__all__ = ["SqliteOwnership"]

_COUNTER_WAIT = 0.002
"""Seconds `change_counter` waits for the writer's connection (a transaction's end)."""


class SqliteOwnership:
    """Ownership in SQL for `SqliteStore` (which provides the connections and the writer)."""

    _held: dict[str, tuple[Owner, int]]
    _held_lock: threading.Lock
    _ttl: float
    _queue: WriteQueue
    _closed: bool
    _write_lock: threading.Lock
    _writer_conn: sqlite3.Connection
    _conn_closed: bool

    def _reader(self) -> sqlite3.Connection:
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by CheckpointStore (a stub here would shadow it)

        def _fenced(self, run_ids: Collection[str]) -> None: ...

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
                "SELECT run_id, epoch, expires_at FROM leases WHERE owner=?",
                (owner.instance_id,),
            ).fetchall()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        mine = {run_id: epoch for run_id, epoch, expires_at in rows if expires_at > 0}
        ours = {run_id for run_id, _, _ in rows}
        lost: set[str] = set()
        with self._held_lock:
            for run_id in run_ids:
                held = self._held.get(run_id)
                if held is None and run_id in ours:
                    # Its terminal write (or a release) just gave the lease up, still ours:
                    # the run is ending here, not taken (the keeper forgets it as it ends).
                    continue
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

    def release_lease(self, run_id: str, owner: Owner) -> None:
        """Give up the lease once this run's queued writes are stored (writer order)."""
        with self._held_lock:
            held = self._held.pop(run_id, None)
        if held is not None and held[0].instance_id == owner.instance_id and not self._closed:
            self._queue.put((("release", run_id, owner.instance_id, held[1]), None, None))

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

    # ------------------------------------------------------------------ run-addressed ops

    def submit_op(
        self, run_id: str, message: HostMessage, message_id: str | None = None
    ) -> tuple[int, int | None]:
        """Store an operation for a run that does not live in this process.

        A `message_id` already stored returns the first one's seq (even once the run ended).

        If nobody holds the run's lease, the message goes straight into its inbox (the next
        owner reads it when it claims the run); else it waits in `remote_ops` for the owner.

        Returns:
            (op id, inbox seq), the seq None while the owner has not taken it (-1: refused).

        Raises:
            SteerableError: `not_found`; `run_ended` if the run is terminal.
        """
        self.flush()
        conn = self._transaction()
        try:
            row = conn.execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise not_found(run_id)
            if message_id is not None:
                dup = conn.execute(
                    "SELECT seq FROM inbox WHERE run_id=? AND message_id=?", (run_id, message_id)
                ).fetchone()
                if dup is not None:
                    conn.execute("COMMIT")
                    return 0, int(dup[0])
                dup = conn.execute(
                    "SELECT op_id, seq FROM remote_ops WHERE run_id=? AND message_id=?",
                    (run_id, message_id),
                ).fetchone()
                if dup is not None:
                    conn.execute("COMMIT")
                    return int(dup[0]), dup[1]
            if RunState(row[0]).is_terminal:
                raise SteerableError(
                    AgentError.of(
                        ErrorCode.RUN_ENDED,
                        f"run {run_id} is {row[0]}; nothing more can be sent to it",
                        run_id=run_id,
                        state=row[0],
                    )
                )
            lease = conn.execute(
                "SELECT owner, host, pid, expires_at FROM leases WHERE run_id=?", (run_id,)
            ).fetchone()
            owned = (
                lease is not None
                and lease[3] > self._now()
                and not owner_gone(Owner(lease[0], lease[1], lease[2]))
            )
            if owned:
                blob = encode(message, kind="host_message")
                cur = conn.execute(
                    "INSERT INTO remote_ops (run_id, message_id, message, crc) VALUES (?,?,?,?)",
                    (run_id, message_id, blob, zlib.crc32(blob)),
                )
                op_id, seq = int(cur.lastrowid or 0), None
            else:
                top = conn.execute(
                    "SELECT MAX(seq) FROM inbox WHERE run_id=?", (run_id,)
                ).fetchone()[0]
                seq = (-1 if top is None else int(top)) + 1
                blob = encode(message.model_copy(update={"seq": seq}), kind="host_message")
                conn.execute(
                    "INSERT INTO inbox (run_id, seq, message, crc, message_id) VALUES (?,?,?,?,?)",
                    (run_id, seq, blob, zlib.crc32(blob), message_id),
                )
                op_id = 0
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return op_id, seq

    def message_seq(self, run_id: str, message_id: str) -> int | None:
        """The inbox seq of the run's message stored with `message_id` (None: none is)."""
        # No flush: every inbox row is committed before its `append_message` or `settle_op`
        # returns, so the writer's queue holds none (a send with an id was one flush more).
        row = (
            self._reader()
            .execute("SELECT seq FROM inbox WHERE run_id=? AND message_id=?", (run_id, message_id))
            .fetchone()
        )
        return None if row is None else int(row[0])

    def op_seq(self, op_id: int) -> int | None:
        """The inbox seq the owner gave an operation (None: not yet; -1: refused)."""
        row = (
            self._reader().execute("SELECT seq FROM remote_ops WHERE op_id=?", (op_id,)).fetchone()
        )
        return None if row is None else row[0]

    def open_ops(self, run_ids: Collection[str]) -> list[tuple[int, str, HostMessage, str | None]]:
        """Operations waiting for their owner, oldest first: (op id, run id, message, id)."""
        rows = (
            self._reader()
            .execute(
                "SELECT op_id, run_id, message, crc, message_id FROM remote_ops "
                "WHERE seq IS NULL ORDER BY op_id"
            )
            .fetchall()
        )
        out = []
        for op_id, run_id, blob, crc, message_id in rows:
            if run_id in run_ids and zlib.crc32(blob) == crc:
                out.append((op_id, run_id, decode(blob, kind="host_message"), message_id))
        return out

    def settle_op(
        self,
        op_id: int,
        run_id: str,
        message: HostMessage | None,
        message_id: str | None,
        *,
        stored: bool = False,
    ) -> None:
        """The owner takes an operation into the inbox at `message.seq` (None: refuses it),
        in one transaction; returns once committed. `stored`: the inbox holds it already at
        that seq (its `message_id` was accepted before): only the operation is settled.

        Fenced as a send is: an operation is taken once, and only under this store object's
        lease of the run, so a zombie that lost the lease neither stores a message at a seq
        the new owner assigns nor settles (or refuses) an operation the new owner must take.

        Raises:
            SteerableError: `run_owned` (details `run_id`, `epoch`) if this store object no
                longer holds the run or another owner took the operation; nothing is stored.
                A refusal that is not this store object's to make is dropped silently.
        """
        self._check_open()
        with self._held_lock:
            held = self._held.get(run_id)
        conn = self._transaction()
        try:
            fenced = held is not None and (
                conn.execute(
                    "SELECT 1 FROM leases WHERE run_id=? AND owner=? AND epoch=?",
                    (run_id, held[0].instance_id, held[1]),
                ).fetchone()
                is None
            )
            taken = not fenced and (
                conn.execute(
                    "UPDATE remote_ops SET seq=? WHERE op_id=? AND seq IS NULL",
                    (-1 if message is None else message.seq, op_id),
                ).rowcount
                == 1
            )
            if taken and message is not None and not stored:
                blob = encode(message, kind="host_message")
                conn.execute(
                    "INSERT OR REPLACE INTO inbox (run_id, seq, message, crc, message_id) "
                    "VALUES (?,?,?,?,?)",
                    (run_id, message.seq, blob, zlib.crc32(blob), message_id),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if message is None or taken:
            return
        if fenced:
            self._fenced([run_id])
        raise message_fenced(run_id, 0 if held is None else held[1])

    def absorb_ops(self, run_id: str) -> None:
        """A new owner takes every waiting operation of a run into its inbox, in order."""
        conn = self._transaction()
        try:
            rows = conn.execute(
                "SELECT op_id, message, message_id FROM remote_ops "
                "WHERE run_id=? AND seq IS NULL ORDER BY op_id",
                (run_id,),
            ).fetchall()
            top = conn.execute("SELECT MAX(seq) FROM inbox WHERE run_id=?", (run_id,)).fetchone()
            seq = (-1 if top[0] is None else int(top[0])) + 1
            for op_id, blob, message_id in rows:
                if message_id is not None:
                    dup = conn.execute(
                        "SELECT seq FROM inbox WHERE run_id=? AND message_id=?",
                        (run_id, message_id),
                    ).fetchone()
                    if dup is not None:  # accepted already (a send to its previous owner)
                        conn.execute("UPDATE remote_ops SET seq=? WHERE op_id=?", (dup[0], op_id))
                        continue
                message = decode(blob, kind="host_message").model_copy(update={"seq": seq})
                out = encode(message, kind="host_message")
                conn.execute(
                    "INSERT INTO inbox (run_id, seq, message, crc, message_id) VALUES (?,?,?,?,?)",
                    (run_id, seq, out, zlib.crc32(out), message_id),
                )
                conn.execute("UPDATE remote_ops SET seq=? WHERE op_id=?", (seq, op_id))
                seq += 1
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def change_counter(self) -> int:
        """A number that changes when another connection commits (`PRAGMA data_version`).

        Read by the runtime's wake thread every few milliseconds (cheap: no I/O). Read on the
        writer's connection, whose counter the store's own commits do not move: on a
        connection of its own, every checkpoint this store commits would count as a change,
        and each look (every 5 ms of a busy run) would take pending operations and wake
        followers for nothing (W1 on SQLite: the wake thread's CPU). While a transaction
        holds the writer's connection past a short wait, the dedicated connection answers
        instead (a change it reports may be this store's own: a look for nothing, no miss).
        """
        lock: threading.Lock = self._write_lock
        if lock.acquire(timeout=_COUNTER_WAIT):
            try:
                if not self._conn_closed:
                    return int(self._writer_conn.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error:
                pass  # the dedicated connection answers (and raises what is wrong)
            finally:
                lock.release()
        conn: sqlite3.Connection | None = self.__dict__.get("_watch_conn")
        if conn is None:
            conn = sqlite3.connect(self._path_str(), timeout=30.0, check_same_thread=False)
            self.__dict__["_watch_conn"] = conn
        # Another connection's counter: kept apart from the writer's (a number either may
        # hold), so a switch between the two reads as a change, never as none.
        return -int(conn.execute("PRAGMA data_version").fetchone()[0])

    def _path_str(self) -> str:
        raise NotImplementedError

    def _close_watch(self) -> None:
        conn: sqlite3.Connection | None = self.__dict__.pop("_watch_conn", None)
        if conn is not None:
            conn.close()
