"""Handing the GIL to a thread this one has just woken (docs/performance.md, "Wave 4: session 16").

A thread that wakes another (a future's result set, an event appended for a waiting reader)
and then goes on running Python keeps the GIL: the woken thread, runnable at once, waits until
this one blocks or a whole switch interval (5 ms) has passed. Where the woken thread is the
host (a `result()` caller, an event loop awaiting an outcome or reading events), that wait is
latency the host sees, while what this thread still has to do (a run's teardown, its next
step) is not waited for by anyone. `hand_over()` lets the GIL go once, so the host runs first.
"""

from __future__ import annotations

import time

__all__ = ["hand_over"]


def hand_over() -> None:
    """Give the GIL away once, to a thread this one has just woken; never blocks longer.

    A zero-length sleep releases the GIL around a system call, which is what lets a thread that
    waits for it take it (CPython hands the GIL on when its holder blocks, not when it asks).
    """
    time.sleep(0)  # noqa: TID251 - a yield of the GIL, not a wait: it returns at once
