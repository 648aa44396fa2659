"""A process of the cross-process steering tests (tests/test_ownership_processes.py).

Usage: steer_driver.py DB JOURNAL TTL ROLE  (DB: a SQLite file, or `pg:SCHEMA`)

ROLE is one of:
- `own`: owns the runs it starts. Commands on stdin: `start <name>` starts a run of the
  `Steered` agent and prints `run <name> <id>` once its first checkpoint is stored. Each run
  prints `ended <id> <state> <output as JSON>` when it ends.
- `steer`: owns nothing; runs the run-addressed operations on command and prints one answer
  line each: `send <id> <text> <message_id|->` -> `sent <seq>`; `cancel <id>` -> `cancel
  <True|False>`; `approve <id> <call>` / `deny <id> <call>` -> `decided <True|False>`;
  `pending <id>` -> `pending <call ids...>`; `state <id>` -> `state <state>`; `events <id>` ->
  `event <seq> <kind> <run_id>` for every event from seq 0, then `events-end`; errors print
  `error <code>`.

Both print `up` when ready and shut their runtime down when stdin closes.

`Steered` asks the user until three messages reached its view, then plans two approval-gated
`publish` calls, then finishes with every delivered message (in order) and the publish results.
`publish` appends `<pid> <run_id> publish <call_id> <key> <time>` to JOURNAL as it starts.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.crash_drivers.stores import open_store
else:  # run as a script: its folder is on sys.path
    from stores import open_store

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import (
    AskUser,
    Finish,
    Plan,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
)

ARGS = sys.argv[1:]
DB, JOURNAL, TTL, ROLE = ARGS[0], ARGS[1], float(ARGS[2]), ARGS[3]
_out_lock = threading.Lock()


def say(*words: object) -> None:
    with _out_lock:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


@tool(side_effect="write", requires_approval=True, honors_idempotency_key=True)
def publish(text: str, ctx: ToolContext) -> str:
    """Journals its start, then publishes."""
    line = (
        f"{os.getpid()} {ctx.run_id} publish {ctx.call_id} {ctx.idempotency_key} "
        f"{time.monotonic()}\n"
    )
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return f"published {text}"


class Steered:
    """Three messages, then two gated publishes, then the transcript of what it was given."""

    name = "steered"

    def decide(self, view: RunView) -> Any:
        messages = [e.content for e in view.transcript if isinstance(e, UserMessage)]
        if len(messages) < 3:
            return AskUser(question=f"message {len(messages) + 1}?")
        results = [e for e in view.transcript if isinstance(e, ToolResult)]
        if not results:
            return Plan(
                steps=[
                    ToolCall(name="publish", arguments={"text": "a"}),
                    ToolCall(name="publish", arguments={"text": "b"}),
                ]
            )
        outcome = [[r.call_id, r.ok] for r in results]
        return Finish(output={"messages": messages, "results": outcome})


def own(rt: Runtime) -> None:
    say("up")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "start":
            handle = rt.start(words[1], agent=Steered())
            handle._cell.stored.wait(60.0)
            rt.store.flush()
            say("run", words[1], handle.run_id)

            def report(h: Any = handle) -> None:
                try:
                    outcome = h.result(600.0)
                    say(
                        "ended",
                        h.run_id,
                        outcome.state.value,
                        json.dumps(outcome.output, separators=(",", ":")),
                    )
                except SteerableError as exc:
                    say("ended", h.run_id, "error", json.dumps(exc.code.value))

            threading.Thread(target=report, daemon=True).start()


def steer(rt: Runtime) -> None:
    say("up")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        op, run_id = words[0], words[1]
        try:
            if op == "send":
                message_id = None if words[3] == "-" else words[3]
                say("sent", rt.send(run_id, words[2], message_id=message_id))
            elif op == "cancel":
                say("cancel", rt.cancel(run_id, "from B"))
            elif op == "approve":
                say("decided", rt.approve(run_id, words[2]))
            elif op == "deny":
                say("decided", rt.deny(run_id, words[2], "no"))
            elif op == "pending":
                say("pending", *[p.call_id for p in rt.pending_approvals(run_id)])
            elif op == "state":
                say("state", rt.state(run_id).value)
            elif op == "events":
                for event in rt.events(run_id, timeout=60.0):
                    say("event", event.seq, event.kind.value, event.run_id)
                say("events-end")
        except SteerableError as exc:
            say("error", exc.code.value)


def main() -> None:
    rt = Runtime(store=open_store(DB), tools=[publish], lease_ttl=TTL)
    try:
        own(rt) if ROLE == "own" else steer(rt)
    finally:
        rt.shutdown(timeout=5.0, cancel_runs=False)


if __name__ == "__main__":
    main()
