"""steerable.actors: everything that runs.

The pykka actors (`RunSupervisor`, `ChildRun` for subagents, `ToolWorker`), the `Runtime`
facade a host embeds, tools, stores and the CLI. Test helpers live in `steerable.actors.testing`.
"""

from ._engine.cancel import Cancelled, CancelScope
from ._engine.clock import Clock, ManualClock, SystemClock
from ._engine.executor import Executor, OutcomeKind, RemoteHandle, RemoteOutcome, RemoteTask
from ._engine.pool import ToolWorker
from ._engine.rayexec import RayExecutor
from ._host.agent import Agent
from ._host.childrun import ChildRun
from ._host.events import EventStream
from ._host.handle import RunHandle
from ._host.runtime import Runtime, RunTree
from ._host.supervisor import RunSupervisor
from ._stores.replay import Replay
from ._stores.sqlite import SqliteStore
from ._stores.store import CheckpointStore, MemoryStore, RevisionInfo, RunSummary, StoredRun
from ._tools.tool import (
    RetryableToolError,
    Tool,
    ToolArgumentsError,
    ToolContext,
    tool,
)

__all__ = [
    "Agent",
    "CancelScope",
    "Cancelled",
    "CheckpointStore",
    "ChildRun",
    "Clock",
    "EventStream",
    "Executor",
    "ManualClock",
    "MemoryStore",
    "OutcomeKind",
    "RayExecutor",
    "RemoteHandle",
    "RemoteOutcome",
    "RemoteTask",
    "Replay",
    "RetryableToolError",
    "RevisionInfo",
    "RunHandle",
    "RunSummary",
    "RunSupervisor",
    "RunTree",
    "Runtime",
    "SqliteStore",
    "StoredRun",
    "SystemClock",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolWorker",
    "tool",
]
