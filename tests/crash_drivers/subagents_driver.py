"""Start a run tree against a SqliteStore, bring it mid-flight, report, and wait to be killed.

Used by tests/test_subagents_durable.py, which SIGKILLs this process and resumes the root run
in its own process.

Usage: subagents_driver.py DB

The root ("lead") plans three subagents at once: "quick" (one `echo`, then done), "researcher"
(one `look` on its task) and "manager" (delegates to a "researcher" grandchild). `look` announces
itself on stdout (`started <run_id> <call_id> <idempotency_key>`) and blocks forever, so the
process is killed with a child and a grandchild inside a tool and "quick" already finished.
Once that point is reached and the store is flushed, the driver prints one
`child <parent_run_id> <call_id> <child_run_id>` line per started subagent, then
`run <root_run_id>` and `ready`.

The tools' and agents' names, side effects and signatures must match the test's, or the
resume is refused with `capability_mismatch`.
"""

from __future__ import annotations

import sys
import threading

from steerable.actors import Agent, Runtime, SqliteStore, ToolContext, tool
from steerable.actors.testing import wait_event
from steerable.protocol import EventKind, Finish, Plan, RunView, SubagentCall, ToolCall

_forever = threading.Event()
_lock = threading.Lock()
_started = threading.Condition(_lock)
_count = [0]  # look calls started


@tool(side_effect="none")
def look(ctx: ToolContext, q: str = "") -> str:
    with _started:
        print(f"started {ctx.run_id} {ctx.call_id} {ctx.idempotency_key}", flush=True)
        _count[0] += 1
        _started.notify_all()
    _forever.wait()
    return "never"


@tool(side_effect="none")
def echo(q: str = "") -> str:
    return f"echo {q}"


class Worker:
    """One tool call on its task, then a report (the same class in the test)."""

    def __init__(self, name: str, tool_name: str) -> None:
        self.name = name
        self.tool_name = tool_name

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[ToolCall(name=self.tool_name, arguments={"q": view.task})])
        (result,) = view.last_results
        return Finish(output=f"{view.task}: {getattr(result, 'value', None)}")


class Manager:
    name = "manager"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[SubagentCall(agent="researcher", task=f"{view.task}/deep")])
        (result,) = view.last_results
        return Finish(output=f"managed({getattr(result, 'output', None)})")


class Lead:
    name = "lead"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(
                steps=[
                    SubagentCall(agent="quick", task="q"),
                    SubagentCall(agent="researcher", task="a"),
                    SubagentCall(agent="manager", task="m"),
                ]
            )
        return Finish(output=[getattr(r, "output", None) for r in view.last_results])


def main(argv: list[str]) -> None:
    agents: dict[str, Agent] = {
        "quick": Worker("quick", "echo"),
        "researcher": Worker("researcher", "look"),
        "manager": Manager(),
    }
    rt = Runtime(store=SqliteStore(argv[0]), tools=[look, echo], agents=agents)
    root = rt.start("tree", agent=Lead())
    with _started:
        if not _started.wait_for(lambda: _count[0] >= 2, 30):
            raise SystemExit("tools did not start")
    wait_event(root, EventKind.SUBAGENT_FINISHED, lambda e: e.data["agent"] == "quick")
    if not rt.store.flush(30):
        raise SystemExit("store did not flush")
    children = 0
    for event in root.events(timeout=30):
        if event.kind is EventKind.SUBAGENT_STARTED:
            data = event.data
            with _started:  # whole lines: tools print too
                print(f"child {event.run_id} {data['call_id']} {data['child_run_id']}", flush=True)
            children += 1
            if children == 4:  # three children and the manager's researcher (all started)
                break
    with _started:  # whole lines: tools print too
        print(f"run {root.run_id}", flush=True)
    with _started:  # whole lines: tools print too
        print("ready", flush=True)
    _forever.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
