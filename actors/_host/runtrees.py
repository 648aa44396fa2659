"""Child runs (subagents) and run trees, and the compatibility check of a resume (R22).

The `Runtime` keeps its public methods and delegates here; `RunHost` starts child runs here.
"""

from __future__ import annotations

from dataclasses import dataclass

from steerable.actors._engine.log import get_logger
from steerable.actors._machine.effects import ChildJob
from steerable.actors._stores.replay import outcome_of
from steerable.actors._stores.store import CheckpointStore
from steerable.protocol import (
    AgentError,
    Compatibility,
    ErrorCode,
    RunOutcome,
    RunSnapshot,
    RunState,
    SteerableError,
    StoredRun,
)

from .cell import RunCell
from .childrun import ChildLink
from .directory import RunDirectory
from .factory import RunEntry, RunFactory

__all__ = ["RunTree", "build_tree", "check_compatible", "start_child"]

_log = get_logger("steerable.runtime")


@dataclass(frozen=True, slots=True)
class RunTree:
    """A run and its subagents, as `Runtime.tree()` returns them."""

    run_id: str
    agent: str
    state: RunState
    children: tuple[RunTree, ...] = ()

    def walk(self) -> list[RunTree]:
        """This run and every descendant, depth first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


def build_tree(store: CheckpointStore, directory: RunDirectory, run_id: str) -> RunTree:
    """A run and its subagents, recursively, each with its current state.

    Built from the store (every run checkpoints at its boundaries) and the live runs here.

    Raises:
        SteerableError: `not_found` if neither knows the run.
    """
    summaries = {s.run_id: s for s in store.runs()}
    children: dict[str, set[str]] = {}
    for summary in summaries.values():
        if summary.parent_run_id is not None:
            children.setdefault(summary.parent_run_id, set()).add(summary.run_id)
    for live in directory.entries():  # a child may not have checkpointed yet
        if live.cell.parent_run_id is not None:
            children.setdefault(live.cell.parent_run_id, set()).add(live.cell.run_id)

    def build(rid: str) -> RunTree:
        entry = directory.get(rid)
        summary = summaries.get(rid)
        if entry is not None:
            state = entry.cell.state
        elif summary is not None:
            state = summary.state
        else:
            raise SteerableError(AgentError.of(ErrorCode.NOT_FOUND, f"no run {rid!r}", run_id=rid))
        agent = entry.agent_name if entry is not None else summary.agent if summary else ""
        return RunTree(
            run_id=rid,
            agent=agent,
            state=state,
            children=tuple(build(c) for c in sorted(children.get(rid, []))),
        )

    return build(run_id)


def check_compatible(
    snap: RunSnapshot, entry: RunEntry, compatibility: Compatibility | None, override: bool
) -> None:
    """R22: refuse an incompatible resume with the differences, never guess."""
    diffs = snap.capabilities.differences(entry.capabilities)
    if diffs and not override:
        raise SteerableError(
            AgentError.of(
                ErrorCode.CAPABILITY_MISMATCH,
                f"run {snap.run_id} was checkpointed with other capabilities: " + "; ".join(diffs),
                run_id=snap.run_id,
                differences=diffs,
            )
        )
    compat = snap.compatibility.differences(compatibility) if compatibility else []
    if compat and not override:
        raise SteerableError(
            AgentError.of(
                ErrorCode.CHECKPOINT_INCOMPATIBLE,
                f"run {snap.run_id} was started for another task/policy/profile/inputs: "
                + "; ".join(compat),
                run_id=snap.run_id,
                differences=compat,
            )
        )
    if (diffs or compat) and override:
        _log.warning("resume_override", run_id=snap.run_id, differences=diffs + compat)


def start_child(
    directory: RunDirectory, factory: RunFactory, parent: RunCell, job: ChildJob
) -> None:
    """Start or resume the child run of a subagent call; its outcome goes to the parent.

    Runs on the parent's dispatcher thread: it only builds objects, starts a mux actor and
    (on resume after a crash) reads the store, never waits on another run. The child's
    entry carries its parent's tools and hooks, and its capability snapshot is built from
    those very tools (a resume of the child is checked against what it really had).
    """
    parent_id = parent.run_id
    link = ChildLink(parent_id, job)
    if directory.get(job.run_id) is not None:
        return  # re-dispatched while the child still runs here: its ChildRun reports to us
    parent_entry = directory.get(parent_id)
    if parent_entry is None:
        return  # the parent ended meanwhile: nobody waits for this child
    agent = factory.agents.get(job.agent)
    if agent is None:  # e.g. a parent resumed (override=True) without that agent
        error = AgentError.of(
            ErrorCode.UNKNOWN_AGENT,
            f"no subagent named {job.agent!r} is registered",
            agent=job.agent,
        )
        outcome = RunOutcome(run_id=job.run_id, state=RunState.ERROR, errors=(error,))
        directory.deliver(parent_id, link.done(outcome))
        return
    try:
        stored: StoredRun | None = directory.store.load(job.run_id)
    except SteerableError:
        stored = None
    if stored is not None and stored.snapshot.state.is_terminal:
        directory.deliver(parent_id, link.done(outcome_of(stored.snapshot)))
        return
    cell = RunCell(job.run_id, parent.trace_id, parent_id, parent.events, parent_scope=parent.scope)
    entry = factory.entry(
        cell,
        agent,
        link.config(parent_entry.config),
        tools=parent_entry.tools,
        hooks=parent_entry.hooks,
        link=link,
    )
    if stored is None:
        directory.launch(entry, factory.fresh(entry, job.task, depth=job.depth))
        return
    cell.next_seq = max([stored.snapshot.last_seq, *(m.seq for m in stored.messages)]) + 1
    cell.revision = stored.snapshot.revision
    cell.stored.set()
    directory.launch(entry, factory.restoring(entry, stored))
