"""Subagents, runnable and self-checking: `python examples/subagents.py` (docs/subagents.md).

A plan step `SubagentCall(agent="researcher", task=...)` starts a child run of an agent
registered with the `Runtime`. Part 1: a lead fans out three researchers in parallel; each
child's budget is carved from what the lead has left, results come back in step order, an
unknown agent is a typed error result, and usage rolls up. Part 2: cancelling the root of a
tree (lead -> 2 foremen -> 3 diggers each, all digging) cancels every run of it at once.
"""

from __future__ import annotations

from steerable.actors import Agent, RunHandle, Runtime, ToolContext, tool
from steerable.protocol import (
    Decision,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    ToolCall,
    ToolResult,
    Usage,
)


@tool(side_effect="none")
def search(query: str) -> str:
    return f"3 papers on {query}"


@tool(side_effect="none")
def dig(site: str, ctx: ToolContext) -> str:
    ctx.cancel_event.wait(10.0)  # a long job that stops as soon as it is cancelled
    ctx.raise_if_cancelled()
    return f"dug {site}"


class Researcher:
    """A subagent: one search on its task, then a report."""

    name = "researcher"

    def decide(self, view: RunView) -> Decision:
        if not view.last_results:
            search_step = ToolCall(name="search", arguments={"query": view.task})
            return Plan(steps=[search_step], usage=Usage(input_tokens=50, output_tokens=5))
        (result,) = view.last_results
        assert isinstance(result, ToolResult)
        assert result.ok
        return Finish(output=f"{view.task}: {result.value}", usage=Usage(input_tokens=80))


class Lead:
    """Fans out researchers (and one agent nobody registered), then sums up."""

    def decide(self, view: RunView) -> Decision:
        if not view.last_results:
            topics = ["actors", "checkpoints", "steering"]
            steps = [SubagentCall(agent="researcher", task=t) for t in topics]
            return Plan(steps=[*steps, SubagentCall(agent="oracle", task="the future")])
        reports: list[str] = []
        for result in view.last_results:  # in step order, whatever order they finished in
            assert isinstance(result, SubagentResult)
            if result.ok:
                reports.append(result.output)
            else:  # a failed child is a result for the parent to read (R7), not a crash
                assert result.error is not None
                reports.append(f"{result.agent} failed: {result.error.code.value}")
        return Finish(output=reports)


class Fanout:
    """Part 2: lead -> 2 foremen -> 3 diggers each; diggers dig until cancelled."""

    name = "fanout"

    def decide(self, view: RunView) -> Decision:
        if view.last_results:
            return Finish(output="never reached: the tree is cancelled first")
        if view.depth < 2:
            count = 2 if view.depth == 0 else 3
            steps = [SubagentCall(agent="fanout", task=f"{view.task}.{i}") for i in range(count)]
            return Plan(steps=steps)
        return Plan(steps=[ToolCall(name="dig", arguments={"site": view.task})])


def part1(rt: Runtime) -> None:
    config = RunConfig(max_steps=20, max_model_calls=20)
    handle = rt.start("survey the field", agent=Lead(), config=config)
    outcome = handle.result(timeout=30)
    print("part 1:", outcome.state.value)
    for report in outcome.output:
        print("  ", report)
    assert outcome.state is RunState.FINISHED, outcome.errors
    assert outcome.output == [
        "actors: 3 papers on actors",
        "checkpoints: 3 papers on checkpoints",
        "steering: 3 papers on steering",
        f"oracle failed: {ErrorCode.UNKNOWN_AGENT.value}",
    ]
    started = [e for e in handle.events() if e.kind is EventKind.SUBAGENT_STARTED]
    for event in started:
        # Reserved from the lead: (20 steps - 0 used) // 3 children, and
        # (20 model calls - 1 used - 1 kept to read the results) // 3.
        assert (event.data["max_steps"], event.data["max_model_calls"]) == (6, 6)
        child = rt.store.load(event.data["child_run_id"]).snapshot
        assert child.parent_run_id == handle.run_id
        assert child.depth == 1
        assert child.trace_id == handle.trace_id  # one trace spans the tree
    print(f"   each child got max_steps=6, max_model_calls=6 of the lead's {config.max_steps}")
    # Usage rolls up: 3 children x (1 step, 2 model calls, 130 + 5 tokens) + the lead's 2 calls.
    metrics = outcome.metrics
    assert (metrics.steps, metrics.model_calls) == (3, 2 + 3 * 2), metrics
    assert (metrics.input_tokens, metrics.output_tokens) == (3 * 130, 3 * 5), metrics
    print(f"   usage rolled up: {metrics.steps} steps, {metrics.model_calls} model calls")
    tree = rt.tree(handle.run_id)
    assert [(n.agent, n.state) for n in tree.children] == [("researcher", RunState.FINISHED)] * 3


def part2(rt: Runtime) -> None:
    handle = rt.start("dig", agent=Fanout())
    digging = 0
    everyone: list[RunHandle] = []
    for event in handle.events(timeout=30):  # the root's stream carries the whole tree's events
        if event.kind is EventKind.TOOL_STARTED:
            digging += 1
            if digging == 6:  # every digger is inside its tool
                runs = rt.tree(handle.run_id).walk()
                assert len(runs) == 1 + 2 + 6
                everyone = [rt.handle(run.run_id) for run in runs]
                assert handle.cancel(reason="enough")  # R18: down the whole tree
    outcomes = [h.result(timeout=30) for h in everyone]
    assert {o.state for o in outcomes} == {RunState.CANCELLED}, outcomes
    states = {n.state for n in rt.tree(handle.run_id).walk()}
    assert states == {RunState.CANCELLED}, states
    print(f"part 2: cancelled the root; all {len(outcomes)} runs of its tree are cancelled")


def main() -> None:
    agents: dict[str, Agent] = {"researcher": Researcher(), "fanout": Fanout()}
    with Runtime(tools=[search, dig], agents=agents) as rt:
        part1(rt)
        part2(rt)
    print("subagents ok")


if __name__ == "__main__":
    main()
