"""Module-level Ray tools for tests/test_ray.py (Ray workers import them by name)."""

from __future__ import annotations

import os
import time
from typing import Any

from steerable.actors import ToolContext, tool


@tool(executor="ray", num_cpus=1)
def ray_whoami(ctx: ToolContext, note: str = "") -> dict[str, Any]:
    """Where and with what context the task ran."""
    return {
        "pid": os.getpid(),
        "note": note,
        "call_id": ctx.call_id,
        "idempotency_key": ctx.idempotency_key,
        "remaining": ctx.remaining(),
    }


@tool(executor="ray")
def ray_sleeper() -> str:
    """Ignores cancellation: sleeps an hour."""
    time.sleep(3600)
    return "woke"


@tool(executor="ray", timeout=1.0)
def ray_slow() -> str:
    """Times out (1 s) while sleeping an hour."""
    time.sleep(3600)
    return "woke"


@tool(executor="ray")
def ray_raises(message: str) -> str:
    """Raises ValueError(message) in the task."""
    raise ValueError(message)


@tool(executor="ray")
def ray_noop() -> None:
    """Nothing, as a Ray task (the overhead benchmark)."""
