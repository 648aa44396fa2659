"""Checkpoint stores: where runs' snapshots, transcripts, inboxes and journals live (R21, R25).

The layout is hybrid (R25): per run, an append-only log of transcript entries, a small
snapshot per revision, the durable inbox of host messages, and the journal of tool results
as they arrive. A checkpoint writes one snapshot and only the entries added since the previous
revision, so its cost does not grow with the run (docs/benchmarks.md W4). Checkpoints, the event
stream (trace) and any memory an agent keeps stay separate responsibilities.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from steerable.protocol import (
    AgentError,
    ErrorCode,
    HostMessage,
    RunSnapshot,
    RunState,
    SteerableError,
    StoredRun,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)
from steerable.protocol._codec import check_storable, decode_body
from steerable.protocol._shape import first_shape_error

from .lease import FenceListeners, Lease, LeaseTable, Owner

__all__ = [
    "CheckpointStore",
    "Lease",
    "MemoryStore",
    "Owner",
    "RevisionInfo",
    "RunSummary",
    "StoredRun",
    "check_record",
    "corrupt_row",
    "dynamic_part",
    "join_snapshot",
    "split_snapshot",
]

STATIC_KEYS = (
    "run_id",
    "trace_id",
    "session_id",
    "task_id",
    "parent_run_id",
    "depth",
    "forked_from",
    "task",
    "agent",
    "config",
    "capabilities",
    "compatibility",
    "created_at",
)
"""Snapshot fields fixed for a run's life: stored once per run, not once per revision."""


_EMPTY: dict[str, Any] = {
    "waiting_for": None,
    "pending_messages": [],
    "plan": [],
    "errors": [],
    "output": None,
    "deadline_left": None,
    "last_seq": -1,
    "delivered_seq": -1,
}
"""Per-revision fields left out while they hold their default (validation restores them)."""
_EMPTY_ITEMS = tuple(_EMPTY.items())
TERMINAL_STATES = frozenset(state.value for state in RunState if state.is_terminal)
"""The terminal states' values (a RunState is equal to its value): a set lookup per checkpoint
instead of an Enum call."""
_DERIVED_METRICS = ("steps", "model_calls", "input_tokens", "output_tokens")


def check_record(record: HostMessage | ToolResult | SubagentResult) -> None:
    """Refuse a message or result whose free-form values no store could keep.

    Every store calls it in `append_message` and `journal`, so that all of them accept and
    refuse the same records (the entry points have checked them with the same rules).

    Raises:
        TypeError, ValueError: As `steerable.protocol.codec.check_storable`.
    """
    if isinstance(record, ToolResult):
        check_storable(record.value, what=f"the result of {record.tool!r}")
    elif isinstance(record, SubagentResult):
        check_storable(record.output, what=f"the output of subagent {record.agent!r}")
    else:
        check_storable(
            record.content if record.kind == "user" else record.reason, what="the message"
        )


def split_snapshot(snapshot: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a snapshot body into its static part and its per-revision part (`dynamic_part`)."""
    return {key: snapshot[key] for key in STATIC_KEYS}, dynamic_part(snapshot)


def dynamic_part(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The per-revision part of a snapshot body: a new dict, `snapshot` is left as it is.

    It leaves out the static fields, what holds its default and the metrics that repeat
    top-level counters, so a revision costs a few hundred bytes (W4: bytes <= 3x transcript);
    validation restores them (`join_snapshot`). A copy that deletes is cheaper than a filtering
    comprehension on this path (once per checkpoint).
    """
    dynamic = snapshot.copy()
    pop = dynamic.pop
    for key in STATIC_KEYS:
        pop(key, None)
    for key, default in _EMPTY_ITEMS:
        if key in dynamic and dynamic[key] == default:
            del dynamic[key]
    metrics = snapshot.get("metrics")
    if isinstance(metrics, dict):
        kept = {key: value for key, value in metrics.items() if value}
        for key in _DERIVED_METRICS:
            kept.pop(key, None)
        dynamic["metrics"] = kept
    return dynamic


def join_snapshot(
    static_blob: bytes, dynamic_blob: bytes, *, run_id: str = "?", revision: int | None = None
) -> RunSnapshot:
    """Decode and validate a snapshot stored as its two parts.

    Raises:
        SteerableError: `checkpoint_corrupt` (naming `run_id` and `revision`) or
            `checkpoint_incompatible`.
    """
    _, static = decode_body(static_blob, kind="snapshot")
    _, dynamic = decode_body(dynamic_blob, kind="snapshot")
    for part in (static, dynamic):
        if not isinstance(part, dict):
            raise corrupt_row(run_id, revision, "a snapshot part is not a map")
        if not part.keys() <= _SNAPSHOT_KEYS:  # before merging a crafted part's millions
            extra = next(k for k in part if k not in _SNAPSHOT_KEYS)
            raise corrupt_row(
                run_id,
                revision,
                f"snapshot does not validate: unknown key {str(extra)[:40]!r} "
                f"(of {len(part)} keys)",
            )
    return _validated({**static, **dynamic}, run_id=run_id, revision=revision)


def corrupt_row(run_id: str, revision: int | None, problem: str, **details: Any) -> SteerableError:
    """`checkpoint_corrupt` for a stored row of run `run_id` (at `revision`, if known)."""
    where = f"run {run_id}" if revision is None else f"run {run_id} revision {revision}"
    return SteerableError(
        AgentError.of(
            ErrorCode.CHECKPOINT_CORRUPT,
            f"{where}: {problem}",
            run_id=run_id,
            revision=revision,
            **details,
        )
    )


_MAX_LISTED_ERRORS = 5
_SNAPSHOT_KEYS = frozenset(RunSnapshot.model_fields)


def _validated(
    body: dict[str, Any], *, run_id: str = "?", revision: int | None = None
) -> RunSnapshot:
    # The shape first: pydantic would build one error per unknown key of a crafted row.
    problem = first_shape_error((RunSnapshot,), body)
    if problem is not None:
        raise corrupt_row(run_id, revision, f"snapshot does not validate: {problem}")
    metrics = body.get("metrics")
    usage = body.get("usage") or {}
    if isinstance(metrics, dict) and isinstance(usage, dict):  # counters kept once, at the top
        body = {
            **body,
            "metrics": {
                **metrics,
                "steps": body.get("steps", 0),
                "model_calls": body.get("model_calls", 0),
                "input_tokens": usage.get("input_tokens", 0),
                "output_tokens": usage.get("output_tokens", 0),
            },
        }
    try:
        return RunSnapshot.model_validate(body)
    except ValidationError as exc:
        count = exc.error_count()
        listed = (
            exc.errors(include_url=False, include_context=False, include_input=False)[
                :_MAX_LISTED_ERRORS
            ]
            if count <= 100  # listing builds every error: only for a handful
            else []
        )
        raise corrupt_row(
            run_id, revision, f"snapshot does not validate: {count} errors", errors=listed
        ) from None
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise corrupt_row(run_id, revision, f"snapshot does not validate: {exc}") from None


@dataclass(frozen=True, slots=True)
class RevisionInfo:
    """One revision of a run, as `Runtime.revisions()` lists it."""

    run_id: str
    revision: int
    state: RunState
    transcript_len: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run, as `steerable runs` lists it (its latest revision)."""

    run_id: str
    state: RunState
    revision: int
    task: str
    agent: str
    parent_run_id: str | None
    updated_at: float


def not_found(run_id: str, revision: int | None = None) -> SteerableError:
    """The error for an unknown run or revision."""
    what = f"run {run_id!r}" if revision is None else f"revision {revision} of run {run_id!r}"
    return SteerableError(
        AgentError.of(
            ErrorCode.NOT_FOUND, f"no {what} in this store", run_id=run_id, revision=revision
        )
    )


class CheckpointStore(ABC):
    """Where a runtime keeps runs. Implementations are safe to call from any thread.

    `durable` stores keep what they accepted across a process crash; `send()` stores a
    message before it returns when the store is durable.
    """

    durable: bool = False

    @abstractmethod
    def append_message(self, run_id: str, message: HostMessage) -> None:
        """Store one accepted host message (the durable inbox); must be stored on return.

        Raises:
            TypeError, ValueError: `check_record` refuses it; nothing is stored.
        """

    @abstractmethod
    def journal(
        self,
        run_id: str,
        result: ToolResult | SubagentResult,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        """Store one call's result as it arrives, before its plan completes.

        A store that writes later (a writer thread) calls `on_failed(error)` if it gives the
        write up; it must be quick (a `tell`).

        Raises:
            TypeError, ValueError: `check_record` refuses it; nothing is stored.
        """

    @abstractmethod
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
        """Store revision `revision`: `snapshot` (a RunSnapshot body) and the new entries.

        May return before the data is on disk (a writer thread), but revisions of one run
        are stored in order and a later `load` sees every revision written before it.
        `on_stored()` is called once the revision is stored (committed, for a durable store);
        `on_failed(error)` instead if the store gave the write up (`store_unavailable`),
        exactly one of the two. Both must be quick (a `tell`). A revision whose predecessor
        was given up must not be stored (it would hold a transcript with a hole).
        """

    @abstractmethod
    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        """Load a run at `revision` (None: the latest).

        Raises:
            SteerableError: `not_found`, `checkpoint_corrupt` or `checkpoint_incompatible`.
        """

    @abstractmethod
    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first."""

    @abstractmethod
    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything accepted is written; True if it was within `timeout`."""
        del timeout
        return True

    def close(self) -> None:  # noqa: B027 - stores without resources need no close
        """Release the store's resources (flushes first)."""

    # ------------------------------------------------------------------ ownership
    # A store that does not override these does not fence: every claim succeeds (epoch 0) and
    # nothing is ever refused. MemoryStore and SqliteStore implement them (docs/durability.md).

    fences: bool = False
    """Whether the store implements ownership: leases, epochs and fenced writes."""

    def register_new(self, run_id: str, owner: Owner, ttl: float) -> None:  # noqa: B027
        """A new run of `owner` (start, fork, a new child): epoch 1 from its first write.

        Nobody else can know the run before its first checkpoint, so no claim is needed.
        """

    def claim(self, run_id: str, owner: Owner, ttl: float, *, force: bool = False) -> Lease:
        """Take the run's lease for `ttl` seconds: epoch + 1, this store object writes for it.

        Args:
            run_id: The run.
            owner: The claiming runtime.
            ttl: Seconds until the lease expires unless renewed (on the store's clock).
            force: Take it even from a live owner (a child run, whose parent was claimed).

        Raises:
            SteerableError: `run_owned` if another owner's lease has not expired.
        """
        del ttl, force
        return Lease(run_id, owner, 0, math.inf)

    def renew(self, owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
        """Extend `owner`'s leases of `run_ids` by `ttl`; returns the runs it lost."""
        del owner, run_ids, ttl
        return set()

    def release_lease(self, run_id: str, owner: Owner) -> None:  # noqa: B027
        """Give up `owner`'s lease of the run now (after its queued writes), if still held."""

    def claim_orphans(
        self, owner: Owner, ttl: float, agents: Collection[str], limit: int = 16
    ) -> tuple[list[Lease], list[tuple[str, str]]]:
        """Claim up to `limit` stored top-level runs that are not terminal and nobody holds.

        Only runs whose agent is in `agents` are claimed; one transaction, so adopting
        runtimes never claim the same run twice.

        Returns:
            The leases taken, and (run id, agent) of orphans left for want of their agent.
        """
        del owner, ttl, agents, limit
        return [], []

    def lease(self, run_id: str) -> Lease | None:
        """The run's lease as stored (None: never claimed, or a store without ownership)."""
        del run_id
        return None

    def add_fence_listener(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(run_id)` whenever a write of that run is refused (fenced out).

        Returns:
            A function that removes the listener.
        """
        listeners: FenceListeners | None = self.__dict__.get("_fence_listeners")
        if listeners is None:
            listeners = self.__dict__.setdefault("_fence_listeners", FenceListeners())
        return listeners.add(callback)

    def _fenced(self, run_ids: Collection[str]) -> None:
        listeners: FenceListeners | None = self.__dict__.get("_fence_listeners")
        if listeners is not None and run_ids:
            listeners.fire(run_ids)


class _MemRun:
    __slots__ = ("entries", "journal", "messages", "revisions", "static")

    def __init__(self) -> None:
        self.static: dict[str, Any] = {}
        self.revisions: list[dict[str, Any]] = []
        self.entries: list[TranscriptEntry] = []
        self.messages: list[HostMessage] = []
        self.journal: dict[str, ToolResult | SubagentResult] = {}


class MemoryStore(CheckpointStore):
    """Keeps checkpoints in memory: the default, for runs that need not survive the process.

    Records are immutable, so it keeps them as objects rather than bytes: a checkpoint costs
    a few microseconds (W4), and a passivated run wakes without decoding. Loading validates
    the snapshot as a durable store's load does.
    """

    durable = False
    fences = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _MemRun] = {}
        self._leases = LeaseTable()
        self._ttl = 5.0  # a new run's first lease; renewals use the runtime's ttl

    def _run(self, run_id: str) -> _MemRun:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _MemRun()
        return run

    def append_message(self, run_id: str, message: HostMessage) -> None:
        check_record(message)
        with self._lock:
            self._run(run_id).messages.append(message)

    def journal(
        self,
        run_id: str,
        result: ToolResult | SubagentResult,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        del on_failed  # kept in memory: it cannot fail later
        check_record(result)
        with self._lock:
            if not self._leases.check(run_id, self._ttl):
                fenced = True
            else:
                fenced = False
                self._run(run_id).journal[result.call_id] = result
        if fenced:
            self._fenced([run_id])

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
        del on_failed  # stored before this returns, or it raises
        dynamic = dynamic_part(snapshot)  # what a durable store writes per revision (W4)
        with self._lock:
            if not self._leases.check(run_id, self._ttl, snapshot["agent"]):
                fenced = True
            else:
                fenced = False
                self._store_checkpoint(run_id, revision, snapshot, dynamic, entries_from, entries)
        if fenced:
            self._fenced([run_id])
        elif on_stored is not None:
            on_stored()

    def _store_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        dynamic: dict[str, Any],
        entries_from: int,
        entries: Sequence[TranscriptEntry],
    ) -> None:
        # Called under the lock.
        run = self._run(run_id)
        if not run.static or revision == 0:
            run.static = {k: snapshot[k] for k in STATIC_KEYS}
        if entries:
            del run.entries[entries_from:]  # a resumed run rewrites from its length
            run.entries.extend(entries)
        del run.revisions[revision:]
        run.revisions.append(dynamic)
        if not snapshot["plan"]:
            run.journal.clear()  # the plan's results are in the transcript now
        if snapshot["state"] in TERMINAL_STATES:
            self._leases.ended(run_id)

    # ------------------------------------------------------------------ ownership

    def register_new(self, run_id: str, owner: Owner, ttl: float) -> None:
        with self._lock:
            self._ttl = ttl
            self._leases.register_new(run_id, owner)

    def claim(self, run_id: str, owner: Owner, ttl: float, *, force: bool = False) -> Lease:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.revisions:
                raise not_found(run_id)
            return self._leases.claim(run_id, owner, ttl, force=force, agent=run.static["agent"])

    def renew(self, owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
        with self._lock:
            self._ttl = ttl
            return self._leases.renew(owner, run_ids, ttl)

    def release_lease(self, run_id: str, owner: Owner) -> None:
        with self._lock:
            self._leases.release(run_id, owner)

    def claim_orphans(
        self, owner: Owner, ttl: float, agents: Collection[str], limit: int = 16
    ) -> tuple[list[Lease], list[tuple[str, str]]]:
        taken: list[Lease] = []
        left: list[tuple[str, str]] = []
        with self._lock:
            for run_id, run in sorted(self._runs.items()):
                if not run.revisions or run.static.get("parent_run_id") is not None:
                    continue
                if RunState(run.revisions[-1]["state"]).is_terminal:
                    continue
                if not self._leases.expired(run_id):
                    continue
                agent = run.static["agent"]
                if agent not in agents:
                    left.append((run_id, agent))
                elif len(taken) < limit:
                    taken.append(self._leases.claim(run_id, owner, ttl, force=False, agent=agent))
        return taken, left

    def lease(self, run_id: str) -> Lease | None:
        with self._lock:
            return self._leases.leases.get(run_id)

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.revisions:
                raise not_found(run_id)
            index = len(run.revisions) - 1 if revision is None else revision
            if not 0 <= index < len(run.revisions):
                raise not_found(run_id, revision)
            body = {**run.static, **run.revisions[index]}
            latest = index == len(run.revisions) - 1
            entries = list(run.entries)
            journal = dict(run.journal) if latest else {}
            messages = list(run.messages)
        snapshot = _validated(body, run_id=run_id, revision=index)
        return StoredRun(
            snapshot=snapshot,
            transcript=entries[: snapshot.transcript_len],
            journal=journal,
            messages=[m for m in messages if m.seq > snapshot.last_seq] if latest else [],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        with self._lock:
            run = self._runs.get(run_id)
            bodies = list(run.revisions) if run is not None else []
        if not bodies:
            raise not_found(run_id)
        return [
            RevisionInfo(
                run_id=run_id,
                revision=body["revision"],
                state=RunState(body["state"]),
                transcript_len=body["transcript_len"],
                updated_at=body["updated_at"],
            )
            for body in bodies
        ]

    def runs(self) -> list[RunSummary]:
        with self._lock:
            latest = [
                (rid, r.static, r.revisions[-1]) for rid, r in self._runs.items() if r.revisions
            ]
        out = [
            RunSummary(
                run_id=run_id,
                state=RunState(body["state"]),
                revision=body["revision"],
                task=static["task"],
                agent=static["agent"],
                parent_run_id=static["parent_run_id"],
                updated_at=body["updated_at"],
            )
            for run_id, static, body in latest
        ]
        return sorted(out, key=lambda s: s.run_id)
