"""steerable.actors: everything that runs.

The pykka actors (`RunSupervisor`, `ToolWorker`), the `Runtime` facade a host embeds, tools,
stores and the CLI. Test helpers live in `steerable.actors.testing`.
"""

from ._cancel import Cancelled, CancelScope
from ._clock import Clock, ManualClock, SystemClock
from ._events import EventStream
from ._handle import RunHandle
from ._pool import ToolWorker
from ._replay import Replay
from ._runtime import Runtime, RunTree
from ._sqlite import SqliteStore
from ._store import CheckpointStore, MemoryStore, RevisionInfo, RunSummary, StoredRun
from ._supervisor import RunSupervisor
from ._tool import (
    RetryableToolError,
    Tool,
    ToolArgumentsError,
    ToolContext,
    tool,
)

__all__ = [
    "CancelScope",
    "Cancelled",
    "CheckpointStore",
    "Clock",
    "EventStream",
    "ManualClock",
    "MemoryStore",
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
