"""The README's "Using it" example, runnable and self-checking: `python examples/quickstart.py`.

Tools are plain functions; an agent is any object with `decide(view) -> Decision`; the host
embeds a `Runtime` and talks to each run through its handle: start, send, approve, cancel,
result, events. Checkpoints stay in memory here; pass `store=` to `Runtime` for a durable one.
"""

from __future__ import annotations

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import (
    Decision,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    ToolCall,
    ToolResult,
)


@tool(side_effect="none")  # "none" | "idempotent" | "write"
def search(query: str, limit: int = 5) -> list[str]:
    return [f"hit {i} for {query}" for i in range(limit)]


@tool(side_effect="write", timeout=10.0, requires_approval=True)
def send_email(to: str, body: str, ctx: ToolContext) -> str:
    # Stable per call, reused if the call is re-dispatched after a crash: dedupe on it.
    return f"sent to {to} (key {ctx.idempotency_key})"


class MyAgent:
    def __init__(self) -> None:
        self.heard: list[str] = []  # the user messages delivered to the agent, in order

    def decide(self, view: RunView) -> Decision:
        self.heard += [m.content for m in view.delivered]
        if view.model_calls == 0:  # one plan: its steps run in parallel
            return Plan(
                steps=[
                    ToolCall(name="search", arguments={"query": view.task, "limit": 2}),
                    ToolCall(name="send_email", arguments={"to": "me@example.com", "body": "..."}),
                ]
            )
        hits = [r.value for r in view.last_results if isinstance(r, ToolResult) and r.ok]
        return Finish(output=hits)  # checked by `accept` before the run is FINISHED


def main() -> None:
    with Runtime(tools=[search, send_email]) as rt:
        agent = MyAgent()
        handle = rt.start(
            "find X",
            agent=agent,
            config=RunConfig(max_steps=20),
            session_id="s1",
            task_id="t1",
            accept=lambda output, view: None,
        )
        seq = handle.send("also check Y", mode="queue")  # steering: delivered at the next boundary
        for event in handle.events(timeout=30):  # the run's events, until it ends
            if event.kind == "approval_requested":  # send_email waits for a person
                assert [r.call_id for r in handle.pending_approvals()] == [event.data["call_id"]]
                assert handle.approve(event.data["call_id"])  # or handle.deny(call_id, reason=..)
        outcome = handle.result(timeout=30)  # RunOutcome: state, output, errors, metrics
        print("run 1:", outcome.state.value, outcome.output)
        assert outcome.state is RunState.FINISHED, outcome.errors
        hits, sent = outcome.output
        assert hits == ["hit 0 for find X", "hit 1 for find X"], hits
        assert sent.startswith("sent to me@example.com (key idem_"), sent
        assert seq == 0  # the run's first inbox message
        assert agent.heard == ["also check Y"], agent.heard  # delivered once, at a boundary
        assert not handle.cancel(reason="user pressed stop")  # False: the run is already over

        # A second run, cancelled while its email waits for approval: cancel() takes effect.
        second = rt.start("find Z", agent=MyAgent())
        for event in second.events(timeout=30):
            if event.kind is EventKind.APPROVAL_REQUESTED:
                assert second.cancel(reason="user pressed stop")
        cancelled = second.result(timeout=30)
        print("run 2:", cancelled.state.value, cancelled.error.message if cancelled.error else "")
        assert cancelled.state is RunState.CANCELLED, cancelled.errors
        assert second.pending_approvals() == []
    print("quickstart ok")


if __name__ == "__main__":
    main()
