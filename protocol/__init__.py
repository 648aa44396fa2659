"""steerable.protocol: pure data that crosses a boundary.

Frozen pydantic v2 models and enums for ids, states, decisions, inbox messages, transcript
entries, errors, config, events and checkpoints, plus the msgpack codec. No threads, and no
I/O besides the codec; nothing here imports pykka, structlog or `steerable.actors`.
"""

from ._capabilities import AgentSpec, CapabilitySnapshot, SideEffect, ToolSpec
from ._checkpoint import (
    CallStatus,
    Checkpoint,
    Compatibility,
    ForkOrigin,
    PlannedCall,
    RunSnapshot,
)
from ._config import RetryPolicy, RunConfig, SteeringMode
from ._decisions import AskUser, Decision, Finish, Plan, SubagentCall, ToolCall, Usage
from ._errors import AgentError, ErrorCode, SteerableError
from ._events import HOOK_EVENTS, EventKind, HookName, Phase, RunEvent
from ._frozen import FrozenDict, FrozenList
from ._ids import new_run_id, new_trace_id
from ._messages import (
    ApprovalDecision,
    ApprovalRequest,
    CancelRequest,
    DecisionEntry,
    HostMessage,
    SubagentResult,
    SystemNote,
    ToolResult,
    TranscriptEntry,
    UserMessage,
)
from ._outcome import RunMetrics, RunOutcome
from ._state import RunState, WaitingFor
from ._stored import StoredRun
from ._view import Budgets, ModelCall, RunView, Transcript

__all__ = [
    "HOOK_EVENTS",
    "AgentError",
    "AgentSpec",
    "ApprovalDecision",
    "ApprovalRequest",
    "AskUser",
    "Budgets",
    "CallStatus",
    "CancelRequest",
    "CapabilitySnapshot",
    "Checkpoint",
    "Compatibility",
    "Decision",
    "DecisionEntry",
    "ErrorCode",
    "EventKind",
    "Finish",
    "ForkOrigin",
    "FrozenDict",
    "FrozenList",
    "HookName",
    "HostMessage",
    "ModelCall",
    "Phase",
    "Plan",
    "PlannedCall",
    "RetryPolicy",
    "RunConfig",
    "RunEvent",
    "RunMetrics",
    "RunOutcome",
    "RunSnapshot",
    "RunState",
    "RunView",
    "SideEffect",
    "SteerableError",
    "SteeringMode",
    "StoredRun",
    "SubagentCall",
    "SubagentResult",
    "SystemNote",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Transcript",
    "TranscriptEntry",
    "Usage",
    "UserMessage",
    "WaitingFor",
    "new_run_id",
    "new_trace_id",
]
