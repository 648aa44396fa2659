"""The PostgreSQL wake thread: LISTEN/NOTIFY with a polling fallback, one per runtime.

A runtime's owner side must learn of operations (send, cancel, approve, deny) that other hosts
store for its runs. `submit_op` sends a NOTIFY on the store's channel (payload: the run id) in
the operation's transaction; this thread LISTENs on a dedicated autocommit connection outside
the pool (LISTEN holds its connection for good) and calls `on_change()` for each. A
notification is only a hint: they are lost while the connection is down, so after every
(re)connect the thread re-LISTENs and rescans, and it rescans every `poll_interval` seconds
anyway (and checks its connection then, so a dead one is replaced within that interval).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.log import get_logger

if TYPE_CHECKING:
    import psycopg

    from .postgres_conn import Connections

__all__ = ["LISTEN_APPLICATION", "PgWatcher"]

_log = get_logger("steerable.postgres")

LISTEN_APPLICATION = "steerable-listen"
"""The `application_name` of listener connections (to tell them apart in pg_stat_activity)."""

_SLICE = 0.05  # seconds one wait for a notification lasts: how soon stop() is seen
_MAX_BACKOFF = 1.0


class PgWatcher:
    """The wake thread (`steerable-pg-listen`); `stop()` ends it and closes its connection."""

    def __init__(
        self,
        conns: Connections,
        channel: str,
        on_change: Callable[[], None],
        poll_interval: float,
    ) -> None:
        self._conns = conns
        self._channel = channel
        self._on_change = on_change
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self.listening = threading.Event()
        """Set while the thread holds a connection that LISTENs (tests wait on it)."""
        self.reconnects = 0
        self._thread = threading.Thread(target=self._loop, name="steerable-pg-listen", daemon=True)
        self._thread.start()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._conns.connect()
        try:
            conn.execute(f"SET application_name = '{LISTEN_APPLICATION}'")
            conn.execute(f"LISTEN {self._channel}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:  # noqa: BLE001 - retried at the next notification or poll
            _log.warning("wake_check_failed", exc_info=True)

    def _loop(self) -> None:
        errors = self._conns.psycopg.Error
        conn: psycopg.Connection[Any] | None = None
        backoff = 0.01
        last_scan = time.monotonic()
        try:
            while not self._stop.is_set():
                if conn is None:
                    try:
                        conn = self._connect()
                    except errors as exc:
                        _log.warning("postgres_listen_failed", error=str(exc))
                        self._stop.wait(backoff)
                        backoff = min(backoff * 2, _MAX_BACKOFF)
                        continue
                    backoff = 0.01
                    self.listening.set()
                    self._changed()  # notifications sent while we were away are lost
                    last_scan = time.monotonic()
                try:
                    got = False
                    for _ in conn.notifies(timeout=_SLICE, stop_after=1):
                        got = True
                    now = time.monotonic()
                    if not got and now - last_scan >= self.poll_interval:
                        conn.execute("SELECT 1")  # a dead connection shows now, not later
                        got = True
                    if got:
                        last_scan = now
                        self._changed()
                except errors as exc:
                    self.listening.clear()
                    self.reconnects += 1
                    _log.warning("postgres_listen_lost", error=str(exc))
                    conn.close()
                    conn = None
        finally:
            self.listening.clear()
            if conn is not None:
                conn.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        self._thread.join(timeout)
