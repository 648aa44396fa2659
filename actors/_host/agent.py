"""`Agent`: what the runtime calls to decide a run's next step."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from steerable.protocol import AskUser, Finish, Plan, RunView

__all__ = ["Agent", "agent_name"]


@runtime_checkable
class Agent(Protocol):
    """An object that decides: `decide(view)` returns (or, if `async def`, awaits to) a
    `Plan`, a `Finish` or an `AskUser`.

    `decide` runs on a worker (or, when it is a coroutine function, on the runtime's event
    loop), never on a supervisor's thread, so a slow model delays neither steering nor
    cancellation. An optional `name` attribute names the agent in checkpoints and capability
    snapshots; without one, the class name is used. A dict in the JSON shape of a decision
    is accepted too; anything else ends the run in ERROR (`invalid_decision`).
    """

    def decide(
        self, view: RunView, /
    ) -> Plan | Finish | AskUser | Awaitable[Plan | Finish | AskUser]:
        """The next step of the run, given what it has seen so far."""
        ...


def agent_name(agent: object) -> str:
    """The agent's `name` attribute if it is a non-empty string, else its class name."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else type(agent).__name__
