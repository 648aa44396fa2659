"""`PostgresStore`'s ownership: leases on the database clock, claims, adoption, run-addressed
operations (docs/durability.md, "Ownership" and "Steering from any process").

A mixin of `PostgresStore` (the writer fences checkpoints and journal entries: postgres.py).
Every lease time is read from the server's `clock_timestamp()`, never a host's clock, so hosts
whose clocks disagree still agree on who holds a run. Adoption claims with `FOR UPDATE SKIP
LOCKED`: adopting hosts never wait for, nor claim, a run another host is claiming.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from steerable.protocol import AgentError, ErrorCode, HostMessage, RunState, SteerableError
from steerable.protocol._codec import decode, encode

from .lease import Lease, Owner, message_fenced, owner_gone, run_owned
from .postgres_schema import OPEN_RUNS
from .store import not_found

if TYPE_CHECKING:
    import psycopg

    from .postgres_conn import Connections

__all__ = ["NOW", "PostgresOwnership"]


class _Raced(Exception):
    """A concurrent `submit_op` took the seq or the message_id first (see there)."""


NOW = "extract(epoch FROM clock_timestamp())::float8"
"""The database clock, in seconds since the epoch (leases never use a host's clock)."""


class PostgresOwnership:
    """Ownership in SQL for `PostgresStore` (which provides the connections and the writer)."""

    _held: dict[str, tuple[Owner, int]]
    _held_lock: threading.Lock
    _ttl: float
    _queue: queue.SimpleQueue[Any]
    _closed: bool
    _conns: Connections
    _s: str
    channel: str

    def _check_open(self) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by CheckpointStore (a stub here would shadow it)

        def _fenced(self, run_ids: Collection[str]) -> None: ...

    def flush(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

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
        self._check_open()
        s = self._s

        def work(conn: psycopg.Connection[Any]) -> Lease:
            run = conn.execute(f"SELECT agent FROM {s}.runs WHERE run_id=%s", (run_id,)).fetchone()
            if run is None:
                raise not_found(run_id)
            return self._claim_row(conn, run_id, run[0], owner, ttl, force=force)

        lease = self._conns.run(work, what="claim")
        with self._held_lock:
            self._held[run_id] = (owner, lease.epoch)
        return lease

    def _claim_row(
        self,
        conn: psycopg.Connection[Any],
        run_id: str,
        agent: str,
        owner: Owner,
        ttl: float,
        *,
        force: bool,
    ) -> Lease:
        s = self._s
        row = conn.execute(
            f"SELECT owner, host, pid, epoch, expires_at, {NOW} FROM {s}.leases "
            "WHERE run_id=%s FOR UPDATE",
            (run_id,),
        ).fetchone()
        if row is None:
            now = conn.execute(f"SELECT {NOW}").fetchone()[0]  # type: ignore[index]
            epoch = 1
        else:
            now = row[5]
            if not force and row[0] != owner.instance_id and row[4] > now:
                holder = Owner(row[0], row[1], int(row[2]))
                if not owner_gone(holder):
                    raise run_owned(run_id, holder, row[4] - now)
            epoch = int(row[3]) + 1
        expires = now + ttl
        conn.execute(
            f"INSERT INTO {s}.leases VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (run_id) DO UPDATE "
            "SET owner=excluded.owner, host=excluded.host, pid=excluded.pid, "
            "epoch=excluded.epoch, expires_at=excluded.expires_at, agent=excluded.agent",
            (run_id, owner.instance_id, owner.host, owner.pid, epoch, expires, agent),
        )
        return Lease(run_id, owner, epoch, expires, agent)

    def renew(self, owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
        """Extend `owner`'s live leases in one statement; returns the held runs it lost."""
        self._ttl = ttl
        s = self._s

        def work(conn: psycopg.Connection[Any]) -> dict[str, int]:
            # Rows locked in run-id order, as the writer locks them: no deadlock.
            rows = conn.execute(
                f"UPDATE {s}.leases SET expires_at={NOW} + %s WHERE run_id IN ("
                f"SELECT run_id FROM {s}.leases WHERE owner=%s AND expires_at>0 "
                "ORDER BY run_id FOR UPDATE) RETURNING run_id, epoch",
                (ttl, owner.instance_id),
            ).fetchall()
            return {r[0]: int(r[1]) for r in rows}

        mine = self._conns.run(work, what="lease renewal")
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
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(f"SELECT 1 FROM {s}.leases WHERE run_id=%s", (run_id,)).fetchone(),
            what="lease read",
        )
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
        """Claim expired, non-terminal top-level runs of known agents, in one transaction;
        rows another host is claiming right now are skipped (`SKIP LOCKED`), not waited for."""
        s = self._s
        host = socket.gethostname()

        def work(conn: psycopg.Connection[Any]) -> tuple[list[Lease], list[tuple[str, str]]]:
            taken: list[Lease] = []
            left: list[tuple[str, str]] = []
            # Runs never claimed have no lease row to lock: give them one (expired) first.
            conn.execute(
                f"INSERT INTO {s}.leases (run_id, owner, host, pid, epoch, expires_at, agent) "
                f"SELECT r.run_id, '', '', 0, 0, 0, r.agent FROM {s}.runs r "
                f"WHERE {OPEN_RUNS} AND NOT EXISTS "
                f"(SELECT 1 FROM {s}.leases l WHERE l.run_id=r.run_id) "
                "ON CONFLICT (run_id) DO NOTHING",
            )
            rows = conn.execute(
                f"SELECT l.run_id, r.agent, l.owner, l.host, l.pid, l.expires_at, {NOW} "
                f"FROM {s}.leases l JOIN {s}.runs r USING (run_id) "
                f"WHERE {OPEN_RUNS} AND (l.expires_at <= {NOW} OR l.host=%s) "
                "ORDER BY l.run_id FOR UPDATE OF l SKIP LOCKED",
                (host,),
            ).fetchall()
            for run_id, agent, holder, holder_host, pid, expires_at, now in rows:
                live = expires_at > now
                if live and (
                    holder == owner.instance_id
                    or not owner_gone(Owner(holder, holder_host, int(pid)))
                ):
                    continue
                if agent not in agents:
                    left.append((run_id, agent))
                elif len(taken) < limit:
                    taken.append(self._claim_row(conn, run_id, agent, owner, ttl, force=True))
            return taken, left

        taken, left = self._conns.run(work, what="orphan claim")
        with self._held_lock:
            for lease in taken:
                self._held[lease.run_id] = (owner, lease.epoch)
        return taken, left

    def lease(self, run_id: str) -> Lease | None:
        """The run's stored lease, or None if it was never claimed."""
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(
                f"SELECT owner, host, pid, epoch, expires_at, agent FROM {s}.leases "
                "WHERE run_id=%s AND epoch>0",
                (run_id,),
            ).fetchone(),
            what="lease read",
        )
        if row is None:
            return None
        return Lease(run_id, Owner(row[0], row[1], int(row[2])), int(row[3]), row[4], row[5])

    # ------------------------------------------------------------------ run-addressed ops

    def submit_op(
        self, run_id: str, message: HostMessage, message_id: str | None = None
    ) -> tuple[int, int | None]:
        """Store an operation for a run that does not live in this process (see SqliteStore).

        Notifies the owner (`NOTIFY` on the store's channel, payload the run id) in the same
        transaction. A `message_id` already stored returns the first one's seq. Without one,
        the store gives the operation a private id, so a retry after a lost commit answer is
        still one message.

        Raises:
            SteerableError: `not_found`; `run_ended` if the run is terminal.
            ValueError: `message_id` is not text of at most 200 characters without NUL.
        """
        if message_id is not None and (
            not isinstance(message_id, str) or len(message_id) > 200 or "\x00" in message_id
        ):
            raise ValueError("message_id must be text of at most 200 characters, without NUL")
        key = message_id if message_id is not None else f"\x01auto:{os.urandom(12).hex()}"
        self.flush()
        self._check_open()
        s = self._s
        blob_in = encode(message, kind="host_message")  # refused before anything is stored

        def work(conn: psycopg.Connection[Any]) -> tuple[int, int | None]:
            # Everything the decision needs in one statement (the run locked against a
            # concurrent end, its lease against a concurrent claim), then one INSERT: a send
            # is BEGIN, SELECT, INSERT, COMMIT (it was six statements between them).
            row = conn.execute(
                f"SELECT r.state, "
                f"(SELECT seq FROM {s}.inbox WHERE run_id=r.run_id AND message_id=%s), "
                f"(SELECT op_id FROM {s}.remote_ops WHERE run_id=r.run_id AND message_id=%s), "
                f"(SELECT seq FROM {s}.remote_ops WHERE run_id=r.run_id AND message_id=%s), "
                "l.owner, l.host, l.pid, l.live, "
                f"(SELECT MAX(seq) FROM {s}.inbox WHERE run_id=r.run_id) "
                f"FROM {s}.runs r LEFT JOIN LATERAL (SELECT owner, host, pid, "
                f"expires_at > {NOW} AS live FROM {s}.leases WHERE run_id=r.run_id FOR SHARE) l "
                "ON true WHERE r.run_id=%s FOR SHARE OF r",
                (key, key, key, run_id),
            ).fetchone()
            if row is None:
                raise not_found(run_id)
            try:
                return self._submit(conn, run_id, row, key, message, blob_in)
            except self._conns.psycopg.errors.UniqueViolation:
                raise _Raced from None  # not a psycopg.Error: `run` rolls back, retries not

        while True:
            # Concurrent senders to an unowned run read the same MAX(seq) (or store the same
            # message_id): the loser's INSERT waits for the winner's commit, then fails on
            # the unique index. Its transaction is rolled back and run again: it then reads
            # what the winner committed (its message_id is a duplicate, or MAX(seq) moved), so
            # a send never fails for a race. Retrying the transaction, not a savepoint around
            # each attempt, keeps the uncontended send at the round trips it had.
            try:
                return self._conns.run(work, what="operation")
            except _Raced:
                continue

    def _submit(
        self,
        conn: psycopg.Connection[Any],
        run_id: str,
        row: tuple[Any, ...],
        key: str,
        message: HostMessage,
        blob_in: bytes,
    ) -> tuple[int, int | None]:
        """`submit_op` once the run's row is read (see there), inside its transaction."""
        s = self._s
        state, in_inbox, op_id, op_seq, owner, host, pid, live, top = row
        if in_inbox is not None:
            return 0, int(in_inbox)
        if op_id is not None:
            return int(op_id), op_seq
        if RunState(state).is_terminal:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.RUN_ENDED,
                    f"run {run_id} is {state}; nothing more can be sent to it",
                    run_id=run_id,
                    state=state,
                )
            )
        if owner is not None and bool(live) and not owner_gone(Owner(owner, host, int(pid))):
            got = conn.execute(
                f"INSERT INTO {s}.remote_ops (run_id, message_id, message, crc) "
                "VALUES (%s,%s,%s,%s) RETURNING op_id, pg_notify(%s, %s)",
                (run_id, key, blob_in, zlib.crc32(blob_in), self.channel, run_id),
            ).fetchone()
            return int(got[0]), None  # type: ignore[index]
        seq = (-1 if top is None else int(top)) + 1
        blob = encode(message.model_copy(update={"seq": seq}), kind="host_message")
        conn.execute(
            f"INSERT INTO {s}.inbox (run_id, seq, message, crc, message_id) "
            "VALUES (%s,%s,%s,%s,%s)",
            (run_id, seq, blob, zlib.crc32(blob), key),
        )
        return 0, seq

    def op_seq(self, op_id: int) -> int | None:
        """The inbox seq the owner gave an operation (None: not yet; -1: refused)."""
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(
                f"SELECT seq FROM {s}.remote_ops WHERE op_id=%s", (op_id,)
            ).fetchone(),
            what="operation read",
        )
        return None if row is None or row[0] is None else int(row[0])

    def open_ops(self, run_ids: Collection[str]) -> list[tuple[int, str, HostMessage, str | None]]:
        """Operations waiting for their owner, oldest first: (op id, run id, message, id)."""
        s = self._s
        wanted = list(run_ids)
        rows = self._conns.run(
            lambda c: c.execute(
                f"SELECT op_id, run_id, message, crc, message_id FROM {s}.remote_ops "
                "WHERE seq IS NULL AND run_id = ANY(%s) ORDER BY op_id",
                (wanted,),
            ).fetchall(),
            what="operation read",
        )
        out = []
        for op_id, run_id, blob, crc, message_id in rows:
            if zlib.crc32(blob) == crc:
                out.append(
                    (int(op_id), run_id, decode(bytes(blob), kind="host_message"), message_id)
                )
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
        fenced and once, as `SqliteStore.settle_op` does, in one statement (the lease check,
        the operation's update and the inbox row are CTEs of it).

        Raises:
            SteerableError: `run_owned` as `SqliteStore.settle_op` raises it.
        """
        self._check_open()
        s = self._s
        with self._held_lock:
            held = self._held.get(run_id)
        fence = "TRUE"
        fence_params: tuple[Any, ...] = ()
        if held is not None:
            fence = f"EXISTS (SELECT 1 FROM {s}.leases WHERE run_id=%s AND owner=%s AND epoch=%s)"
            fence_params = (run_id, held[0].instance_id, held[1])
        seq = -1 if message is None else message.seq
        take = (
            f"WITH f AS (SELECT {fence} AS ok), o AS (UPDATE {s}.remote_ops SET seq=%s "
            "WHERE op_id=%s AND seq IS NULL AND (SELECT ok FROM f) RETURNING 1)"
        )
        params: tuple[Any, ...] = (*fence_params, seq, op_id)
        if message is not None and not stored:
            blob = encode(message, kind="host_message")
            take += (
                f", w AS (INSERT INTO {s}.inbox (run_id, seq, message, crc, message_id) "
                "SELECT %s,%s,%s,%s,%s WHERE EXISTS (SELECT 1 FROM o) ON CONFLICT (run_id, seq) "
                "DO UPDATE SET message=excluded.message, crc=excluded.crc, "
                "message_id=excluded.message_id RETURNING 1)"
            )
            params += (run_id, message.seq, blob, zlib.crc32(blob), message_id)
        sql = take + " SELECT f.ok, EXISTS (SELECT 1 FROM o) FROM f"
        row = self._conns.run(
            lambda c: c.execute(sql.encode(), params).fetchone(), what="operation"
        )
        fenced, taken = row is not None and not row[0], row is not None and bool(row[1])
        if message is None or taken:
            return
        if fenced and held is not None:
            self._fenced([run_id])
        raise message_fenced(run_id, 0 if held is None else held[1])

    def message_seq(self, run_id: str, message_id: str) -> int | None:
        """The inbox seq of the run's message stored with `message_id` (None: none is)."""
        # No flush: every inbox row is committed before its `append_message` or `settle_op`
        # returns, so the writer's queue holds none (a send with an id was one flush more).
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(
                f"SELECT seq FROM {s}.inbox WHERE run_id=%s AND message_id=%s",
                (run_id, message_id),
            ).fetchone(),
            what="read",
        )
        return None if row is None else int(row[0])

    def absorb_ops(self, run_id: str) -> None:
        """A new owner takes every waiting operation of a run into its inbox, in order."""
        s = self._s

        def work(conn: psycopg.Connection[Any]) -> None:
            rows = conn.execute(
                f"SELECT op_id, message, message_id FROM {s}.remote_ops "
                "WHERE run_id=%s AND seq IS NULL ORDER BY op_id FOR UPDATE",
                (run_id,),
            ).fetchall()
            if not rows:
                return
            top = conn.execute(
                f"SELECT MAX(seq) FROM {s}.inbox WHERE run_id=%s", (run_id,)
            ).fetchone()
            seq = (-1 if top is None or top[0] is None else int(top[0])) + 1
            for op_id, blob, message_id in rows:
                if message_id is not None:
                    dup = conn.execute(
                        f"SELECT seq FROM {s}.inbox WHERE run_id=%s AND message_id=%s",
                        (run_id, message_id),
                    ).fetchone()
                    if dup is not None:  # accepted already (a send to its previous owner)
                        conn.execute(
                            f"UPDATE {s}.remote_ops SET seq=%s WHERE op_id=%s", (dup[0], op_id)
                        )
                        continue
                message = decode(bytes(blob), kind="host_message").model_copy(update={"seq": seq})
                out = encode(message, kind="host_message")
                conn.execute(
                    f"INSERT INTO {s}.inbox (run_id, seq, message, crc, message_id) "
                    "VALUES (%s,%s,%s,%s,%s)",
                    (run_id, seq, out, zlib.crc32(out), message_id),
                )
                conn.execute(f"UPDATE {s}.remote_ops SET seq=%s WHERE op_id=%s", (seq, op_id))
                seq += 1

        self._conns.run(work, what="operation")
