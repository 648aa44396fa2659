"""One batch of `PostgresStore`'s writer as one pipelined transaction (docs/durability.md).

The writer turns a batch into a list of statements before it touches a connection, and sends
them all at once (psycopg pipeline mode: `BEGIN`, the lease rows read `FOR SHARE`, every
write, `COMMIT`), so a batch costs one round trip to the server however many writes it holds
(W9pg), and a retry after a lost connection sends the same list again. A pipeline lasts one
batch: never across model calls. The batch's host messages are one statement, its stored
events one more.

Because nothing is read before the writes are sent, each write carries its conditions in SQL:
a held run's write lands only where its lease row still names this store object's owner and
epoch (that row is locked `FOR SHARE` first in the same transaction, so the verdict cannot
change before the commit: a claim waits for it), and the parts of a checkpoint (its revision,
entries, journal clean-up, lease release) only where the run row took that revision (a
revision lands only on top of the previous one). The verdicts are read from the results once
the batch is committed.
"""

from __future__ import annotations

import zlib
from typing import Any

from steerable.protocol import RunState, SteerableError

from .lease import Owner
from .postgres_own import NOW
from .sqlite_files import unavailable

__all__ = ["FENCED_OPS", "Batch", "inbox_statement", "message_statement", "text"]

FENCED_OPS = frozenset({"checkpoint", "journal", "events"})

_ANY: tuple[str, tuple[Any, ...]] = ("TRUE", ())

Results = list[tuple[int, list[tuple[Any, ...]] | None]]
"""Each statement's row count and rows, in the order they were added."""

# Array parameters are sent in binary (`%b`): psycopg quotes each element of a text-format
# array with a regex, about 40% of a 4-row batch's client CPU (docs/performance.md).


def inbox_statement(
    schema: str,
    rows: list[tuple[str, int, bytes, str | None]],
    held: dict[str, tuple[Owner, int]] | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """One statement that stores host messages `(run_id, seq, blob, message_id)` (a seq
    stored again is replaced). A message id the run's inbox holds already is not stored twice
    (the first one's seq stands; the partial unique index would refuse it anyway). A message
    of a run in `held` lands only under that owner's lease at that epoch."""
    owners = [(held or {}).get(r[0]) for r in rows]
    return (
        f"INSERT INTO {schema}.inbox (run_id, seq, message, crc, message_id) "
        "SELECT t.r, t.q, t.m, t.c, t.i FROM unnest(%b::text[], %b::bigint[], "
        "%b::bytea[], %b::bigint[], %b::text[], %b::text[], %b::bigint[]) "
        "AS t(r, q, m, c, i, o, p) "
        f"WHERE (t.i IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.inbox x "
        "WHERE x.run_id = t.r AND x.message_id = t.i)) AND (t.o IS NULL OR EXISTS (SELECT 1 "
        f"FROM {schema}.leases l WHERE l.run_id = t.r AND l.owner = t.o AND l.epoch = t.p)) "
        "ON CONFLICT (run_id, seq) DO UPDATE SET message=excluded.message, "
        "crc=excluded.crc, message_id=excluded.message_id",
        (
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [zlib.crc32(r[2]) for r in rows],
            [r[3] for r in rows],
            [None if o is None else o[0].instance_id for o in owners],
            [None if o is None else o[1] for o in owners],
        ),
    )


def message_statement(
    schema: str,
    run_id: str,
    seq: int,
    blob: bytes,
    message_id: str | None,
    held: tuple[Owner, int] | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """`inbox_statement` for one message, in the plainest SQL (a durable send's statement).

    For a run this store object holds (`held`: owner and epoch), the row lands only if the
    lease is still that owner's at that epoch, so a zombie that lost the lease never stores or
    replaces a message at a seq the new owner assigns. The lease row is read, not locked: row
    locks from concurrent senders on one lease row cost W9pg a quarter of its throughput, and
    a claim that commits while this one statement runs leaves the message stored before the
    new owner restores and assigns seqs (docs/durability.md, "Ownership"). The statement
    returns one row: whether the fence held (True when the run is not held); a message id
    stored before is no row written and no refusal.
    """
    upsert = (
        "ON CONFLICT (run_id, seq) DO UPDATE SET message=excluded.message, crc=excluded.crc, "
        "message_id=excluded.message_id"
    )
    columns = f"INSERT INTO {schema}.inbox (run_id, seq, message, crc, message_id)"
    row = (run_id, seq, blob, zlib.crc32(blob), message_id)
    fence_params: tuple[Any, ...] = ()
    dedupe_params: tuple[Any, ...] = ()
    if held is None:
        fence = "TRUE"
    else:
        fence = f"EXISTS (SELECT 1 FROM {schema}.leases WHERE run_id=%s AND owner=%s AND epoch=%s)"
        fence_params = (run_id, held[0].instance_id, held[1])
    dedupe = "TRUE"
    if message_id is not None:
        dedupe = f"NOT EXISTS (SELECT 1 FROM {schema}.inbox WHERE run_id=%s AND message_id=%s)"
        dedupe_params = (run_id, message_id)
    return (
        f"WITH f AS (SELECT {fence} AS ok), w AS ({columns} SELECT %s,%s,%s,%s,%s FROM f "
        f"WHERE f.ok AND {dedupe} {upsert} RETURNING 1) SELECT f.ok FROM f",
        (*fence_params, *row, *dedupe_params),
    )


def text(value: str) -> str:
    """A listing column's text (PostgreSQL text cannot hold NUL; the blobs keep it exactly)."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


class Batch:
    """The statements of one batch, and their verdicts from the results.

    Args:
        schema: The store's schema.
        held: The runs of the batch this store object writes for: run id -> (owner, epoch).
        ttl: The lease TTL a new run's first write gives its lease.
        static_written: Runs whose static row an earlier batch wrote.
        leased: New runs whose lease row an earlier batch made.
    """

    def __init__(
        self,
        schema: str,
        held: dict[str, tuple[Owner, int]],
        ttl: float,
        static_written: set[str],
        leased: set[str],
    ) -> None:
        self.s = schema
        self.held = held
        self.ttl = ttl
        self.static_written = static_written
        self.leased = leased
        self.statements: list[tuple[str, tuple[Any, ...]]] = []
        self._lease_rows: int | None = None
        self._new: dict[str, int] = {}
        self._upserts: dict[str, int] = {}
        self._revisions: list[tuple[int, str, int, int]] = []
        self._batch_static: set[str] = set()
        self._inbox: dict[tuple[str, int], tuple[bytes, str | None]] = {}
        self._events: dict[tuple[str, int], tuple[bytes, int]] = {}
        self._trim: dict[str, int] = {}
        self._unlocked: set[str] = set()
        self._events_at: int | None = None

    def _add(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        self.statements.append((sql, params))
        return len(self.statements) - 1

    # ------------------------------------------------------------------ fencing

    def lock_leases(self, agents: dict[str, str], writes: set[str]) -> None:
        """Lock the lease rows (in run-id order, as renewals do: no deadlock) of the held runs
        with a checkpoint or journal write among `writes`, and of each new run (epoch 1) whose
        lease this batch makes.

        A held run with only events in the batch is not locked here: its events statement
        locks the lease row of each row it stores and says which runs it stored (`outcome`),
        so a batch of events alone is one statement and its own transaction (W9pg: a host
        message's stored event costs no BEGIN, lock and COMMIT of its own).
        """
        locked = {
            run_id
            for run_id, (_, epoch) in self.held.items()
            if run_id in writes or (epoch == 1 and run_id not in self.leased)
        }
        self._unlocked = set(self.held) - locked
        if not locked:
            return
        s = self.s
        self._lease_rows = self._add(
            f"SELECT run_id, owner, epoch FROM {s}.leases WHERE run_id = ANY(%s) "
            "ORDER BY run_id FOR SHARE",
            (sorted(locked),),
        )
        for run_id in sorted(locked):
            owner, epoch = self.held[run_id]
            if epoch == 1 and run_id not in self.leased:
                # A new run: its first write makes its lease (nobody else can know it yet).
                self._new[run_id] = self._add(
                    f"INSERT INTO {s}.leases VALUES (%s,%s,%s,%s,1,{NOW} + %s,%s) "
                    "ON CONFLICT (run_id) DO NOTHING",
                    (run_id, owner.instance_id, owner.host, owner.pid, self.ttl,
                     text(agents.get(run_id, ""))),
                )  # fmt: skip

    def guard(self, run_id: str) -> tuple[str, tuple[Any, ...]]:
        """The SQL condition (and its parameters) under which a write of `run_id` lands."""
        held = self.held.get(run_id)
        if held is None:
            return _ANY
        return (
            f"EXISTS (SELECT 1 FROM {self.s}.leases WHERE run_id=%s AND owner=%s AND epoch=%s)",
            (run_id, held[0].instance_id, held[1]),
        )

    # ------------------------------------------------------------------ writes

    def inbox(self, run_id: str, seq: int, blob: bytes, message_id: str | None) -> None:
        """Store a host message at `seq` (again: replaced), with the batch's others."""
        self._inbox[(run_id, seq)] = (blob, message_id)

    def journal(self, run_id: str, call_id: str, blob: bytes) -> None:
        """Store one call's result (fenced)."""
        cond, params = self.guard(run_id)
        self._add(
            f"INSERT INTO {self.s}.journal SELECT %s,%s,%s,%s WHERE {cond} ON CONFLICT "
            "(run_id, call_id) DO UPDATE SET result=excluded.result, crc=excluded.crc",
            (run_id, call_id, blob, zlib.crc32(blob), *params),
        )

    def events(self, run_id: str, rows: list[tuple[str, int, bytes, int]], retention: int) -> None:
        """Store a batch of the run's stream (fenced), with the batch's others; a seq given
        again replaces it. The stream keeps its last `retention` events."""
        for _, seq, blob, crc in rows:
            self._events[(run_id, seq)] = (blob, crc)
        if rows:
            oldest = rows[-1][1] - max(1, retention) + 1
            if oldest > 0:
                self._trim[run_id] = oldest

    def release(self, run_id: str, owner: str, epoch: int) -> None:
        """Expire the run's lease if it is still this owner's at `epoch`."""
        self._add(
            f"UPDATE {self.s}.leases SET expires_at=0 WHERE run_id=%s AND owner=%s AND epoch=%s",
            (run_id, owner, epoch),
        )

    def checkpoint(
        self,
        index: int,
        op: tuple[Any, ...],
        blobs: tuple[bytes, bytes, list[bytes]],
    ) -> None:
        """Write one revision (fenced), only on top of the previous one (see SqliteStore)."""
        _, run_id, revision, snapshot, entries_from, _ = op
        static_blob, dynamic_blob, entry_blobs = blobs
        s = self.s
        cond, params = self.guard(run_id)
        if run_id not in self.static_written and run_id not in self._batch_static:
            self._batch_static.add(run_id)
            self._upserts[run_id] = at = self._add(
                f"INSERT INTO {s}.runs SELECT %s,%s,%s,%s,%s,%s::bigint,%s::float8,%s,%s "
                f"WHERE {cond} ON CONFLICT (run_id) DO UPDATE SET state=excluded.state, "
                "revision=excluded.revision, updated_at=excluded.updated_at, "
                "static=excluded.static, crc=excluded.crc "
                "WHERE excluded.revision <= runs.revision + 1",
                (
                    run_id,
                    snapshot["parent_run_id"],
                    text(snapshot["task"]),
                    text(snapshot["agent"]),
                    snapshot["state"],
                    revision,
                    snapshot["updated_at"],
                    static_blob,
                    zlib.crc32(static_blob),
                    *params,
                ),
            )
        else:
            at = self._add(
                f"UPDATE {s}.runs SET state=%s, revision=%s, updated_at=%s "
                f"WHERE run_id=%s AND revision>=%s AND {cond}",
                (snapshot["state"], revision, snapshot["updated_at"], run_id, revision - 1,
                 *params),
            )  # fmt: skip
        self._revisions.append((index, run_id, revision, at))
        # The run row holds this revision exactly when the statement above wrote it: a run's
        # revisions are written in order, by one owner at a time (the fence).
        took = f"{cond} AND EXISTS (SELECT 1 FROM {s}.runs WHERE run_id=%s AND revision=%s)"
        took_params = (*params, run_id, revision)
        held = self.held.get(run_id)
        self._add(
            f"INSERT INTO {s}.revisions SELECT %s,%s::bigint,%s,%s,%s::bigint WHERE {took} "
            "ON CONFLICT (run_id, revision) DO UPDATE SET snapshot=excluded.snapshot, "
            "crc=excluded.crc, epoch=excluded.epoch",
            (
                run_id,
                revision,
                dynamic_blob,
                zlib.crc32(dynamic_blob),
                0 if held is None else held[1],
                *took_params,
            ),
        )
        if entry_blobs:
            self._add(
                f"DELETE FROM {s}.entries WHERE run_id=%s AND idx>=%s AND {took}",
                (run_id, entries_from, *took_params),
            )
            self._add(
                f"INSERT INTO {s}.entries SELECT %s, %s::bigint + t.i - 1, t.e, t.c "
                "FROM unnest(%b::bytea[], %b::bigint[]) WITH ORDINALITY AS t(e, c, i) "
                f"WHERE {took}",
                (
                    run_id,
                    entries_from,
                    entry_blobs,
                    [zlib.crc32(blob) for blob in entry_blobs],
                    *took_params,
                ),
            )
        if not snapshot["plan"]:
            self._add(f"DELETE FROM {s}.journal WHERE run_id=%s AND {took}", (run_id, *took_params))
        if RunState(snapshot["state"]).is_terminal:
            # Nobody needs a finished run's lease: released with its last write.
            self._add(
                f"UPDATE {s}.leases SET expires_at=0 WHERE run_id=%s AND {took}",
                (run_id, *took_params),
            )

    def close(self) -> list[tuple[str, tuple[Any, ...]]]:
        """Add the batch's host messages and events (one statement each); the statements."""
        s = self.s
        if self._inbox:
            self.statements.append(
                inbox_statement(
                    s, [(r, q, b, i) for (r, q), (b, i) in self._inbox.items()], self.held
                )
            )
        if self._events:
            keys = list(self._events)
            owners = [self.held.get(k[0]) for k in keys]
            # Each row lands only where its run's fence holds (no owner: the run is not held).
            # FOR SHARE: a claim of the run waits for this statement's transaction, and one
            # that committed first fails the check (the row is checked again once locked).
            self._events_at = self._add(
                f"INSERT INTO {s}.events SELECT t.r, t.q, t.e, t.c FROM unnest(%b::text[], "
                "%b::bigint[], %b::bytea[], %b::bigint[], %b::text[], %b::bigint[]) "
                "AS t(r, q, e, c, o, p) WHERE t.o IS NULL OR EXISTS (SELECT 1 FROM "
                f"{s}.leases l WHERE l.run_id = t.r AND l.owner = t.o AND l.epoch = t.p "
                "FOR SHARE) ON CONFLICT (run_id, seq) DO UPDATE SET event=excluded.event, "
                "crc=excluded.crc RETURNING run_id",
                (
                    [k[0] for k in keys],
                    [k[1] for k in keys],
                    [self._events[k][0] for k in keys],
                    [self._events[k][1] for k in keys],
                    [None if o is None else o[0].instance_id for o in owners],
                    [None if o is None else o[1] for o in owners],
                ),
            )
        for run_id, oldest in self._trim.items():
            cond, params = self.guard(run_id)
            self._add(
                f"DELETE FROM {s}.events WHERE run_id=%s AND seq<%s AND {cond}",
                (run_id, oldest, *params),
            )
        return self.statements

    # ------------------------------------------------------------------ verdicts

    def outcome(
        self, results: Results
    ) -> tuple[dict[str, bool], set[str], dict[int, SteerableError]]:
        """From the committed batch's results: the fence verdict per held run, the runs whose
        static row this batch wrote, and the checkpoints refused because an earlier revision
        was not stored."""
        fence: dict[str, bool] = {}
        if self._unlocked:
            at = self._events_at
            landed = {r[0] for r in (results[at][1] or [])} if at is not None else set()
            rows_of = {run_id for run_id, _ in self._events}
            fence.update((r, r in landed) for r in self._unlocked if r in rows_of)
        if self._lease_rows is not None:
            rows = results[self._lease_rows][1] or []
            stored = {r[0]: (r[1], int(r[2])) for r in rows}
            for run_id, (owner, epoch) in self.held.items():
                if run_id in self._unlocked:
                    continue
                row = stored.get(run_id)
                if row is None and run_id in self._new:
                    fence[run_id] = results[self._new[run_id]][0] == 1
                else:
                    fence[run_id] = row == (owner.instance_id, epoch)
        added = {run_id for run_id, at in self._upserts.items() if results[at][0] == 1}
        late: dict[int, SteerableError] = {}
        for index, run_id, revision, at in self._revisions:
            if results[at][0] != 1 and fence.get(run_id, True):
                late[index] = unavailable(
                    f"revision {revision} of run {run_id} not stored: an earlier revision of "
                    "the run was not stored (its write was given up)",
                    run_id=run_id,
                    revision=revision,
                )
        return fence, added, late
