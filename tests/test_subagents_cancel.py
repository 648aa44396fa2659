"""Cancellation down the tree (R18), steering the parent of children, and `Runtime.tree()`.

Covered: cancelling a run cancels every descendant of a depth-3 tree with parallel children
(the time until all are terminal is measured and printed, not asserted); cancelling one child
cancels its subtree only and the parent goes on; an interrupting message cancels the current
plan's children and their descendants, a queued one disturbs none; every descendant still ends
when a tool ignores cancellation (abandoned after `cancel_grace`); cancel after the end is a
no-op; `rt.tree()` reports every run with its state, including a live child that has not
checkpointed yet; nothing is left running afterwards (the autouse fixture checks threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from steerable.actors import MemoryStore, RunHandle, Runtime, RunTree
from steerable.actors.testing import Gate, ScriptedAgent, wait_event
from steerable.protocol import (
    AgentError,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    SteerableError,
    SubagentCall,
    SubagentResult,
    ToolCall,
    ToolResult,
    TranscriptEntry,
)

WAIT = 10.0  # generous fail-instead-of-hang bound
WIDE = RunConfig(max_steps=100, max_model_calls=500, max_parallel_tools=16)


class Node:
    """Fans out by depth (`fanout[depth]` children of itself); calls the gated tool below."""

    name = "node"

    def __init__(self, fanout: Sequence[int]) -> None:
        self.fanout = list(fanout)

    def decide(self, view: RunView) -> Plan | Finish:
        if view.last_results:
            return Finish(output=[r.ok for r in view.last_results])
        if view.depth < len(self.fanout):
            count = self.fanout[view.depth]
            return Plan(
                steps=[SubagentCall(agent="node", task=f"{view.task}.{i}") for i in range(count)]
            )
        return Plan(steps=[ToolCall(name="leaf", arguments={})])


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def states(tree: RunTree) -> dict[str, RunState]:
    return {node.run_id: node.state for node in tree.walk()}


def subtree(tree: RunTree, run_id: str) -> RunTree:
    (found,) = [n for n in tree.walk() if n.run_id == run_id]
    return found


def handles(rt: Runtime, tree: RunTree) -> list[RunHandle]:
    """Handles on every run of a live tree (a handle's result() works after the run ended)."""
    return [rt.handle(node.run_id) for node in tree.walk()]


# --------------------------------------------------------------------------- cancel the root


def test_cancelling_a_run_cancels_every_descendant_of_a_depth_three_tree(gate: Gate) -> None:
    # 1 root -> 2 -> 2 x 10 in parallel -> 20 leaves at depth 3, each inside a cooperative tool.
    with Runtime(tools=[gate.tool("leaf")], agents={"node": Node([2, 10, 1])}) as rt:
        root = rt.start("r", agent=Node([2, 10, 1]), config=WIDE)
        gate.wait_started(20)
        tree = rt.tree(root.run_id)
        assert len(tree.walk()) == 1 + 2 + 20 + 20
        assert set(states(tree).values()) == {RunState.RUNNING}
        assert {len(n.children) for n in tree.walk()} == {0, 1, 2, 10}
        everyone = handles(rt, tree)

        t0_wall, t0 = time.time(), time.perf_counter()
        assert root.cancel("stop") is True
        outcomes = [h.result(timeout=WAIT) for h in everyone]
        all_seen = time.perf_counter() - t0
        ended = {e.run_id: e for e in root.events() if e.kind is EventKind.RUN_ENDED}
        last_end = max(e.at for e in ended.values()) - t0_wall
        print(
            f"\ncancel propagation, depth-3 tree of {len(everyone)} runs (20 leaves in tools): "
            f"last run_ended {last_end * 1000:.1f} ms after cancel(); "
            f"all results seen by the host after {all_seen * 1000:.1f} ms"
        )
        cancelled = [e for e in root.events() if e.kind is EventKind.RUN_CANCELLED]
        after = rt.tree(root.run_id)
        stats = rt.statistics()

    assert {o.state for o in outcomes} == {RunState.CANCELLED}
    assert set(ended) == {h.run_id for h in everyone}
    assert {e.data["state"] for e in ended.values()} == {"cancelled"}
    # The same reason reached every run; nothing had to be abandoned (the tools cooperated).
    assert len(cancelled) == len(everyone)
    assert {e.data["reason"] for e in cancelled} == {"stop"}
    assert {tuple(e.data["abandoned"]) for e in cancelled} == {()}
    assert len(gate.finished) == 20  # every tool really stopped
    assert set(states(after).values()) == {RunState.CANCELLED}
    assert (stats["runs_active"], stats["runs_passivated"], stats["workers_busy"]) == (0, 0, 0)
    assert root.cancel("again") is False  # R18: cancel after a terminal state is a no-op


def test_cancelling_one_child_cancels_its_subtree_only_and_the_parent_goes_on(
    gate: Gate,
) -> None:
    with Runtime(tools=[gate.tool("leaf")], agents={"node": Node([2, 3])}) as rt:
        root = rt.start("r", agent=Node([2, 3]), config=WIDE)
        gate.wait_started(6)
        tree = rt.tree(root.run_id)
        doomed, spared = tree.children
        doomed_handles = handles(rt, doomed)
        assert rt.handle(doomed.run_id).cancel("not this one") is True
        assert {h.result(timeout=WAIT).state for h in doomed_handles} == {RunState.CANCELLED}
        middle = rt.tree(root.run_id)
        assert set(states(subtree(middle, doomed.run_id)).values()) == {RunState.CANCELLED}
        assert set(states(subtree(middle, spared.run_id)).values()) == {RunState.RUNNING}
        assert middle.state is RunState.RUNNING
        assert len(gate.finished) == 3  # only the doomed subtree's tools stopped
        gate.release()
        outcome = root.result(timeout=WAIT)
        finished = [
            e.data
            for e in root.events()
            if e.kind is EventKind.SUBAGENT_FINISHED and e.run_id == root.run_id
        ]
        transcript = rt.store.load(root.run_id).transcript
    assert outcome.state is RunState.FINISHED
    assert outcome.output == [False, True]
    assert [(d["child_run_id"], d["state"], d["ok"]) for d in finished] == [
        (doomed.run_id, "cancelled", False),
        (spared.run_id, "finished", True),
    ]
    (result,) = [e for e in transcript if isinstance(e, SubagentResult) and not e.ok]
    assert result.error is not None
    assert result.error.code is ErrorCode.SUBAGENT_FAILED
    assert result.error.details["state"] == "cancelled"


# --------------------------------------------------------------------------- steering the parent


def steering_tree(gate: Gate) -> tuple[Runtime, ScriptedAgent]:
    """A lead with two children (each with one grandchild in a tool) and its own tool."""
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="node", task="a"),
                    SubagentCall(agent="node", task="b"),
                    ToolCall(name="leaf", arguments={}),
                ]
            )
        ],
        then=lambda view: Finish(output=[m.content for m in view.delivered]),
        name="lead",
    )
    return Runtime(tools=[gate.tool("leaf")], agents={"node": Node([0, 1])}), lead


def test_an_interrupting_message_cancels_the_current_plans_children_and_their_descendants(
    gate: Gate,
) -> None:
    rt, lead = steering_tree(gate)
    with rt:
        root = rt.start("t", agent=lead)
        gate.wait_started(3)
        tree = rt.tree(root.run_id)
        descendants = handles(rt, tree)[1:]
        assert len(descendants) == 4
        root.send("change of plan", mode="interrupt")
        assert {h.result(timeout=WAIT).state for h in descendants} == {RunState.CANCELLED}
        outcome = root.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["change of plan"]  # delivered at once, after the cancellations
    a, b, own = lead.views[1].last_results
    for child, node in zip((a, b), tree.children, strict=True):
        assert isinstance(child, SubagentResult)
        assert (child.child_run_id, child.state, child.ok) == (
            node.run_id,
            RunState.CANCELLED,
            False,
        )
        assert child.error is not None
        assert child.error.code is ErrorCode.CANCELLED
    assert isinstance(own, ToolResult)
    assert own.error is not None
    assert own.error.code is ErrorCode.CANCELLED
    assert len(gate.finished) == 3


def test_a_queued_message_does_not_disturb_the_children(gate: Gate) -> None:
    rt, lead = steering_tree(gate)
    with rt:
        root = rt.start("t", agent=lead)
        gate.wait_started(3)
        root.send("also this", mode="queue")
        wait_event(root, EventKind.MESSAGE_ACCEPTED)
        assert set(states(rt.tree(root.run_id)).values()) == {RunState.RUNNING}
        gate.release()
        outcome = root.result(timeout=WAIT)
        final = rt.tree(root.run_id)
    assert outcome.output == ["also this"]
    assert [r.ok for r in lead.views[1].last_results] == [True, True, True]
    assert set(states(final).values()) == {RunState.FINISHED}


# --------------------------------------------------------------------------- tools that ignore it


def test_every_descendant_ends_even_when_a_tool_ignores_cancellation() -> None:
    stubborn = Gate(cooperative=False)
    config = RunConfig(cancel_grace=0.05)
    try:
        with Runtime(tools=[stubborn.tool("leaf")], agents={"node": Node([1, 1])}) as rt:
            root = rt.start("r", agent=Node([1, 1]), config=config)
            stubborn.wait_started(1)
            everyone = handles(rt, rt.tree(root.run_id))
            assert len(everyone) == 3
            assert root.cancel("stop") is True
            outcomes = [h.result(timeout=WAIT) for h in everyone]
            assert not stubborn.stopped.is_set()  # the tool is still inside its call
    finally:
        stubborn.release()
    assert {o.state for o in outcomes} == {RunState.CANCELLED}
    leaf = outcomes[-1]
    call, error = leaf.errors  # its tool call's, then the run's (R6)
    assert (call.code, call.details["call_id"], call.details["abandoned"]) == (
        ErrorCode.CANCELLED,
        "c1.0",
        True,
    )
    assert error.details["abandoned"] == ["c1.0"]  # the leaf gave up on its tool


# --------------------------------------------------------------------------- tree()


def test_tree_of_an_unknown_run_is_not_found() -> None:
    with Runtime() as rt, pytest.raises(SteerableError) as raised:
        rt.tree("run_nope")
    assert raised.value.code is ErrorCode.NOT_FOUND


class HeldStore(MemoryStore):
    """A memory store whose writes of subagents' first checkpoints wait for `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()
        self.release = threading.Event()

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
        if snapshot["parent_run_id"] is not None and revision == 0:
            self.held.set()
            self.release.wait(WAIT)
        super().write_checkpoint(
            run_id, revision, snapshot, entries_from, entries, on_stored, on_failed=on_failed
        )


def test_tree_includes_a_live_child_that_has_not_checkpointed_yet() -> None:
    store = HeldStore()
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="quick", task="a")])], then=Finish(output="ok")
    )
    quick = ScriptedAgent([], then=Finish(output="done"), name="quick")
    try:
        with Runtime(store=store, agents={"quick": quick}) as rt:
            root = rt.start("t", agent=lead)
            started = wait_event(root, EventKind.SUBAGENT_STARTED)
            assert store.held.wait(WAIT)  # the child is live, its first checkpoint not written
            child_id = started.data["child_run_id"]
            assert rt.handle(child_id).parent_run_id == root.run_id
            tree = rt.tree(root.run_id)
            store.release.set()
            assert [c.run_id for c in tree.children] == [child_id]
            assert root.result(timeout=WAIT).state is RunState.FINISHED
    finally:
        store.release.set()
