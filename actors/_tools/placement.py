"""Where a tool's calls run: the checks behind `@tool(isolation=..., executor=..., limits)`.

docs/isolation.md. A tool runs in the host (a worker thread, or the event loop for `async def`),
in the runtime's process pool (`isolation="process"`), or on a named executor (`executor="ray"`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "PROCESS", "check_importable", "check_placement"]

DEFAULT_MAX_RESULT_BYTES = 1_000_000
"""The largest tool result accepted by default, as msgpack bytes."""
PROCESS = "process"
"""The executor name of the runtime's own process pool."""


def check_placement(
    isolation: str,
    executor: str | None,
    memory_limit: int | None,
    cpu_seconds: float | None,
    max_result_bytes: int | None,
    num_cpus: float | None,
    resources: Mapping[str, float] | None,
) -> tuple[str | None, dict[str, Any], int]:
    """Check where a tool runs: `(executor or None, executor options, max_result_bytes)`."""
    if isolation not in ("thread", PROCESS):
        raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
    if executor is not None and (not isinstance(executor, str) or not executor):
        raise ValueError(f"executor must be a non-empty name, got {executor!r}")
    if isolation == PROCESS and executor not in (None, PROCESS):
        raise ValueError(f"isolation='process' runs in the process pool, not executor={executor!r}")
    where = PROCESS if isolation == PROCESS else executor
    options: dict[str, Any] = {}
    for key, value in (("memory_limit", memory_limit), ("cpu_seconds", cpu_seconds)):
        if value is None:
            continue
        if where != PROCESS:
            raise ValueError(f"{key} needs isolation='process'")
        options[key] = _positive(key, value)
    if (num_cpus is not None or resources is not None) and where in (None, PROCESS):
        raise ValueError("num_cpus and resources are executor options (e.g. executor='ray')")
    if num_cpus is not None:
        options["num_cpus"] = _positive("num_cpus", num_cpus, allow_zero=True)
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise TypeError(f"resources must be a mapping of name -> amount, got {resources!r}")
        options["resources"] = {
            str(k): _positive(f"resources[{k!r}]", v) for k, v in resources.items()
        }
    limit = (
        DEFAULT_MAX_RESULT_BYTES
        if max_result_bytes is None
        else int(_positive("max_result_bytes", max_result_bytes))
    )
    return where, options, limit


def _positive(key: str, value: Any, *, allow_zero: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} must be a number, got {value!r}")
    if not (value >= 0 if allow_zero else value > 0):  # also rejects NaN
        raise ValueError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def check_importable(fn: Callable[..., Any], name: str) -> None:
    # The worker finds the function by module and qualified name: it must be reachable so.
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise TypeError(
            f"tool {name!r}: an isolated tool must be a module-level function of an importable "
            f"module (the worker imports it by name), not {fn!r}"
        )
