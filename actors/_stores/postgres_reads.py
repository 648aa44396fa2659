"""`PostgresStore`'s reads: a run at a revision, its revisions, the runs (docs/durability.md).

Each read runs in one consistent snapshot of the database (a read-only transaction) and checks
every row's checksum as SQLite's reads do; the writer's queue is flushed first, so a read sees
this store object's own writes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .sqlite_rows import checked, decoded, named, revision_info, summary
from .store import RevisionInfo, RunSummary, StoredRun, corrupt_row, join_snapshot, not_found

if TYPE_CHECKING:
    import psycopg

    from steerable.protocol import TranscriptEntry

    from .postgres_conn import Connections

__all__ = ["PostgresReads"]


class PostgresReads:
    """The read side of `PostgresStore` (a base of it; the store provides these attributes)."""

    _conns: Connections
    _s: str

    if TYPE_CHECKING:

        def flush(self, timeout: float | None = None, *, events: bool = True) -> bool: ...

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        """Load a run at `revision` (None: the latest), from one consistent snapshot of the
        database.

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` (naming the run and revision)
                for a row whose checksum fails or that does not decode or validate;
                `checkpoint_incompatible` for a newer format; `store_unavailable`.
        """
        return self._load(run_id, revision, ())

    def reload(self, run_id: str, held: Sequence[TranscriptEntry]) -> StoredRun:
        """The latest revision, reading only the transcript entries past `held` (see
        `Store.reload`): a woken run costs what its new entries cost, not its length.

        It does not wait for this store object's queued writes (a load does): its caller's
        writes of the run are stored (a run passivates only once its checkpoint is), and
        its host messages are committed before their send returns."""
        return self._load(run_id, None, held, flush=False)

    def _load(
        self,
        run_id: str,
        revision: int | None,
        held: Sequence[TranscriptEntry],
        *,
        flush: bool = True,
    ) -> StoredRun:
        if flush:
            # A load reads no event: the events waiting for their window stay there.
            self.flush(events=False)
        s = self._s

        def read(conn: psycopg.Connection[Any]) -> Any:
            # The run row and its revision in one statement: a wake is a few round trips.
            if revision is None:
                row = conn.execute(
                    f"SELECT r.revision, r.static, r.crc, v.snapshot, v.crc FROM {s}.runs r "
                    f"LEFT JOIN {s}.revisions v ON v.run_id=r.run_id AND v.revision=r.revision "
                    "WHERE r.run_id=%s",
                    (run_id,),
                ).fetchone()
            else:
                row = conn.execute(
                    f"SELECT r.revision, r.static, r.crc, v.snapshot, v.crc FROM {s}.runs r "
                    f"LEFT JOIN {s}.revisions v ON v.run_id=r.run_id AND v.revision=%s "
                    "WHERE r.run_id=%s",
                    (revision, run_id),
                ).fetchone()
            if row is None:
                raise not_found(run_id)
            latest = int(row[0])
            wanted = latest if revision is None else revision
            if row[3] is None:
                raise not_found(run_id, revision)
            snapshot = named(
                run_id,
                wanted,
                lambda: join_snapshot(
                    checked(bytes(row[1]), row[2], run_id, "run"),
                    checked(bytes(row[3]), row[4], run_id, f"revision {wanted}"),
                    run_id=run_id,
                    revision=wanted,
                ),
            )
            # A held prefix longer than the stored transcript is not this revision's: read all.
            skip = len(held) if len(held) <= snapshot.transcript_len else 0
            entries_sql = (
                f"SELECT 0, idx, NULL, entry, crc FROM {s}.entries "
                "WHERE run_id=%s AND idx>=%s AND idx<%s"
            )
            params: tuple[Any, ...] = (run_id, skip, snapshot.transcript_len)
            if wanted == latest:
                # The entries, the journal and the inbox in one statement: a wake is four
                # round trips (BEGIN, the run, this, COMMIT), not six.
                entries_sql += (
                    f" UNION ALL SELECT 1, 0, call_id, result, crc FROM {s}.journal "
                    f"WHERE run_id=%s UNION ALL SELECT 2, seq, NULL, message, crc FROM {s}.inbox "
                    "WHERE run_id=%s AND seq>%s"
                )
                params += (run_id, run_id, snapshot.last_seq)
            rows = conn.execute(entries_sql + " ORDER BY 1, 2", params).fetchall()
            entries = [(n, b, c) for k, n, _, b, c in rows if k == 0]
            journal = [(cid, b, c) for k, _, cid, b, c in rows if k == 1]
            messages = [(n, b, c) for k, n, _, b, c in rows if k == 2]
            return wanted, snapshot, skip, entries, journal, messages

        at, snapshot, skip, entries, journal, messages = self._conns.run(
            read, what="read", read_only=True
        )
        if snapshot.revision != at:
            raise corrupt_row(run_id, at, f"the row holds revision {snapshot.revision}")
        if skip + len(entries) != snapshot.transcript_len or any(
            idx != i for i, (idx, _, _) in enumerate(entries, skip)
        ):
            raise corrupt_row(
                run_id,
                at,
                f"transcript has {skip + len(entries)} of {snapshot.transcript_len} entries",
            )
        read_entries = [
            decoded(bytes(b), c, run_id, at, f"entry {i}", "entry") for i, b, c in entries
        ]
        return StoredRun(
            snapshot=snapshot,
            transcript=[*held[:skip], *read_entries] if skip else read_entries,
            journal={
                cid: decoded(bytes(b), c, run_id, at, f"journal {cid}", "entry")
                for cid, b, c in journal
            },
            messages=[
                decoded(bytes(b), c, run_id, at, f"message {seq}", "host_message")
                for seq, b, c in messages
            ],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first.

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` naming the run and revision.
        """
        self.flush()
        s = self._s
        rows = self._conns.run(
            lambda c: c.execute(
                f"SELECT revision, snapshot, crc FROM {s}.revisions WHERE run_id=%s "
                "ORDER BY revision",
                (run_id,),
            ).fetchall(),
            what="read",
        )
        if not rows:
            raise not_found(run_id)
        return [
            named(
                run_id,
                int(n),
                functools.partial(revision_info, run_id, int(n), bytes(blob), crc),
            )
            for n, blob, crc in rows
        ]

    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first (run ids sort by creation time)."""
        self.flush()
        s = self._s
        rows = self._conns.run(
            lambda c: c.execute(
                "SELECT run_id, state, revision, task, agent, parent_run_id, updated_at "
                f'FROM {s}.runs ORDER BY run_id COLLATE "C"'
            ).fetchall(),
            what="read",
        )
        return [summary((r[0], r[1], int(r[2]), r[3], r[4], r[5], r[6])) for r in rows]
