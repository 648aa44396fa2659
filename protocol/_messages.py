"""Inbox messages and transcript entries: what enters a run, and what the agent sees of it.

Host messages (user messages, approvals, cancels) carry the inbox `seq` assigned when they
were accepted; tool and subagent results are correlated by `call_id`. The same records serve
the inbox, the transcript, the checkpoint and replay (docs/pykka.md T13).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._config import SteeringMode
from ._decisions import Decision
from ._errors import AgentError
from ._state import RunState

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "CancelRequest",
    "DecisionEntry",
    "HostMessage",
    "SubagentResult",
    "SystemNote",
    "ToolResult",
    "TranscriptEntry",
    "UserMessage",
]

from ._base import Record
from ._frozen import FrozenAny, FrozenDict, FrozenMap


class UserMessage(Record):
    """A person's message to a run (steering, or the answer to AskUser)."""

    kind: Literal["user"] = "user"
    seq: int = Field(ge=0)
    content: str
    mode: SteeringMode = SteeringMode.QUEUE
    at: float = 0.0
    """Wall-clock seconds when it was accepted."""


class ApprovalDecision(Record):
    """A person's approval or denial of one pending call."""

    kind: Literal["approval"] = "approval"
    seq: int = Field(ge=0)
    call_id: str
    approved: bool
    reason: str = ""
    at: float = 0.0


class CancelRequest(Record):
    """A request to cancel the run (and its descendants)."""

    kind: Literal["cancel"] = "cancel"
    seq: int = Field(ge=0)
    reason: str = "cancelled"
    at: float = 0.0


HostMessage = Annotated[UserMessage | ApprovalDecision | CancelRequest, Field(discriminator="kind")]
"""A message a host sends into a run's durable inbox; `seq` orders them."""


class ToolResult(Record):
    """The result of one tool call: a value, or an error the agent sees (R7)."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    tool: str
    ok: bool
    value: FrozenAny = None
    error: AgentError | None = None
    attempts: int = 1
    duration: float = 0.0
    """Seconds from first dispatch to result."""


class SubagentResult(Record):
    """The end of a child run, as its parent sees it."""

    kind: Literal["subagent_result"] = "subagent_result"
    call_id: str
    agent: str
    child_run_id: str
    state: RunState
    ok: bool
    output: FrozenAny = None
    error: AgentError | None = None
    child_revision: int = -1
    """The child's final revision (its checkpoint at this result); -1 if the child never
    started or was given up on. With `child_run_id` it pins the whole tree at a parent revision."""


class DecisionEntry(Record):
    """A decision the agent made (model call number `model_call`)."""

    kind: Literal["decision"] = "decision"
    model_call: int
    decision: Decision


class SystemNote(Record):
    """A note from the runtime to the agent: a rejected Finish, a resume, a budget warning."""

    kind: Literal["system"] = "system"
    text: str
    data: FrozenMap = Field(default_factory=FrozenDict)


TranscriptEntry = Annotated[
    UserMessage | DecisionEntry | ToolResult | SubagentResult | SystemNote,
    Field(discriminator="kind"),
]
"""One entry of a run's transcript, in the order the run saw it."""


class ApprovalRequest(Record):
    """A call parked until a person approves or denies it."""

    call_id: str
    tool: str
    arguments: FrozenMap = Field(default_factory=FrozenDict)
    run_id: str = ""
