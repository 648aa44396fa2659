"""The checkpoint record (R21, R22): a small state snapshot plus the transcript entries added
since the previous revision, so that writing one costs O(1) in the run's length (R25 hybrid)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Record
from ._capabilities import CapabilitySnapshot
from ._config import RunConfig
from ._decisions import Usage
from ._errors import AgentError
from ._messages import HostMessage, TranscriptEntry
from ._outcome import RunMetrics
from ._state import RunState, WaitingFor

__all__ = [
    "CallStatus",
    "Checkpoint",
    "Compatibility",
    "ForkOrigin",
    "PlannedCall",
    "RunSnapshot",
]


class Compatibility(Record):
    """Host-supplied fingerprints compared before a resume (R22).

    Attributes:
        task_version: The version of the task definition the run was started for.
        policy: A hash or name of the policy in force.
        profile: A hash or name of the agent profile (prompt, model settings).
        input_artifacts: Artifact name -> content hash of the inputs the run was given.
    """

    task_version: str = ""
    policy: str = ""
    profile: str = ""
    input_artifacts: dict[str, str] = Field(default_factory=dict)

    def differences(self, other: Compatibility) -> list[str]:
        """Human-readable differences from `other` (empty when equal)."""
        out = [
            f"{name} changed: {getattr(self, name)!r} -> {getattr(other, name)!r}"
            for name in ("task_version", "policy", "profile")
            if getattr(self, name) != getattr(other, name)
        ]
        if self.input_artifacts != other.input_artifacts:
            out.append(
                "input artifacts changed: "
                f"{sorted(self.input_artifacts.items())} -> "
                f"{sorted(other.input_artifacts.items())}"
            )
        return out


class CallStatus(StrEnum):
    """Where one planned call stands."""

    PENDING = "pending"
    """Keyed, not yet dispatched (waiting for a free parallel slot)."""
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    """Dispatched (or retrying); no result recorded."""
    DONE = "done"
    """Its result is recorded."""


class PlannedCall(Record):
    """One call of the current plan, with its idempotency key (assigned before dispatch, R4)."""

    call_id: str
    kind: str
    """"tool" or "subagent"."""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str
    status: CallStatus = CallStatus.PENDING
    attempts: int = 0
    child_run_id: str | None = None


class ForkOrigin(Record):
    """Where a forked run came from."""

    run_id: str
    revision: int


class RunSnapshot(Record):
    """A run's state at a safe boundary, without its transcript."""

    run_id: str
    revision: int = Field(ge=0)
    trace_id: str
    session_id: str | None = None
    task_id: str | None = None
    parent_run_id: str | None = None
    depth: int = 0
    forked_from: ForkOrigin | None = None
    task: str
    agent: str
    state: RunState
    waiting_for: WaitingFor | None = None
    config: RunConfig
    capabilities: CapabilitySnapshot
    compatibility: Compatibility = Field(default_factory=Compatibility)
    model_calls: int = 0
    model_retries: int = 0
    """Consecutive retries of the current model call after `provider_timeout`."""
    steps: int = 0
    usage: Usage = Field(default_factory=Usage)
    decisions: int = 0
    transcript_len: int = 0
    last_seq: int = -1
    """The highest host-message seq accepted into the run's inbox."""
    delivered_seq: int = -1
    """The highest seq applied (delivered to the agent or acted on)."""
    pending_messages: tuple[HostMessage, ...] = ()
    """Accepted host messages not yet applied, in seq order."""
    plan: tuple[PlannedCall, ...] = ()
    errors: tuple[AgentError, ...] = ()
    output: Any = None
    metrics: RunMetrics = Field(default_factory=RunMetrics)
    deadline_left: float | None = None
    """Seconds of `total_timeout` left at this boundary, negative when already overdue (None:
    no total timeout)."""
    created_at: float = 0.0
    updated_at: float = 0.0


class Checkpoint(Record):
    """One revision of a run: its snapshot and the transcript entries since the last revision.

    `entries` are `transcript[entries_from:entries_from + len(entries)]`; a full checkpoint has
    `entries_from == 0`. Loading a revision concatenates the entries of every revision up to it.
    """

    snapshot: RunSnapshot
    entries_from: int = Field(default=0, ge=0)
    entries: tuple[TranscriptEntry, ...] = ()
