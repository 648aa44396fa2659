"""A host process for the CLI tests (tests/test_cli_processes.py): it owns one run.

Usage: cli_host.py DB start KIND | cli_host.py DB resume RUN_ID KIND

KIND is the run's agent:
- `chat`: asks the user; finishes with `{"said": [...]}` once a message says "finish".
- `gate`: plans `publish(what="notes")`, which needs approval; finishes with the result
  (`{"ok", "value", "error", "message"}`).
- `worker`: plans `block()`, which waits until it is cancelled; finishes with what was said
  and the block's error code once a message arrives.

`start` starts the run and prints `run <id>` once the store holds it waiting where the test
acts on it (a question, an approval, the blocking call), `resume` resumes it and prints
`resumed <id>`. Both then print `ended <id> <state> <output as JSON>` when the run ends. A `park`
line on stdin shuts the runtime down parking its run (it prints `parked <id>` and exits);
closing stdin shuts it down too.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from steerable.actors import Runtime, SqliteStore, ToolContext, tool
from steerable.protocol import (
    AskUser,
    CallStatus,
    ErrorCode,
    Finish,
    Plan,
    RunState,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
    WaitingFor,
)

WAIT = 60.0  # fail-instead-of-hang bound
_out = threading.Lock()
_blocking = threading.Event()


def say(*words: object) -> None:
    with _out:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


@tool(side_effect="write", requires_approval=True)
def publish(what: str) -> str:
    """Publishes `what` once a person approves."""
    return f"published {what}"


@tool(side_effect="none")
def block(ctx: ToolContext) -> str:
    """Waits until cancelled (an interrupting message, a cancel)."""
    _blocking.set()
    ctx.wait(None)
    return "unblocked"


def _said(view: RunView) -> list[str]:
    return [e.content for e in view.transcript if isinstance(e, UserMessage)]


def _results(view: RunView) -> list[ToolResult]:
    return [e for e in view.transcript if isinstance(e, ToolResult)]


class Chat:
    name = "chat"

    def decide(self, view: RunView) -> Any:
        said = _said(view)
        if said and said[-1] == "finish":
            return Finish(output={"said": said})
        return AskUser(question="say something")


class Gate:
    name = "gate"

    def decide(self, view: RunView) -> Any:
        results = _results(view)
        if results:
            r = results[-1]
            return Finish(
                output={
                    "ok": r.ok,
                    "value": r.value,
                    "error": None if r.error is None else r.error.code.value,
                    "message": None if r.error is None else r.error.message,
                }
            )
        return Plan(steps=[ToolCall(name="publish", arguments={"what": "notes"})])


class Worker:
    name = "worker"

    def decide(self, view: RunView) -> Any:
        said = _said(view)
        if said:
            results = _results(view)
            error = results[-1].error if results else None
            code = None if error is None else error.code.value
            return Finish(output={"said": said, "block": code})
        return Plan(steps=[ToolCall(name="block", arguments={})])


AGENTS: dict[str, Any] = {"chat": Chat(), "gate": Gate(), "worker": Worker()}


def _stored_ready(store: SqliteStore, run_id: str, kind: str) -> bool:
    """Whether the store shows the run where the test acts on it."""
    try:
        snap = store.load(run_id).snapshot
    except SteerableError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            return False
        raise
    if kind == "chat":
        return snap.state is RunState.WAITING and snap.waiting_for is WaitingFor.USER
    if kind == "gate":
        return any(c.status is CallStatus.AWAITING_APPROVAL for c in snap.plan)
    return _blocking.is_set()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    db, role = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if role == "start" else sys.argv[4]
    rt = Runtime(store=SqliteStore(db), tools=[publish, block], lease_ttl=2.0)
    try:
        if role == "start":
            handle = rt.start("a run the CLI operates", agent=AGENTS[kind])
            run_id = handle.run_id
            deadline = time.monotonic() + WAIT
            reader = SqliteStore(db, create=False)
            try:
                while not _stored_ready(reader, run_id, kind):
                    assert time.monotonic() < deadline, "the run never got ready"
                    threading.Event().wait(0.01)
            finally:
                reader.close()
            say("run", run_id)
        else:
            run_id = sys.argv[3]
            handle = rt.resume(run_id, agent=AGENTS[kind])
            say("resumed", run_id)

        ended = threading.Event()

        def report() -> None:
            try:
                outcome = handle.result(WAIT * 10)
            except SteerableError as exc:
                say("failed", run_id, exc.code.value)
                return
            ended.set()
            say("ended", run_id, outcome.state.value, json.dumps(outcome.output))

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        for line in sys.stdin:
            if line.strip() == "park":
                break
        rt.shutdown(cancel_runs=False)
        reporter.join(WAIT)
        say("closed" if ended.is_set() else "parked", run_id)
    finally:
        rt.shutdown(cancel_runs=False)


if __name__ == "__main__":
    main()
