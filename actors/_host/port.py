"""`RunPort`: the narrow port a `RunHandle` talks to (the run directory implements it).

A leaf module: the handle knows this protocol only, never the `Runtime` facade or the
directory, so the host side has no import cycle (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from steerable.protocol import HostMessage, SteeringMode

if TYPE_CHECKING:
    from .cell import RunCell
    from .offload import HostIO

__all__ = ["RunPort"]


class RunPort(Protocol):
    """What a handle needs of its runtime: a clock, a run's steering mode, and delivery."""

    def wall(self) -> float:
        """Wall-clock seconds now (stamped on host messages)."""
        ...

    def steering(self, run_id: str) -> SteeringMode:
        """The run's default steering mode (`RunConfig.steering`)."""
        ...

    def post(
        self,
        cell: RunCell,
        build: Callable[[int], HostMessage],
        store_it: Callable[[HostMessage], None] | None = None,
        *,
        message_id: str | None = None,
    ) -> HostMessage:
        """Accept a host message: seq, store, then deliver or wake (docs/steering.md).

        Raises:
            SteerableError: `run_ended` if the run is not live; `resource_exhausted` if a
                durable store has no revision of the run yet.
        """
        ...

    @property
    def host_io(self) -> HostIO:
        """Where the awaitable forms (`asend`, ...) run their blocking part."""
        ...

    def cancel_now(self, cell: RunCell, reason: str) -> None:
        """Tell the run's actor to cancel at once (its stored CancelRequest follows)."""
        ...
