"""What a runtime can do: tool and agent specs, and the snapshot a resume compares (R22)."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Record

__all__ = ["AgentSpec", "CapabilitySnapshot", "SideEffect", "ToolSpec", "schema_hash"]


class SideEffect(StrEnum):
    """How a tool touches the world; decides retries and re-dispatch after a crash (R16, R21)."""

    NONE = "none"
    """Reads only: safe to retry and to run again."""
    IDEMPOTENT = "idempotent"
    """Writes, but running it twice with the same idempotency key has one effect."""
    WRITE = "write"
    """Writes; running it twice may do it twice. Never retried after a timeout."""


def schema_hash(schema: dict[str, Any]) -> str:
    """A stable short hash of a JSON schema (canonical JSON, sha256, 16 hex digits)."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ToolSpec(Record):
    """The description of one tool, as models and capability snapshots see it.

    Attributes:
        name: The name plans use to call the tool.
        description: What the tool does (the function's docstring by default).
        side_effect: How it touches the world.
        timeout: Seconds one call may take; None uses the run's `step_timeout`.
        requires_approval: Whether each call waits for a person's approval.
        honors_idempotency_key: The tool deduplicates by `ctx.idempotency_key`, so a write
            may be re-dispatched after a crash with the same key.
        version: The tool author's version string, compared on resume.
        json_schema: JSON schema of the arguments, as pydantic gives it (its hash is part
            of the capability snapshot).
        argument_descriptions: Argument name -> description, from the docstring's `Args:`
            section; model adapters merge them into the schema they send. Kept apart from
            `json_schema` so that editing a docstring never blocks a resume.
    """

    name: str
    description: str = ""
    side_effect: SideEffect = SideEffect.NONE
    timeout: float | None = Field(default=None, gt=0)
    requires_approval: bool = False
    honors_idempotency_key: bool = False
    version: str = "1"
    json_schema: dict[str, Any] = Field(default_factory=dict)
    argument_descriptions: dict[str, str] = Field(default_factory=dict)

    @property
    def schema_hash(self) -> str:
        """A stable hash of `json_schema`."""
        return schema_hash(self.json_schema)

    @property
    def redispatch_safe(self) -> bool:
        """Whether a call without a recorded result may run again with the same key."""
        return self.side_effect is not SideEffect.WRITE or self.honors_idempotency_key


class AgentSpec(Record):
    """An agent (decider) as a capability snapshot records it."""

    name: str
    version: str = "1"


class CapabilitySnapshot(Record):
    """The tools and agents a run was started with, compared before a resume (R22).

    Attributes:
        tools: name -> "version:side_effect:schema_hash" for every tool.
        agents: name -> version for the run's agent and every registered subagent.
    """

    tools: dict[str, str] = Field(default_factory=dict)
    agents: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, tools: list[ToolSpec], agents: list[AgentSpec]) -> CapabilitySnapshot:
        """Build the snapshot of the given specs."""
        return cls(
            tools={t.name: f"{t.version}:{t.side_effect}:{t.schema_hash}" for t in tools},
            agents={a.name: a.version for a in agents},
        )

    def differences(self, other: CapabilitySnapshot) -> list[str]:
        """Human-readable differences from `other` (empty when compatible)."""
        out: list[str] = []
        for kind, mine, theirs in (
            ("tool", self.tools, other.tools),
            ("agent", self.agents, other.agents),
        ):
            for name in sorted(mine.keys() | theirs.keys()):
                a, b = mine.get(name), theirs.get(name)
                if a == b:
                    continue
                if a is None:
                    out.append(f"{kind} {name!r} is new ({b})")
                elif b is None:
                    out.append(f"{kind} {name!r} is missing (was {a})")
                else:
                    out.append(f"{kind} {name!r} changed: {a} -> {b}")
        return out
