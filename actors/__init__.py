"""steerable.actors: everything that runs.

The pykka actors (`RunSupervisor`, `ChildRun` for subagents, `ToolWorker`), the `Runtime`
facade a host embeds, tools, stores, observability (the event feed, OpenTelemetry bridges,
timelines) and the CLI. Test helpers live in `steerable.actors.testing`.
"""

from typing import TYPE_CHECKING, Any

from ._engine.cancel import Cancelled, CancelScope
from ._engine.clock import Clock, ManualClock, SystemClock
from ._engine.executor import Executor, OutcomeKind, RemoteHandle, RemoteOutcome, RemoteTask
from ._engine.pool import ToolWorker
from ._engine.rayexec import RayExecutor
from ._host.agent import Agent
from ._host.childrun import ChildRun
from ._host.event_stream import EventStream
from ._host.handle import RunHandle
from ._host.runtime import Runtime, RunTree
from ._host.supervisor import RunSupervisor
from ._observe.feed import FeedStream
from ._stores.memory import MemoryStore
from ._stores.postgres import PostgresStore
from ._stores.replay import Replay
from ._stores.sqlite import SqliteStore
from ._stores.store import CheckpointStore, RevisionInfo, RunSummary, StoredRun
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
    "FeedStream",
    "ManualClock",
    "MemoryStore",
    "OutcomeKind",
    "PostgresStore",
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
    "chrome_trace",
    "timeline_html",
    "tool",
    "write_timeline",
]

if TYPE_CHECKING:
    from ._observe.chrome import chrome_trace
    from ._observe.files import write_timeline
    from ._observe.timeline import timeline_html

_LAZY = {
    "chrome_trace": "._observe.chrome",
    "timeline_html": "._observe.timeline",
    "write_timeline": "._observe.files",
}


def __getattr__(name: str) -> Any:
    # The timeline renderers load on first use: most processes never draw one.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
