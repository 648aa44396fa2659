"""An opt-in collector policy for a long-lived host (docs/host.md "Keeping the loop free").

A host that imports a web framework, a model SDK and steerable holds a few hundred thousand
long-lived objects. Every full (generation 2) collection walks all of them while holding the
GIL, so an asyncio loop in the same process stalls for tens of milliseconds whenever one runs
(W12 measures it: the worst tick lateness is the one full collection of the run).
`tune_gc()` moves what the host holds after startup out of the collector's sight
(`gc.freeze()`) and collects the youngest generation less often; steerable never calls it
itself: the collector is the host's, and so is the choice.
"""

from __future__ import annotations

import gc

__all__ = ["TUNED_THRESHOLD", "tune_gc"]

TUNED_THRESHOLD = (10_000, 20, 20)
"""`gc.set_threshold` values `tune_gc()` sets: a young collection every 10,000 net
allocations (CPython's default is 700), older generations as often as before relative to it."""


def tune_gc(
    threshold: tuple[int, int, int] = TUNED_THRESHOLD, *, freeze: bool = True
) -> tuple[int, int, int]:
    """Tune the process's collector for a long-lived host; returns the thresholds it replaced.

    Call it once, after startup imports and configuration, before serving. `freeze`: collect
    once, then `gc.freeze()` every object that survives, so full collections no longer walk
    them (they are never freed; objects made afterwards are collected as usual). Undo with
    `gc.set_threshold(*previous)` and `gc.unfreeze()`.
    """
    previous = gc.get_threshold()
    if freeze:
        gc.collect()
        gc.freeze()
    gc.set_threshold(*threshold)
    return previous
