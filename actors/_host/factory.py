"""`RunFactory`: the one place that builds a run's entry, machine and supervisor.

Every way a run's actor comes to life goes through here: a start, a resume, a fork, a child
run's start or resume, and the wake of a passivated run. An entry's capability snapshot is
computed from the tools that entry really carries, so a child that inherits its parent's
per-run tools records (and is checked against) exactly those (R22).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pykka

from steerable.actors._engine.inline import handoff_to_workers
from steerable.actors._engine.log import get_logger
from steerable.actors._machine.machine import RunMachine
from steerable.actors._tools.tool import Tool, tool
from steerable.protocol import (
    AgentError,
    AgentSpec,
    ApprovalDecision,
    ApprovalRequest,
    CapabilitySnapshot,
    Compatibility,
    ErrorCode,
    ForkOrigin,
    HookName,
    RunConfig,
    RunEvent,
    RunMetrics,
    SteerableError,
    StoredRun,
    SubagentResult,
)

from .agent import Agent, agent_name
from .cell import RunCell
from .childrun import ChildLink, ChildRun
from .jobs import Accept
from .messages import Begin
from .services import Services
from .supervisor import RunSupervisor

__all__ = [
    "Agent",
    "Hook",
    "Launch",
    "RunEntry",
    "RunFactory",
    "agent_name",
    "as_tool",
    "tool_table",
]

_log = get_logger("steerable.runtime")
_CAPABILITY_CACHE = 1024  # distinct (agent, tool set) snapshots kept

Hook = Callable[[RunEvent], object]


def as_tool(obj: Tool[Any, Any] | Callable[..., Any]) -> Tool[Any, Any]:
    """A `Tool` as is; a plain function wrapped with `@tool`'s defaults."""
    return obj if isinstance(obj, Tool) else tool(obj)


def tool_table(
    tools: Iterable[Tool[Any, Any] | Callable[..., Any]], where: str
) -> dict[str, Tool[Any, Any]]:
    """Tools by name; two different tools with one name are refused (a plan names one).

    Raises:
        ValueError: Two different tools (or functions) share a name; the error names both.
    """
    table: dict[str, Tool[Any, Any]] = {}
    for t in tools:
        wrapped = as_tool(t)
        name = wrapped.spec.name
        other = table.get(name)
        if other is not None and other is not wrapped and other.fn is not wrapped.fn:
            raise ValueError(
                f"two tools named {name!r} in {where}: {_describe(other)} and "
                f"{_describe(wrapped)}; give one of them another name (@tool(name=...))"
            )
        table[name] = wrapped
    return table


def _describe(t: Tool[Any, Any]) -> str:
    fn = t.fn
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(slots=True)
class RunEntry:
    """Everything needed to (re)start one run's supervisor."""

    cell: RunCell
    config: RunConfig
    agent: Any
    agent_name: str
    accept: Accept | None
    tools: Mapping[str, Tool[Any, Any]]
    hooks: Mapping[HookName, Sequence[Hook]]
    capabilities: CapabilitySnapshot
    compatibility: Compatibility | None
    link: ChildLink | None = None
    """A child run's tie to its parent (its actor is then a `ChildRun`)."""
    ref: pykka.ActorRef[Any] | None = None
    deadline: float | None = None
    """The run's absolute (monotonic) deadline, kept while passivated."""
    arguments: dict[str, dict[str, Any]] | None = None
    """Validated arguments of the parked plan's calls, kept in memory while passivated (the
    store has secrets only as references)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How one start of a run's supervisor begins its machine: afresh, or from the store."""

    task: str
    config: RunConfig
    created_at: float
    depth: int = 0
    parent_run_id: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    compatibility: Compatibility | None = None
    stored: StoredRun | None = None
    """The revision to restore (resume, fork, wake); None for a new run."""
    fork: ForkOrigin | None = None
    wake: bool = False
    """The same process reviving a passivated run: nothing is announced again."""
    arguments: dict[str, dict[str, Any]] | None = None
    children: dict[str, RunMetrics] = field(default_factory=dict)

    @property
    def begin(self) -> Begin:
        """The first message of the supervisor."""
        if self.stored is None:
            return Begin()
        if self.fork is not None:
            return Begin(resume=True)
        return Begin(resume=True, messages=tuple(self.stored.messages), wake=self.wake)


class RunFactory:
    """Builds run entries, machines and supervisors for one runtime.

    Args:
        services: The runtime's shared machinery.
        tools: The runtime's tools by name (the runtime's own dict: tools added to it later
            are seen).
        agents: The runtime's subagents by name (likewise shared).
    """

    def __init__(
        self,
        services: Services,
        tools: dict[str, Tool[Any, Any]],
        agents: dict[str, Agent],
    ) -> None:
        self.services = services
        self.tools = tools
        self.agents = agents
        self._capabilities: dict[tuple[str, str, tuple[int, ...]], CapabilitySnapshot] = {}
        self.on_entry: Callable[[RunCell, Any], None] | None = None
        """Told of every entry built, before its run starts (the runtime's observability)."""

    # ------------------------------------------------------------------ entries

    def run_tools(
        self, extra: Iterable[Tool[Any, Any] | Callable[..., Any]] | None
    ) -> dict[str, Tool[Any, Any]]:
        """The runtime's tools with a run's own added (or replacing them by name).

        Raises:
            ValueError: `extra` holds two different tools of one name.
        """
        tools = dict(self.tools)
        tools.update(tool_table(extra or (), "tools=..."))
        return tools

    def entry(
        self,
        cell: RunCell,
        agent: Agent,
        config: RunConfig,
        *,
        tools: Mapping[str, Tool[Any, Any]],
        hooks: Mapping[HookName, Sequence[Hook]],
        accept: Accept | None = None,
        compatibility: Compatibility | None = None,
        link: ChildLink | None = None,
    ) -> RunEntry:
        """The entry of a run of `agent` with exactly `tools`; its snapshot lists those.

        Raises:
            TypeError: `agent` has no `decide` method, or `config` is not a `RunConfig`.
        """
        if not callable(getattr(agent, "decide", None)):
            raise TypeError(f"agent {agent!r} has no decide(view) method")
        if not isinstance(config, RunConfig):
            raise TypeError(f"config must be a RunConfig, not {type(config).__name__}")
        name = agent_name(agent)
        if self.on_entry is not None:
            self.on_entry(cell, agent)
        return RunEntry(
            cell=cell,
            config=config,
            agent=agent,
            agent_name=name,
            accept=accept,
            tools=tools,
            hooks=hooks,
            capabilities=self._snapshot(name, str(getattr(agent, "version", "1")), tools),
            compatibility=compatibility,
            link=link,
        )

    def _snapshot(
        self, name: str, version: str, tools: Mapping[str, Tool[Any, Any]]
    ) -> CapabilitySnapshot:
        # Built once per (agent, tool set): hashing every tool's schema on each start() was a
        # large part of starting a run (W5, W8).
        key = (name, version, tuple(id(t) for t in tools.values()))
        capabilities = self._capabilities.get(key)
        if capabilities is None:
            capabilities = CapabilitySnapshot.of(
                [t.spec for t in tools.values()],
                [AgentSpec(name=name, version=version)]
                + [
                    AgentSpec(name=n, version=str(getattr(a, "version", "1")))
                    for n, a in self.agents.items()
                    if n != name
                ],
            )
            if len(self._capabilities) < _CAPABILITY_CACHE:
                self._capabilities[key] = capabilities
        return capabilities

    # ------------------------------------------------------------------ launches

    def fresh(
        self,
        entry: RunEntry,
        task: str,
        *,
        depth: int = 0,
        session_id: str | None = None,
        task_id: str | None = None,
    ) -> Launch:
        """A new run of `entry` on `task`."""
        return Launch(
            task=task,
            config=entry.config,
            created_at=self.services.clock.wall(),
            depth=depth,
            parent_run_id=entry.cell.parent_run_id,
            session_id=session_id,
            task_id=task_id,
            compatibility=entry.compatibility,
        )

    def restoring(
        self,
        entry: RunEntry,
        stored: StoredRun,
        *,
        fork: ForkOrigin | None = None,
        wake: bool = False,
    ) -> Launch:
        """A run of `entry` continued from `stored` (resume, wake), or a fork of it.

        A resumed or woken run keeps the config it was checkpointed with; a fork has its
        entry's (the host may give it another).
        """
        snap = stored.snapshot
        arguments = None
        if wake:
            arguments, entry.arguments = entry.arguments, None
        return Launch(
            task=snap.task,
            config=entry.config if fork is not None else snap.config,
            created_at=self.services.clock.wall() if fork is not None else snap.created_at,
            depth=snap.depth,
            parent_run_id=snap.parent_run_id,
            session_id=snap.session_id,
            task_id=snap.task_id,
            compatibility=entry.compatibility or snap.compatibility,
            stored=stored,
            fork=fork,
            wake=wake,
            arguments=arguments,
            children=self._child_metrics(stored) if fork is None else {},
        )

    def _child_metrics(self, stored: StoredRun) -> dict[str, RunMetrics]:
        """What each child whose result is journaled used: the parent's last checkpoint
        predates that result, so the usage must be added again on restore."""
        out: dict[str, RunMetrics] = {}
        for call_id, result in stored.journal.items():
            if isinstance(result, SubagentResult) and result.child_run_id:
                try:
                    out[call_id] = self.services.store.load(result.child_run_id).snapshot.metrics
                except SteerableError:
                    _log.warning("child_metrics_missing", child_run_id=result.child_run_id)
        return out

    # ------------------------------------------------------------------ supervisors

    def supervise(self, entry: RunEntry, launch: Launch) -> None:
        """Start `entry`'s supervisor (a `ChildRun` for a child run) and tell it to begin.

        Raises:
            SteerableError: `resource_exhausted` if no actor could be started.
        """

        def build(sup: RunSupervisor) -> RunMachine:
            return self._machine(sup, entry, launch)

        self._store_events(entry, launch)
        kwargs: dict[str, Any] = {
            "services": self.services,
            "cell": entry.cell,
            "machine_factory": build,
            "agent": entry.agent,
            "accept": entry.accept,
            "tools": entry.tools,
            "hooks": entry.hooks,
        }
        # Started and told to begin in one hand-off: an idle worker (if any) runs on_start and
        # Begin, and keeps the first decide they submit (docs/decisions/0003-writer-handoff.md).
        with handoff_to_workers():
            try:
                if entry.link is not None:
                    ref: pykka.ActorRef[Any] = ChildRun.start(link=entry.link, **kwargs)
                else:
                    ref = RunSupervisor.start(**kwargs)
            except RuntimeError as exc:  # docs/pykka.md T1: starting an actor is fallible
                raise SteerableError(
                    AgentError.of(
                        ErrorCode.RESOURCE_EXHAUSTED, f"could not start a supervisor: {exc}"
                    )
                ) from exc
            entry.ref = ref
            ref.tell(launch.begin)

    def _store_events(self, entry: RunEntry, launch: Launch) -> None:
        """A top-level run's event log goes to the store; a resumed run's stream continues
        after its last stored event (docs/durability.md, "Stored events")."""
        store = self.services.store
        events = entry.cell.events
        if entry.link is not None or events.storing or not store.stores_events:
            return  # a child writes to its root's stream; a woken run's log is attached
        resumed = launch.stored is not None and launch.fork is None and not launch.wake
        first = store.next_event_seq(entry.cell.run_id) if resumed else 0
        events.store_to(store, entry.cell.run_id, first)

    def _machine(self, sup: RunSupervisor, entry: RunEntry, launch: Launch) -> RunMachine:
        """The run's machine; runs on the caller's thread, before `Begin` is told."""
        cell = entry.cell
        machine = RunMachine(
            sup.effects,
            run_id=cell.run_id,
            trace_id=cell.trace_id,
            task=launch.task,
            agent=entry.agent_name,
            config=launch.config,
            tools=entry.tools,
            capabilities=entry.capabilities,
            compatibility=launch.compatibility,
            session_id=launch.session_id,
            task_id=launch.task_id,
            parent_run_id=launch.parent_run_id,
            depth=launch.depth,
            created_at=launch.created_at,
            subagents=self.services.agents,
        )
        stored = launch.stored
        if stored is None:
            return machine
        machine.restore(
            stored,
            fork=launch.fork,
            arguments=launch.arguments,
            children=launch.children,
            # A wake keeps the deadline the host held in memory.
            deadline_left=max(0.0, entry.deadline - self.services.clock.now())
            if launch.wake and entry.deadline is not None
            else None,
        )
        if not launch.wake:
            # The host may approve as soon as resume() or fork() returns, before the run
            # announces its approvals again: the table is filled here, from the restored plan
            # (less the calls a decision stored after the checkpoint answers already).
            answered = {m.call_id for m in launch.begin.messages if isinstance(m, ApprovalDecision)}
            for call in machine.pending_approvals():
                if call.call_id in answered:
                    continue
                cell.approval_requested(
                    ApprovalRequest(
                        call_id=call.call_id,
                        tool=call.name,
                        arguments=call.arguments,
                        run_id=cell.run_id,
                    )
                )
        return machine
