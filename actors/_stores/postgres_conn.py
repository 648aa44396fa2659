"""The PostgreSQL store's connections: the pool, which failures are worth retrying, retries.

psycopg is imported here on first use only, so `import steerable.actors` never needs the
`postgres` extra; a PostgresStore made without it raises an ImportError saying what to install.
A connection a server or pooler dropped (while a model was thinking, a server restart, a
`pg_terminate_backend`) is an `OperationalError` on its next use: every store operation runs
as one transaction through `Connections.run`, which retries such failures on a fresh
connection with backoff, for a bounded time, then raises `store_unavailable`. No psycopg
error reaches the host.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from steerable.actors._engine.log import get_logger

from .sqlite_files import unavailable

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

__all__ = ["Connections", "import_psycopg", "transient"]

_log = get_logger("steerable.postgres")

_T = TypeVar("_T")

_FIRST_BACKOFF = 0.01
_MAX_BACKOFF = 0.5
_POOL_WAIT = 0.2  # seconds one try waits for a pooled connection before connecting directly
CHECK_AFTER = 2.0
"""Seconds a pooled connection may stay unused before the pool checks it (one round trip)
when it is taken: one idle while a model thought may have been dropped by a server or a
pooler. A busier one is not checked: a failure on it is retried on a fresh connection."""

_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "55", "57"})
"""SQLSTATE classes worth retrying: connection exceptions, transaction rollbacks
(serialization failures, deadlocks), insufficient resources, lock not available, operator
intervention (admin shutdown, the server starting up, a cancelled statement)."""

KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "connect_timeout": 10,
}
"""libpq TCP keepalives: a peer that vanished is noticed in about a minute, not hours."""


def import_psycopg() -> tuple[Any, Any]:
    """psycopg and psycopg_pool, or an ImportError that names the extra.

    Raises:
        ImportError: The `postgres` extra is not installed.
    """
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ImportError(
            "PostgresStore needs psycopg 3 and psycopg_pool: install the extra with "
            "pip install 'steerable[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


def transient(exc: BaseException) -> bool:
    """Whether a failed operation may succeed on another try (a dropped connection, a
    deadlock, a server restarting)."""
    psycopg, _ = import_psycopg()
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True  # connection lost or refused, pool timeout, admin shutdown
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in _TRANSIENT_CLASSES


class Connections:
    """A connection pool (health-checked, keepalives on) and retried transactions.

    Args:
        dsn_or_pool: A libpq connection string or URL, or a `psycopg_pool.ConnectionPool`
            the caller owns (then its settings are the caller's, and it is not closed here).
        min_size, max_size: The pool's size when this makes the pool.
        retry_for: Seconds an operation keeps being retried while it fails transiently.
    """

    def __init__(
        self,
        dsn_or_pool: str | psycopg_pool.ConnectionPool[Any],
        *,
        min_size: int,
        max_size: int,
        retry_for: float,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        psycopg, pool_mod = import_psycopg()
        self.psycopg = psycopg
        self.pool_timeout: type[Exception] = pool_mod.PoolTimeout
        self.retry_for = retry_for
        self.closing = threading.Event()
        self.retries = 0
        self._used: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        kwargs = {**KEEPALIVES, "autocommit": True, **(connect_kwargs or {})}
        if isinstance(dsn_or_pool, str):
            self.dsn = dsn_or_pool
            self.connect_kwargs = kwargs
            self.pool = pool_mod.ConnectionPool(
                dsn_or_pool,
                min_size=min_size,
                max_size=max_size,
                kwargs=kwargs,
                check=self._check,
                name="steerable-pg-pool",
                open=False,
                timeout=max(1.0, retry_for),
            )
            self.owned = True
            try:
                self.pool.open(wait=True, timeout=max(1.0, retry_for))
            except Exception as exc:  # noqa: BLE001 - PoolTimeout, or the server's refusal
                self.pool.close()
                raise unavailable(
                    f"cannot connect to PostgreSQL: {exc}", exc, dsn=_redacted(dsn_or_pool)
                ) from None
        elif isinstance(dsn_or_pool, pool_mod.ConnectionPool):
            self.pool = dsn_or_pool
            self.dsn = dsn_or_pool.conninfo
            self.connect_kwargs = {**KEEPALIVES, **dict(dsn_or_pool.kwargs or {})}
            self.connect_kwargs["autocommit"] = True
            self.owned = False
        else:
            raise TypeError(
                "PostgresStore takes a connection string or a psycopg_pool.ConnectionPool, "
                f"not {type(dsn_or_pool).__name__}"
            )

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's health check of a connection it hands out (see CHECK_AFTER)."""
        used = self._used.get(conn)
        if used is None or time.monotonic() - used > CHECK_AFTER or conn.closed:
            type(self.pool).check_connection(conn)

    def connect(self) -> psycopg.Connection[Any]:
        """A connection outside the pool (the listener), autocommit, keepalives on."""
        conn: psycopg.Connection[Any] = self.psycopg.connect(self.dsn, **self.connect_kwargs)
        return conn

    def run(
        self,
        work: Callable[[psycopg.Connection[Any]], _T],
        *,
        what: str,
        budget: float | None = None,
        read_only: bool = False,
        bare: bool = False,
    ) -> _T:
        """`work(conn)` in one transaction, retried on a fresh connection while it fails
        transiently, for `budget` seconds (default `retry_for`).

        `bare`: `work` runs on the autocommit connection as it is (one statement: its own
        transaction; or `work` makes its own). `pipelined` sends a list of statements known
        in advance in one round trip.

        `work` must be safe to run again: a commit whose answer was lost with its connection
        may have landed (every write of the store is an upsert, or checks what is stored).

        Raises:
            SteerableError: `store_unavailable` once the failure is not transient or the
                budget is spent (the underlying error in its details).
        """
        limit = self.retry_for if budget is None else budget
        started = time.monotonic()
        deadline = started + limit
        backoff = _FIRST_BACKOFF
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._attempt(work, read_only, deadline, bare)
            except self.psycopg.Error as exc:
                now = time.monotonic()
                if transient(exc) and now < deadline and not self.closing.is_set():
                    self.retries += 1
                    _log.warning("postgres_retry", what=what, attempt=attempt, error=str(exc))
                    self.closing.wait(min(backoff, max(0.0, deadline - now)))
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                seconds = round(now - started, 3)
                _log.error(
                    "postgres_given_up",
                    what=what,
                    attempts=attempt,
                    seconds=seconds,
                    error=str(exc),
                )
                raise unavailable(
                    f"PostgreSQL {what} failed ({exc}); given up after {attempt} attempts in "
                    f"{seconds}s",
                    exc,
                    attempts=attempt,
                    transient=transient(exc),
                    sqlstate=getattr(exc, "sqlstate", None),
                ) from None

    def _attempt(
        self,
        work: Callable[[psycopg.Connection[Any]], _T],
        read_only: bool,
        deadline: float,
        bare: bool = False,
    ) -> _T:
        """One try: a pooled connection, or a direct one when the pool has none to give soon.

        After a storm of dropped connections the pool refills itself with growing backoff;
        a store operation does not wait for that (a local connect takes milliseconds).
        """
        wait = min(_POOL_WAIT, max(0.01, deadline - time.monotonic()))
        try:
            conn = self.pool.getconn(timeout=wait)
        except self.pool_timeout:
            direct = self.connect()
            try:
                return work(direct) if bare else self._transaction(direct, work, read_only)
            finally:
                direct.close()
        try:
            result = work(conn) if bare else self._transaction(conn, work, read_only)
            self._used[conn] = time.monotonic()  # only a connection that just worked
            return result
        finally:
            self.pool.putconn(conn)  # a broken connection is discarded and replaced

    def pipelined(
        self,
        statements: Sequence[tuple[str, Sequence[Any]]],
        *,
        what: str,
        budget: float | None = None,
    ) -> list[tuple[int, list[tuple[Any, ...]] | None]]:
        """Run `statements` as one transaction in pipeline mode: they go to the server
        together (with `BEGIN` and `COMMIT` when there are several) and are answered in one
        round trip. Returns each one's row count and rows (None: it returns none). Retried as
        `run` retries (every statement must be safe to run again).

        Raises:
            SteerableError: `store_unavailable`, as `run`.
        """
        return self.run(
            lambda conn: self._pipeline(conn, statements), what=what, budget=budget, bare=True
        )

    def _pipeline(
        self, conn: psycopg.Connection[Any], statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[tuple[int, list[tuple[Any, ...]] | None]]:
        several = len(statements) > 1  # one statement alone is its own transaction
        try:
            with conn.pipeline():
                if several:
                    conn.execute("BEGIN")
                cursors = [conn.execute(sql.encode(), params) for sql, params in statements]
                if several:
                    conn.execute("COMMIT")
            return [
                (cur.rowcount, cur.fetchall() if cur.description is not None else None)
                for cur in cursors
            ]
        except BaseException:
            # A failed statement leaves the transaction aborted (the server skipped the rest,
            # COMMIT included): roll it back before the connection goes back to the pool.
            if not conn.closed and conn.info.transaction_status != 0:
                try:
                    conn.execute("ROLLBACK")
                except self.psycopg.Error:
                    conn.close()
            raise

    @staticmethod
    def _transaction(
        conn: psycopg.Connection[Any],
        work: Callable[[psycopg.Connection[Any]], _T],
        read_only: bool,
    ) -> _T:
        with conn.transaction():
            if read_only:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return work(conn)

    def close(self) -> None:
        """Close the pool if this object made it."""
        self.closing.set()
        if self.owned:
            self.pool.close()


def _redacted(dsn: str) -> str:
    """The DSN without its password (errors and logs never carry one in clear)."""
    import re

    out = re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", out)
