"""The worker side of the process pool: the loop a warm worker process runs (docs/isolation.md).

This module is what the forkserver preloads, so it imports only the standard library, msgpack
and the cancel scope. A worker runs one call at a time on its main thread; a reader thread
takes the host's messages (the next call, a cooperative cancel) and notices the host's death.

The wire (a duplex `multiprocessing` pipe), msgpack arrays both ways:

- host -> worker: `["call", n, entry, payload, remaining, limits]`, `["cancel", n, reason]`.
- worker -> host: `["ready", pid]`, `["done", n, payload]`, `["failed", n, message]`.

`entry` is `"module:function"`: the worker calls `function(payload, scope)` and sends back the
bytes it returns. The engine knows nothing of tools: the entry (in the tools layer) decodes the
payload, runs the tool and encodes its result; the host never unpickles what a worker sends.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from .cancel import CancelScope

__all__ = ["Entry", "resolve_entry", "worker_main"]

Entry = Callable[[bytes, CancelScope], bytes]
"""What a worker runs: `entry(payload, scope) -> result bytes`; it should not raise."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def resolve_entry(name: str) -> Entry:
    """Import `"module:function"` and return the function.

    Raises:
        ImportError: The module cannot be imported.
        AttributeError: The module has no such function.
    """
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn: Entry = obj
    return fn


def worker_main(conn: Any, host_pid: int, preload: Sequence[str] = ()) -> None:
    """The body of one worker process (the target of its `multiprocessing.Process`).

    Args:
        conn: The worker's end of its duplex pipe to the host.
        host_pid: The host's pid (for diagnostics).
        preload: Modules to import before reporting ready (a warm worker pays no imports).
    """
    # Our own process group, so that one SIGKILL of the group also ends the tool's children.
    os.setpgid(0, 0)
    _release_forkserver()
    _die_with_parent()
    for module in preload:
        # A module that fails here fails again, with its error, at the first call that needs it.
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    worker = _Worker(conn, host_pid)
    worker.serve()


def _release_forkserver() -> None:
    # A forkserver child inherits the host's end of the forkserver's "alive" pipe. Held here,
    # it keeps the forkserver alive after the host dies (the server exits on that pipe's EOF),
    # and with it the one thing that SIGKILLs a worker spinning in C code (below). Close it.
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(AttributeError):
            server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _die_with_parent() -> None:
    # Linux: the kernel SIGKILLs us when our parent (the forkserver, which exits when the host
    # does) dies, even while a tool spins in C code holding the GIL.
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class _Worker:
    def __init__(self, conn: Any, host_pid: int) -> None:
        self.conn = conn
        self.host_pid = host_pid
        self.send_lock = threading.Lock()
        self.calls: list[list[Any]] = []
        self.cond = threading.Condition(threading.Lock())
        self.current: tuple[int, CancelScope] | None = None
        self.entries: dict[str, Entry] = {}

    def send(self, message: list[Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        with self.send_lock:
            self.conn.send_bytes(data)

    def serve(self) -> None:
        reader = threading.Thread(target=self.read, name="steerable-procworker-reader", daemon=True)
        reader.start()
        self.send(["ready", os.getpid()])
        while True:
            with self.cond:
                while not self.calls:
                    self.cond.wait()
                call = self.calls.pop(0)
            self.run(call)

    def read(self) -> None:
        """The reader thread: calls go to the main thread, cancels to the running call."""
        try:
            while True:
                message = msgpack.unpackb(self.conn.recv_bytes(), raw=False)
                kind = message[0]
                if kind == "call":
                    with self.cond:
                        # Set before the main thread sees the call, so a cancel that follows
                        # the call on the wire always finds its scope.
                        self.current = (message[1], _scope(message[4]))
                        self.calls.append(message)
                        self.cond.notify()
                elif kind == "cancel":
                    current = self.current
                    if current is not None and current[0] == message[1]:
                        current[1].cancel(message[2])
        except (EOFError, OSError):
            pass
        # The host is gone (or closed the pipe): take the whole group down with us, so that
        # nothing a tool started outlives its host.
        _exit_group()

    def run(self, call: list[Any]) -> None:
        _, number, entry_name, payload, _remaining, limits = call
        current = self.current
        scope = current[1] if current is not None and current[0] == number else CancelScope()
        try:
            entry = self.entries.get(entry_name)
            if entry is None:
                entry = self.entries[entry_name] = resolve_entry(entry_name)
        except Exception as exc:  # noqa: BLE001 - reported to the host as a typed failure
            self.send(["failed", number, f"cannot import {entry_name!r}: {exc!r}"])
            return
        restore = _apply_limits(limits)
        failure = f"{entry_name} returned no bytes"
        try:
            result = entry(payload, scope)
        except BaseException as exc:  # noqa: BLE001 - the entry should not raise; contain it
            result = None
            failure = f"{entry_name} raised {type(exc).__name__}: {exc}"
        finally:
            restore()
            self.current = None
        if not isinstance(result, bytes):
            self.send(["failed", number, failure])
        else:
            self.send(["done", number, result])


def _scope(remaining: float | None) -> CancelScope:
    return CancelScope(None if remaining is None else time.monotonic() + remaining)


def _apply_limits(limits: dict[str, Any] | None) -> Callable[[], None]:
    """Lower the soft rlimits for one call; returns the function that restores them."""
    if not limits:
        return _nothing
    import resource

    saved: list[tuple[int, tuple[int, int]]] = []
    memory = limits.get("memory_limit")
    if memory is not None:
        saved.append(_lower(resource.RLIMIT_AS, int(memory)))
    cpu = limits.get("cpu_seconds")
    if cpu is not None:
        # RLIMIT_CPU counts the whole process's CPU time: allow this call `cpu` more seconds.
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = used.ru_utime + used.ru_stime
        saved.append(_lower(resource.RLIMIT_CPU, int(spent + float(cpu)) + 1))

    def restore() -> None:
        for which, old in reversed(saved):
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, old)

    return restore


def _lower(which: int, soft: int) -> tuple[int, tuple[int, int]]:
    import resource

    old = resource.getrlimit(which)
    hard = old[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))
    return which, old


def _nothing() -> None:
    return None


def _exit_group() -> None:
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)
    os._exit(0)
