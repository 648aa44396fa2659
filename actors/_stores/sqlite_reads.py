"""`SqliteStore`'s reads: a run at a revision, its revisions, every run.

A mixin of `SqliteStore` (split from sqlite.py along its seam): each read flushes the
writer's queue first (read-your-writes) and reads on the calling thread's own connection,
checking every row's checksum (docs/reliability.md).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .sqlite_rows import checked, decoded, lazy_entries, named, revision_info, summary
from .store import RevisionInfo, RunSummary, StoredRun, corrupt_row, join_snapshot, not_found

if TYPE_CHECKING:
    from steerable.protocol import TranscriptEntry

__all__ = ["SqliteReads"]


class SqliteReads:
    """Reads for `SqliteStore` (which provides the connections and the writer's flush)."""

    if TYPE_CHECKING:  # provided by SqliteStore (no stub shadows them at run time)

        def _reader(self) -> sqlite3.Connection: ...

        def flush(self, timeout: float | None = None, *, events: bool = True) -> bool: ...

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        """Load a run at `revision` (None: the latest).

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` (naming the run and revision)
                for a row whose checksum fails (bit flips, truncation), a missing transcript
                entry or a record that does not decode or validate; `checkpoint_incompatible`
                for a newer format.
        """
        return self._load(run_id, revision, ())

    def reload(self, run_id: str, held: Sequence[TranscriptEntry]) -> StoredRun:
        """The latest revision, reading only the transcript entries past `held` (see
        `Store.reload`): a woken run costs what its new entries cost, not its length. It
        waits for the writer's queue only if something is queued: a run passivates once its
        checkpoint is stored, but a result journaled after it may still be queued (decision
        0004)."""
        return self._load(run_id, None, held)

    def _load(
        self,
        run_id: str,
        revision: int | None,
        held: Sequence[TranscriptEntry],
    ) -> StoredRun:
        # A load reads no event: the events waiting for their window stay there. Returns at
        # once when nothing is queued.
        self.flush(events=False)
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            row = conn.execute(
                "SELECT revision, static, crc FROM runs WHERE run_id=?", (run_id,)
            ).fetchone()
            if row is None:
                raise not_found(run_id)
            latest, static_blob, static_crc = row
            wanted = latest if revision is None else revision
            rev = conn.execute(
                "SELECT snapshot, crc FROM revisions WHERE run_id=? AND revision=?",
                (run_id, wanted),
            ).fetchone()
            if rev is None:
                raise not_found(run_id, revision)
            at = wanted if type(wanted) is int else None
            snapshot = named(
                run_id,
                at,
                lambda: join_snapshot(
                    checked(static_blob, static_crc, run_id, "run"),
                    checked(rev[0], rev[1], run_id, f"revision {wanted}"),
                    run_id=run_id,
                    revision=at,
                ),
            )
            # A held prefix longer than the stored transcript is not this revision's: read all.
            skip = len(held) if len(held) <= snapshot.transcript_len else 0
            # Only integer indexes from `skip` up: the primary key makes them unique, so the
            # transcript is whole exactly when there are `transcript_len - skip` rows
            # (`lazy_entries` counts), and the index column need not come back (W4: a third of
            # the Python objects of the load's largest query).
            entries = conn.execute(
                "SELECT entry, crc FROM entries WHERE run_id=? AND idx>=? AND idx<? "
                "AND typeof(idx)='integer' ORDER BY idx",
                (run_id, skip, snapshot.transcript_len),
            ).fetchall()
            journal: list[tuple[str, bytes, int]] = []
            messages: list[tuple[int, bytes, int]] = []
            if wanted == latest:
                journal = conn.execute(
                    "SELECT call_id, result, crc FROM journal WHERE run_id=?", (run_id,)
                ).fetchall()
                messages = conn.execute(
                    "SELECT seq, message, crc FROM inbox WHERE run_id=? AND seq>? ORDER BY seq",
                    (run_id, snapshot.last_seq),
                ).fetchall()
        finally:
            conn.execute("COMMIT")
        if snapshot.revision != wanted:
            raise corrupt_row(run_id, at, f"the row holds revision {snapshot.revision}")
        return StoredRun(
            snapshot=snapshot,
            transcript=lazy_entries(entries, snapshot.transcript_len, run_id, at)
            if not skip
            else [
                *held[:skip],
                *lazy_entries(entries, snapshot.transcript_len - skip, run_id, at, skip),
            ],
            journal={
                cid: decoded(b, c, run_id, at, f"journal {cid}", "entry") for cid, b, c in journal
            },
            messages=[
                decoded(b, c, run_id, at, f"message {seq}", "host_message")
                for seq, b, c in messages
            ],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first.

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` naming the run and revision of
                a row that does not hold a revision.
        """
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT revision, snapshot, crc FROM revisions WHERE run_id=? ORDER BY revision",
                (run_id,),
            )
            .fetchall()
        )
        if not rows:
            raise not_found(run_id)
        out = []
        for number, blob, crc in rows:
            at = number if type(number) is int else None
            out.append(named(run_id, at, functools.partial(revision_info, run_id, at, blob, crc)))
        return out

    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first (run ids sort by creation time).

        Raises:
            SteerableError: `checkpoint_corrupt` naming the run of a row that does not hold
                a run summary (a state steerable does not have, a column of the wrong type).
        """
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT run_id, state, revision, task, agent, parent_run_id, updated_at FROM runs "
                "ORDER BY run_id"
            )
            .fetchall()
        )
        return [summary(row) for row in rows]
