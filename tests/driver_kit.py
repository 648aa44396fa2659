"""Running a crash-driver subprocess: read its line protocol until "ready", then SIGKILL it.

Shared by the resume and subagent durability tests (tests/crash_drivers/*.py print one fact per
line: `started ...`, `sent ...`, `run ...`, then `ready`).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

DRIVER_WAIT = 30.0  # generous fail-instead-of-hang bound for a driver subprocess


def run_driver(argv: Sequence[str], on_line: Callable[[str], None]) -> str:
    """Run `python argv...`, pass each stdout line to `on_line` until "ready" or EOF, then
    SIGKILL the process (if it has not killed itself) and return its stderr.

    Raises:
        AssertionError: the driver did not end by SIGKILL (its stderr is the message).
    """
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    reader = threading.Thread(target=pump, name="driver-reader", daemon=True)
    reader.start()
    try:
        while True:
            line = lines.get(timeout=DRIVER_WAIT)
            if line is None or line == "ready":
                break
            on_line(line)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(DRIVER_WAIT)
        reader.join(DRIVER_WAIT)
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL, stderr
    return stderr
