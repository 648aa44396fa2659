"""`SqliteStore`'s WAL checkpoint thread (`steerable-sqlite-wal`).

SQLite's automatic checkpoint runs inside the COMMIT that pushes the WAL past 1,000 pages:
that commit copies the WAL into the database file and syncs it, on the writer thread, while
every queued write waits (W1 on SQLite; docs/performance.md, "Wave 4: SQLite writer"). The
writer's connection turns it off (`wal_autocheckpoint=0`) and signals this thread every
`EVERY` commits instead; the thread runs `PRAGMA wal_checkpoint(PASSIVE)` on a connection of
its own, which never blocks a writer or a reader, and the writer's commits go on meanwhile.

A passive checkpoint that runs while the writer commits ends a few frames short of the WAL's
end, and SQLite restarts the WAL from its beginning only at a write that finds it wholly
checkpointed: under a writer that never pauses (W1), the WAL would grow without bound. So once
it holds more than `LIMIT` frames, the thread checkpoints the few frames left while holding the
store's write lock (the writer waits for that short pass, not for the bulk), and the writer's
next transaction restarts the WAL.

A checkpoint that fails (a full disk, a read-only file, a lock) is logged and tried again at
the next signal: nothing committed depends on it (the WAL holds every committed write, and
SQLite checkpoints it when the last connection closes, or any later process opens it).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from steerable.actors._engine.log import get_logger

__all__ = ["EVERY", "LIMIT", "WalCheckpointer"]

_log = get_logger("steerable.sqlite")

EVERY = 64
"""Commits between two checkpoints: few enough that the WAL stays around the size SQLite's
own 1,000-page threshold keeps it (a W1 commit writes a handful of pages)."""

LIMIT = 4000
"""WAL frames (pages) past which a checkpoint finishes under the write lock: about 16 MB at
SQLite's default 4 KiB pages."""


class WalCheckpointer:
    """Runs passive WAL checkpoints on its own thread and connection when signalled."""

    def __init__(
        self,
        path: Path,
        connect: Callable[[], sqlite3.Connection],
        write_lock: threading.Lock,
    ) -> None:
        self._path = path
        self._connect = connect
        self._write_lock = write_lock
        self._wake = threading.Event()
        self._stopping = False
        self._commits = 0
        self.checkpoints = 0
        """Checkpoints run so far (failed ones not counted)."""
        self.failures = 0
        self.locked = 0
        """Checkpoints finished under the write lock (the WAL past `LIMIT`)."""
        self._thread = threading.Thread(target=self._loop, name="steerable-sqlite-wal", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """One commit more on the writer's connection (called under its write lock)."""
        self._commits += 1
        if self._commits >= EVERY:
            self._commits = 0
            self._wake.set()

    def checkpoint_now(self) -> None:
        """Ask for a checkpoint at once (tests; a store about to be copied)."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (after the checkpoint it may be running) and close its connection."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    if conn is None:
                        conn = self._connect()
                    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    # (busy, frames in the WAL, frames checkpointed): the WAL's frame count
                    # at the pass's start, and the writer went on writing meanwhile.
                    if row is not None and row[1] > LIMIT:
                        with self._write_lock:  # no commit of this store lands meanwhile
                            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        self.locked += 1
                    self.checkpoints += 1
                except sqlite3.Error as exc:
                    # The writer sees the same fault on its next commit and reports it; the
                    # checkpoint is only tried again at the next signal.
                    self.failures += 1
                    _log.warning(
                        "sqlite_wal_checkpoint_failed", path=str(self._path), error=str(exc)
                    )
        except Exception:  # noqa: BLE001 - a daemon thread's last word: logged
            _log.error("sqlite_wal_thread_failed", path=str(self._path), exc_info=True)
        finally:
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error:
                    _log.warning("sqlite_wal_close_failed", path=str(self._path), exc_info=True)
