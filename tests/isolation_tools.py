"""Module-level tools and helpers for the process-isolation tests (a worker imports them by name).

Tools report to the test through a `Beacon` (a unix socket the test listens on), so a test
synchronises on "the call started in pid N" instead of guessing with sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from steerable.actors import ToolContext, tool

WAIT = 20.0  # generous fail-instead-of-hang bound (workers start under load)


class Beacon:
    """A unix socket a tool connects to, to say one line (its pid, its context...)."""

    def __init__(self, directory: Path) -> None:
        # Socket paths are short (108 bytes): a short name in a short directory.
        self.address = str(directory / "b.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.address)
        self._server.listen(16)
        self._server.settimeout(WAIT)

    def wait(self) -> str:
        """The next line a tool said (raises TimeoutError after WAIT seconds)."""
        conn, _ = self._server.accept()
        with conn:
            conn.settimeout(WAIT)
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        return data.decode().strip()

    def close(self) -> None:
        self._server.close()


def say(address: str, text: str) -> None:
    """Tell the test's beacon one line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address)
        s.sendall(text.encode() + b"\n")


def wait_gone(pid: int, timeout: float = WAIT) -> bool:
    """Wait until process `pid` has exited and been reaped (no entry left in /proc)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)  # readable once it has exited
        if not ready:
            return False
    finally:
        os.close(fd)
    # Exited; its parent (the forkserver) reaps it on SIGCHLD: bounded wait for that.
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`, from the process table."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


# --- tools ------------------------------------------------------------------------------


@tool(isolation="process")
def whoami(ctx: ToolContext, note: str = "") -> dict[str, Any]:
    """Where and with what context the call ran."""
    return {
        "pid": os.getpid(),
        "note": note,
        "run_id": ctx.run_id,
        "call_id": ctx.call_id,
        "idempotency_key": ctx.idempotency_key,
        "attempt": ctx.attempt,
        "remaining": ctx.remaining(),
    }


@tool(isolation="process")
async def whoami_async(note: str = "") -> dict[str, Any]:
    """An async tool in a worker process."""
    await asyncio.sleep(0)
    return {"pid": os.getpid(), "note": note}


@tool(isolation="process")
def noop() -> None:
    """Nothing, in a worker process (the overhead benchmark)."""


@tool
def noop_thread() -> None:
    """Nothing, on a worker thread (the overhead benchmark's baseline)."""


@tool(isolation="process")
def cooperative(ctx: ToolContext, beacon: str) -> str:
    """Waits for its cancel signal, then stops on its own."""
    say(beacon, str(os.getpid()))
    ctx.wait(3600)
    ctx.raise_if_cancelled()
    return "not cancelled"


@tool(isolation="process")
def sleeper(beacon: str) -> str:
    """Ignores cancellation: sleeps an hour."""
    say(beacon, str(os.getpid()))
    time.sleep(3600)
    return "woke"


@tool(isolation="process")
def spinner(beacon: str) -> int:
    """Ignores cancellation in C code, holding the GIL: its reader thread never runs."""
    say(beacon, str(os.getpid()))
    return sum(range(10**12))


@tool(isolation="process")
def regex_spinner(beacon: str) -> bool:
    """A catastrophic regex: minutes in C code."""
    say(beacon, str(os.getpid()))
    return re.match(r"(a+)+$", "a" * 64 + "b") is not None


@tool(isolation="process")
def parent_of_sleeper(beacon: str) -> str:
    """Starts a child process (a grandchild of the pool), then sleeps."""
    child = subprocess.Popen(["sleep", "3600"])
    say(beacon, f"{os.getpid()} {child.pid}")
    time.sleep(3600)
    return "woke"


@tool(isolation="process", timeout=3.0)
def slow_timeout(beacon: str) -> str:
    """Times out (3 s: time enough to report its pid on a loaded machine) sleeping an hour."""
    say(beacon, str(os.getpid()))
    time.sleep(3600)
    return "woke"


@tool(isolation="process")
def exits(status: int) -> str:
    """Ends its worker with `os._exit(status)`."""
    os._exit(status)


@tool(isolation="process")
def segfaults() -> str:
    """Ends its worker with SIGSEGV."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3600)
    return "survived"


@tool(isolation="process", cpu_seconds=1)
def burns_cpu() -> int:
    """Spins past its one CPU second (RLIMIT_CPU: SIGXCPU)."""
    total = 0
    while True:
        total += 1


@tool(isolation="process", memory_limit=512 * 1024 * 1024)
def allocates(megabytes: int) -> int:
    """Allocates `megabytes` MB under a 512 MB address-space limit."""
    block = bytearray(megabytes * 1024 * 1024)
    return len(block)


@tool(isolation="process", max_result_bytes=100)
def big_result(size: int) -> str:
    """Returns `size` characters under a 100-byte result bound."""
    return "x" * size


@tool(isolation="process")
def opaque() -> object:
    """Returns an object that does not serialise."""
    return object()


@tool(isolation="process")
def raises(message: str) -> str:
    """Raises ValueError(message)."""
    raise ValueError(message)


def echo(payload: bytes, scope: Any) -> bytes:
    """A raw `ProcessPool` entry point: returns its payload with the worker's pid."""
    return payload + b" " + str(os.getpid()).encode()


def block(payload: bytes, scope: Any) -> bytes:
    """A raw entry that waits for its cancel scope (or an hour)."""
    cancelled = scope.wait(3600)
    return b"cancelled" if cancelled else b"timeout"


def deadline_of(payload: bytes, scope: Any) -> bytes:
    """A raw entry that reports its scope's remaining seconds."""
    left = scope.remaining(time.monotonic())
    return b"none" if left is None else str(left).encode()
