"""Checkpoint stores: where runs' snapshots, transcripts, inboxes and journals live (R21, R25).

The layout is hybrid (R25): per run, an append-only log of transcript entries, a small
snapshot per revision, the durable inbox of host messages, and the journal of tool results
as they arrive. A checkpoint writes one snapshot and only the entries added since the previous
revision, so its cost does not grow with the run (docs/benchmarks.md W4). Checkpoints, the event
stream (trace) and any memory an agent keeps stay separate responsibilities.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
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

__all__ = [
    "CheckpointStore",
    "MemoryStore",
    "RevisionInfo",
    "RunSummary",
    "StoredRun",
    "check_record",
    "corrupt_row",
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
_STATIC = frozenset(STATIC_KEYS)


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
_DERIVED_METRICS = frozenset({"steps", "model_calls", "input_tokens", "output_tokens"})


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
    """Split a snapshot body into its static part and its per-revision part.

    The per-revision part leaves out what holds its default and the metrics that repeat
    top-level counters, so a revision costs a few hundred bytes (W4: bytes <= 3x transcript).
    """
    static = {key: snapshot[key] for key in STATIC_KEYS}
    dynamic = {
        key: value
        for key, value in snapshot.items()
        if key not in _STATIC and (key not in _EMPTY or value != _EMPTY[key])
    }
    dynamic["metrics"] = {
        key: value
        for key, value in snapshot["metrics"].items()
        if value and key not in _DERIVED_METRICS
    }
    return static, dynamic


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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _MemRun] = {}

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
            self._run(run_id).journal[result.call_id] = result

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
        dynamic = {k: v for k, v in snapshot.items() if k not in _STATIC}
        with self._lock:
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
        if on_stored is not None:
            on_stored()

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
