"""Store faults for tests: an injected failing connection, real tmpfs mounts, a real lock.

- `FaultyStore` is a `SqliteStore` whose writer connection raises, at COMMIT, the errors SQLite
  raises for a full disk, a lock or a read-only file, as many times as a test arms it. It is
  deterministic: the tests of exact sequences (retried then stored, given up, refused) use it.
- `tmpfs()` mounts a real, small tmpfs (root only: CI runs as root; with CI=true a failure to
  mount fails the test instead of skipping it), for a disk that really fills up and a file
  system that is really read-only.
- `Locker` is a second process holding `BEGIN EXCLUSIVE` on a database until told to let go.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from steerable.actors import SqliteStore

WAIT = 30.0  # generous fail-instead-of-hang bound
CI = os.environ.get("CI", "").lower() == "true"


def sqlite_error(text: str, code: int, name: str) -> sqlite3.OperationalError:
    """An OperationalError as sqlite3 raises it (with its result code and name)."""
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code
    exc.sqlite_errorname = name
    return exc


def disk_full() -> sqlite3.OperationalError:
    return sqlite_error("database or disk is full", 13, "SQLITE_FULL")


def locked() -> sqlite3.OperationalError:
    return sqlite_error("database is locked", 5, "SQLITE_BUSY")


def read_only() -> sqlite3.OperationalError:
    return sqlite_error("attempt to write a readonly database", 8, "SQLITE_READONLY")


class Faults:
    """What the writer's COMMIT raises next: `times` failures (None: until disarmed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: sqlite3.OperationalError | None = None
        self._times: int | None = 0
        self.failures = 0
        self.commits = 0
        self.failed = threading.Event()

    def arm(self, error: sqlite3.OperationalError, times: int | None = None) -> None:
        with self._lock:
            self._error = error
            self._times = times

    def disarm(self) -> None:
        with self._lock:
            self._error = None

    def on_commit(self) -> None:
        with self._lock:
            error = self._error
            if error is None or self._times == 0:
                self.commits += 1
                return
            if self._times is not None:
                self._times -= 1
            self.failures += 1
        self.failed.set()
        raise error


class FaultyConnection:
    """The writer's connection, raising what `faults` says at COMMIT (the transaction is left
    open, as after a real failed COMMIT: the store must roll it back)."""

    def __init__(self, conn: sqlite3.Connection, faults: Faults) -> None:
        self._conn = conn
        self._faults = faults

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self._faults.on_commit()
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class FaultyStore(SqliteStore):
    """A SqliteStore whose writer connection fails on command (see `Faults`)."""

    def __init__(self, path: Path, **options: Any) -> None:
        self.faults = Faults()
        super().__init__(path, **options)

    def _open(self) -> sqlite3.Connection:
        return cast(sqlite3.Connection, FaultyConnection(super()._open(), self.faults))


def until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait until `predicate()` holds (checked every few ms); fail after `timeout` seconds."""
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout}s")
        tick.wait(0.005)


def retrying(store: SqliteStore) -> Callable[[], bool]:
    """Whether the store's writer has retried a failed write."""
    return lambda: store.statistics()["write_retries"] > 0


class Tmpfs:
    """Mounts small tmpfs file systems under a folder; unmounts them at the end."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._mounts: list[Path] = []

    def mount(self, size: str = "2m") -> Path:
        where = self._base / f"tmpfs{len(self._mounts)}"
        where.mkdir()
        try:
            proc = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                capture_output=True,
                text=True,
                check=False,
            )
            failure = proc.stderr.strip() if proc.returncode else ""
        except OSError as exc:
            failure = str(exc)
        if failure:
            if CI:
                pytest.fail(f"CI must be able to mount a tmpfs (it runs as root): {failure}")
            pytest.skip(f"cannot mount a tmpfs here ({failure}); CI runs this as root")
        self._mounts.append(where)
        return where

    def read_only(self, where: Path) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    def close(self) -> None:
        for where in reversed(self._mounts):
            # Lazy: a reader connection some runtime thread opened may still hold a file.
            subprocess.run(["umount", "-l", str(where)], check=False)
        self._mounts.clear()


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte; returns the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                continue
    return filler


_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
print("released", flush=True)
"""


class Locker:
    """A second process that holds `BEGIN EXCLUSIVE` on `path` from `hold()` to `release()`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._proc: subprocess.Popen[str] | None = None

    def hold(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(self._path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        assert self._proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        proc.wait(WAIT)
        proc.stdin.close()
        proc.stdout.close()
