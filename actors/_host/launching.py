"""`Runtime`'s launching plumbing: a run's entry, its cell from the store, resuming a claim.

The base of `Runtime` (split from runtime.py along its seam): `start`, `resume`, `fork` and
the adoption of orphans (docs/durability.md, "Ownership") build each run's entry here (its
tools, merged hooks, executors checked) and resume a run only under its lease.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from steerable.actors._stores.replay import outcome_of
from steerable.actors._stores.store import CheckpointStore, Lease, StoredRun
from steerable.actors._tools.tool import Tool
from steerable.protocol import Compatibility, HookName, RunConfig
from steerable.protocol.codec import check_storable

from .cell import RunCell
from .directory import RunDirectory
from .factory import Agent, Hook, RunEntry
from .handle import RunHandle
from .jobs import Accept
from .observing import Observability
from .ownership import RunOwnership
from .runtrees import check_compatible
from .services import Services
from .shutdown import _shut_down

if TYPE_CHECKING:
    pass

from .factory import RunFactory
from .leases import LeaseKeeper

__all__ = ["RunLaunching"]


class RunLaunching:
    """Entries and resumption for `Runtime` (which builds the parts they use)."""

    store: CheckpointStore
    services: Services
    directory: RunDirectory
    ownership: RunOwnership
    leases: LeaseKeeper
    _factory: RunFactory
    _observing: Observability
    _hooks: dict[HookName, list[Hook]]
    _lock: threading.Lock
    _closed: bool

    def _cell_of(self, stored: StoredRun) -> RunCell:
        snap = stored.snapshot
        return RunCell(
            snap.run_id,
            snap.trace_id,
            snap.parent_run_id,
            self._observing.event_log(snap.trace_id),
            next_seq=max([snap.last_seq, *(m.seq for m in stored.messages)]) + 1,
        )

    def _settled(self, stored: StoredRun) -> RunHandle:
        cell = self._cell_of(stored)
        cell.revision = stored.snapshot.revision
        cell.stored.set()
        cell.settle(outcome_of(stored.snapshot))
        return RunHandle(self.directory, cell)

    def _adopted(self, lease: Lease, agent: Agent, started: float) -> RunHandle:
        """Resume a run the lease keeper claimed for adoption at monotonic `started`."""
        cell = self._cell_of(self.store.load(lease.run_id))
        self.leases.claimed(cell, lease, started)
        return self._resume_claimed(cell, agent, None, None, None, None, override=False)

    def _resume_claimed(
        self,
        cell: RunCell,
        agent: Agent,
        accept: Accept | None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None,
        compatibility: Compatibility | None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None,
        *,
        override: bool,
    ) -> RunHandle:
        """Resume a run whose lease `cell` holds; the lease is released if it cannot run."""
        run_id = cell.run_id
        try:
            self.ownership.absorb(run_id)
            # Read again under the lease: the previous owner may have written until the claim.
            stored = self.store.load(run_id)
            snap = stored.snapshot
            if snap.state.is_terminal:
                self.leases.release(run_id)
                return self._settled(stored)
            cell.next_seq = max([snap.last_seq, *(m.seq for m in stored.messages)]) + 1
            cell.revision = snap.revision
            cell.stored.set()  # the store holds it already
            entry = self._entry(cell, agent, snap.config, accept, hooks, compatibility, tools)
            check_compatible(snap, entry, compatibility, override)
            cell.state = snap.state
            self.directory.launch(entry, self._factory.restoring(entry, stored))
        except BaseException:
            self.leases.release(run_id)
            raise
        return RunHandle(self.directory, cell)

    def _entry(
        self,
        cell: RunCell,
        agent: Agent,
        config: RunConfig,
        accept: Accept | None,
        hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None,
        compatibility: Compatibility | None,
        tools: Iterable[Tool[Any, Any] | Callable[..., Any]] | None,
    ) -> RunEntry:
        if self._closed:
            raise _shut_down()
        if tools:
            # A run's own tools: their executors must exist (Ray: installed) before it starts.
            self.services.executors.check([t for t in tools if isinstance(t, Tool)])
        return self._factory.entry(
            cell,
            agent,
            config,
            tools=self._factory.run_tools(tools),
            hooks=self._merge_hooks(hooks),
            accept=accept,
            compatibility=compatibility,
        )

    def _merge_hooks(
        self, hooks: Mapping[HookName | str, Hook | Sequence[Hook]] | None
    ) -> dict[HookName, list[Hook]]:
        with self._lock:
            merged = {name: list(cbs) for name, cbs in self._hooks.items() if cbs}
        for name, cbs in (hooks or {}).items():
            callbacks = [cbs] if callable(cbs) else list(cbs)
            merged.setdefault(HookName(name), []).extend(callbacks)
        return merged


def _optional_text(value: object, what: str) -> None:
    if value is not None:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str or None, not {type(value).__name__}")
        check_storable(value, what=what)
