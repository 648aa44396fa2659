"""Child runs (subagents) and run trees, and the compatibility check of a resume (R22).

Split from `_runtime.py`: the `Runtime` keeps its public methods and delegates here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from steerable.actors._engine.log import get_logger
from steerable.actors._machine.effects import ChildJob
from steerable.actors._machine.machine import RunMachine
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
from .directory import RunEntry
from .supervisor import Begin, ChildDone, RunSupervisor

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["RunTree", "build_tree", "check_compatible", "start_child"]

_log = get_logger("steerable.runtime")
_MIN_CHILD_SECONDS = 1e-3  # a child started with no time left still gets a deadline


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


def build_tree(runtime: Runtime, run_id: str) -> RunTree:
    """A run and its subagents, recursively, each with its current state.

    Built from the store (every run checkpoints at its boundaries) and the live runs here.

    Raises:
        SteerableError: `not_found` if neither knows the run.
    """
    summaries = {s.run_id: s for s in runtime.store.runs()}
    children: dict[str, set[str]] = {}
    for summary in summaries.values():
        if summary.parent_run_id is not None:
            children.setdefault(summary.parent_run_id, set()).add(summary.run_id)
    for live in runtime.directory.entries():  # a child may not have checkpointed yet
        if live.cell.parent_run_id is not None:
            children.setdefault(live.cell.parent_run_id, set()).add(live.cell.run_id)

    def build(rid: str) -> RunTree:
        entry = runtime.directory.get(rid)
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


def start_child(runtime: Runtime, parent: RunSupervisor, job: ChildJob) -> None:
    """Start or resume the child run of a subagent call; its outcome goes to the parent.

    Runs on the parent's dispatcher thread: it only builds objects, starts a mux actor and
    (on resume after a crash) reads the store, never waits on another run.
    """
    parent_cell = parent.cell
    parent_id = parent_cell.run_id

    def report(outcome: RunOutcome) -> None:
        runtime.directory.tell_timer(parent_id, ChildDone(job.call_id, outcome))

    live = runtime.directory.get(job.run_id)
    if live is not None:  # re-dispatched while the child still runs here
        live.cell.on_settle(report)
        return
    parent_entry = runtime.directory.get(parent_id)
    if parent_entry is None:
        return  # the parent ended meanwhile: nobody waits for this child
    agent = runtime.agents.get(job.agent)
    if agent is None:  # e.g. a parent resumed (override=True) without that agent
        report(
            RunOutcome(
                run_id=job.run_id,
                state=RunState.ERROR,
                errors=(
                    AgentError.of(
                        ErrorCode.UNKNOWN_AGENT,
                        f"no subagent named {job.agent!r} is registered",
                        agent=job.agent,
                    ),
                ),
            )
        )
        return
    try:
        stored: StoredRun | None = runtime.store.load(job.run_id)
    except SteerableError:
        stored = None
    cell = RunCell(
        job.run_id,
        parent_cell.trace_id,
        parent_id,
        parent_cell.events,
        parent_scope=parent_cell.scope,
    )
    # A cancel that reaches this child through its parent's scope is told to the child's
    # supervisor before its tools can see it, so the child records CANCELLED rather than
    # acting on the results the signal provokes (as RunHandle.cancel does for a root).
    cell.scope.on_cancel(lambda reason: runtime._cancel_now(cell, reason))
    config = parent_entry.config.model_copy(
        update={
            "max_steps": job.max_steps,
            "max_model_calls": job.max_model_calls,
            "token_budget": job.token_budget,
            "total_timeout": None
            if job.seconds_left is None
            else max(job.seconds_left, _MIN_CHILD_SECONDS),
        }
    )
    entry = runtime._entry(cell, agent, config, None, None, None, None)
    entry.tools = parent_entry.tools
    entry.hooks = parent_entry.hooks
    cell.on_settle(report)
    if stored is not None:
        if stored.snapshot.state.is_terminal:
            snap = stored.snapshot
            report(
                RunOutcome(
                    run_id=job.run_id,
                    state=snap.state,
                    output=snap.output,
                    errors=snap.errors,
                    metrics=snap.metrics,
                    revision=snap.revision,
                )
            )
            return
        cell.next_seq = max([stored.snapshot.last_seq, *(m.seq for m in stored.messages)]) + 1
        cell.revision = stored.snapshot.revision
        cell.stored.set()
        # Owned with its parent, whose claim fenced the previous owner out: taken even if
        # that owner's lease of the child has not expired yet.
        runtime.leases.claim(cell, force=True)
        runtime.directory.launch(
            entry,
            runtime.directory.restored_machine(entry, stored),
            Begin(resume=True, messages=tuple(stored.messages)),
        )
        return
    created = runtime.clock.wall()

    def factory(sup: RunSupervisor) -> RunMachine:
        return RunMachine(
            sup,
            run_id=job.run_id,
            trace_id=cell.trace_id,
            task=job.task,
            agent=entry.agent_name,
            config=config,
            tools=entry.tools,
            capabilities=entry.capabilities,
            session_id=None,
            task_id=None,
            parent_run_id=parent_id,
            depth=job.depth,
            created_at=created,
            subagents=runtime.agents.keys(),
        )

    runtime.leases.new_run(cell)
    runtime.directory.launch(entry, factory, Begin())
