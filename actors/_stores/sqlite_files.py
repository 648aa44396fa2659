"""SqliteStore's files and failures: private files and folders, which write errors are worth
retrying, the `store_unavailable` error, and telling waiters how their write went."""

from __future__ import annotations

import os
import sqlite3
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import AgentError, ErrorCode, SteerableError

__all__ = [
    "full_disk",
    "notify_failed",
    "notify_stored",
    "private_dirs",
    "private_file",
    "transient",
    "unavailable",
]

_log = get_logger("steerable.sqlite")

_TRANSIENT = frozenset({5, 6, 13})
"""SQLite primary result codes worth retrying: SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL."""
_TRANSIENT_TEXT = ("locked", "busy", "full")
_SQLITE_FULL = 13


def transient(exc: BaseException) -> bool:
    """Whether a failed write may succeed if tried again (a lock, a full disk)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _TRANSIENT
    text = str(exc).lower()
    return any(word in text for word in _TRANSIENT_TEXT)


def full_disk(exc: BaseException) -> bool:
    """Whether a failed write was refused for want of space (SQLITE_FULL): a fault worth
    counting, where a lock or busy error is another connection's turn."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == _SQLITE_FULL
    return "full" in str(exc).lower()


def unavailable(message: str, cause: BaseException | None = None, **details: Any) -> SteerableError:
    """The `store_unavailable` error, with the underlying error in its details."""
    if cause is not None:
        details.setdefault("cause", f"{type(cause).__name__}: {cause}")
        name = getattr(cause, "sqlite_errorname", None)
        if isinstance(name, str):
            details.setdefault("sqlite_error", name)
    return SteerableError(AgentError.of(ErrorCode.STORE_UNAVAILABLE, message, **details))


def private_dirs(folder: Path) -> None:
    """Create `folder` and any missing parent 0700, whatever the umask (XDG base-directory
    spec); folders that exist keep their mode."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another process: its mode is its creator's
        os.chmod(created, 0o700)  # mkdir's mode is masked by the umask


def private_file(path: Path) -> None:
    """Create the database file 0600 if it is missing: SQLite gives its `-wal` and `-shm`
    files the mode of the database file, so transcripts are never readable by others."""
    if path.exists():
        return
    private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)  # os.open's mode is masked by the umask
    finally:
        os.close(fd)


def notify_stored(done: Any) -> None:
    """Tell a write's waiter (a Future, or an `on_stored` callable) it is stored."""
    if isinstance(done, Future):
        if not done.done():
            done.set_result(None)
    elif done is not None:
        try:
            done()  # on_stored: a tell to the run that waits for this revision
        except Exception:  # noqa: BLE001 - the writer must go on
            _log.error("on_stored_failed", exc_info=True)


def notify_failed(done: Any, failed: Any, error: SteerableError) -> None:
    """Tell a write's waiter (a Future, or its `on_failed` callable) it was given up."""
    if isinstance(done, Future):
        if not done.done():
            done.set_exception(error)
    elif failed is not None:
        try:
            failed(error.error)  # on_failed: a tell to the run whose write this was
        except Exception:  # noqa: BLE001 - the writer must go on
            _log.error("on_failed_failed", exc_info=True)
