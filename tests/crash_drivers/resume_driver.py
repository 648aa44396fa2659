"""Start one run against a SqliteStore, bring it to a given point, report, and wait to be killed.

Used by tests/test_resume.py, which SIGKILLs this process and resumes the run in its own.

Usage: resume_driver.py DB STEPS [--send TEXT]... [--early-send TEXT]

STEPS is a comma-separated plan of tool names (from the tools below), run as one `Plan`.
Every tool announces itself on stdout (`started <tool> <call_id> <idempotency_key>`) and then
blocks forever, so the run is killed with those calls in flight. Calls that require approval
are reported as `approval <call_id>` once pending. Each `--send TEXT` is sent (queue mode) once
every executable call has started, and reported as `sent <seq> <text>` after `send()` returned.
Then the driver prints `run <run_id> <revision>` and `ready`.

`--early-send TEXT` instead sends TEXT right after `start()` returned while the run's first
checkpoint is held back (the dispatcher thread being slow), reports `sent`, and kills itself.

The tools' names, side effects and signatures must match the test's, or the resume is refused
with `capability_mismatch` (which is the point of that check).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from steerable.actors import (
    CheckpointStore,
    RevisionInfo,
    RunSummary,
    Runtime,
    SqliteStore,
    StoredRun,
    ToolContext,
    tool,
)
from steerable.actors.testing import ScriptedAgent, wait_event
from steerable.protocol import (
    AgentError,
    EventKind,
    Finish,
    HostMessage,
    Plan,
    RunState,
    SubagentResult,
    ToolCall,
    ToolResult,
    TranscriptEntry,
)

_forever = threading.Event()
_lock = threading.Lock()
_started = threading.Condition(_lock)
_counts = [0]  # tools started so far


_say_lock = threading.Lock()


def say(line: str) -> None:
    """One whole line to the test, never interleaved with another thread's (tools print too)."""
    with _say_lock:
        print(line, flush=True)


def _block(name: str, ctx: ToolContext) -> str:
    with _started:
        say(f"started {name} {ctx.call_id} {ctx.idempotency_key}")
        _counts[0] += 1
        _started.notify_all()
    _forever.wait()
    return "never"


@tool(side_effect="none")
def look(ctx: ToolContext, q: str = "") -> str:
    return _block("look", ctx)


@tool(side_effect="idempotent")
def upsert(ctx: ToolContext, q: str = "") -> str:
    return _block("upsert", ctx)


@tool(side_effect="write", honors_idempotency_key=True)
def keyed(ctx: ToolContext, q: str = "") -> str:
    return _block("keyed", ctx)


@tool(side_effect="write")
def plain(ctx: ToolContext, q: str = "") -> str:
    return _block("plain", ctx)


@tool(side_effect="write", requires_approval=True)
def pay(ctx: ToolContext, q: str = "") -> str:
    return _block("pay", ctx)


TOOLS = [look, upsert, keyed, plain, pay]


class HeldStore(CheckpointStore):
    """A SqliteStore whose first checkpoint waits until `release` is set (a slow dispatcher)."""

    durable = True

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.release = threading.Event()

    def append_message(
        self, run_id: str, message: HostMessage, *, message_id: str | None = None
    ) -> None:
        self.inner.append_message(run_id, message, message_id=message_id)

    def journal(
        self,
        run_id: str,
        result: ToolResult | SubagentResult,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        self.inner.journal(run_id, result, on_failed=on_failed)

    def write_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: Sequence[TranscriptEntry],
        on_stored: Callable[[], None] | None = None,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        if revision == 0:
            self.release.wait()
        self.inner.write_checkpoint(
            run_id, revision, snapshot, entries_from, entries, on_stored, on_failed=on_failed
        )

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        return self.inner.load(run_id, revision)

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        return self.inner.revisions(run_id)

    def runs(self) -> list[RunSummary]:
        return self.inner.runs()

    def flush(self, timeout: float | None = None) -> bool:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def main(argv: list[str]) -> None:
    # The runtime's logs go to stderr: stdout is the line protocol the test reads.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    db, steps = argv[0], [s for s in argv[1].split(",") if s]
    sends: list[str] = []
    early: str | None = None
    rest = argv[2:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--send":
            sends.append(value)
        elif flag == "--early-send":
            early = value
    agent = ScriptedAgent(
        [Plan(steps=[ToolCall(name=s, arguments={"q": s}) for s in steps])],
        then=Finish(output="driver finished"),
        name="driver",
    )
    if early is not None:
        held = HeldStore(SqliteStore(db))
        rt = Runtime(store=held, tools=TOOLS)
        handle = rt.start("resume me", agent=agent)
        # The dispatcher is slow to write revision 0: send() must wait for it, not store a
        # message for a run the store does not know.
        threading.Timer(0.2, held.release.set).start()
        seq = handle.send(early)
        say(f"run {handle.run_id} -1")
        say(f"sent {seq} {early}")
        os.kill(os.getpid(), signal.SIGKILL)
    rt = Runtime(store=SqliteStore(db), tools=TOOLS)
    handle = rt.start("resume me", agent=agent)
    executable = [s for s in steps if s != "pay"]
    with _started:
        if not _started.wait_for(lambda: _counts[0] >= len(executable), 30):
            raise SystemExit("tools did not start")
    approvals = len(steps) - len(executable)
    if approvals:
        wait_event(handle, EventKind.STATE_CHANGED, lambda e: e.data.get("to") == "waiting")
        for request in handle.pending_approvals():
            say(f"approval {request.call_id}")
    for text in sends:
        seq = handle.send(text)
        say(f"sent {seq} {text}")
    rt.store.flush()
    assert handle.state in (RunState.RUNNING, RunState.WAITING)
    say(f"run {handle.run_id} {handle.revision}")
    say("ready")
    _forever.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
