"""Checkpoint stores: where runs' snapshots, transcripts, inboxes and journals live (R21, R25).

The layout is hybrid (R25): per run, an append-only log of transcript entries, a small
snapshot per revision, the durable inbox of host messages, and the journal of tool results
as they arrive. A checkpoint writes one snapshot and only the entries added since the previous
revision, so its cost does not grow with the run (docs/benchmarks.md W4). Checkpoints, the event
stream (trace) and any memory an agent keeps stay separate responsibilities.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from steerable.protocol import (
    AgentError,
    ErrorCode,
    HostMessage,
    RunEvent,
    RunSnapshot,
    RunState,
    SteerableError,
    StoredRun,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)
from steerable.protocol._codec import MAX_VALUE_BYTES, check_storable, decode_body
from steerable.protocol._shape import first_shape_error
from steerable.protocol._stored import STATIC_KEYS, dynamic_part

from .events import DEFAULT_EVENT_RETENTION, EventHistory, EventRecord
from .lease import FenceListeners, Lease, Owner

__all__ = [
    "STATIC_KEYS",
    "CheckpointStore",
    "EventRecord",
    "Lease",
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

TERMINAL_STATES = frozenset(state.value for state in RunState if state.is_terminal)
"""The terminal states' values (a RunState is equal to its value): a set lookup per checkpoint
instead of an Enum call."""


def check_record(record: HostMessage | ToolResult | SubagentResult) -> None:
    """Refuse a message or result whose free-form values no store could keep.

    Every store calls it in `append_message` and `journal`, so that all of them accept and
    refuse the same records (the entry points have checked them with the same rules).

    Raises:
        TypeError, ValueError: As `steerable.protocol.codec.check_storable`.
    """
    if isinstance(record, ToolResult):
        value = record.value
        if type(value) is str and len(value) <= MAX_VALUE_BYTES and value.isascii():
            return  # the common result, short text: storable (its message is not built)
        check_storable(value, what=f"the result of {record.tool!r}")
    elif isinstance(record, SubagentResult):
        check_storable(record.output, what=f"the output of subagent {record.agent!r}")
    else:
        check_storable(
            record.content if record.kind == "user" else record.reason, what="the message"
        )


def split_snapshot(snapshot: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a snapshot body into its static part and its per-revision part (`dynamic_part`)."""
    return {key: snapshot[key] for key in STATIC_KEYS}, dynamic_part(snapshot)


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
    def append_message(
        self, run_id: str, message: HostMessage, *, message_id: str | None = None
    ) -> None:
        """Store one accepted host message (the durable inbox); must be stored on return.

        `message_id` (given only when the caller chose one) is kept with it, for
        `message_seq`.

        Raises:
            TypeError, ValueError: `check_record` refuses it; nothing is stored.
        """

    def message_seq(self, run_id: str, message_id: str) -> int | None:
        """The inbox seq of the run's message stored with `message_id` (None: none is)."""
        del run_id, message_id
        return None

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

    def reload(self, run_id: str, held: Sequence[TranscriptEntry]) -> StoredRun:
        """Load a run's latest revision for a caller that holds its first transcript entries.

        `held` are entries this process wrote and still has in memory (a passivated run's
        transcript): a store may return them as the transcript's prefix and read only the
        entries past them, so that waking a long run costs what its new entries cost. Entries
        are append-only and a run's writes are fenced, so the prefix cannot differ from what
        the store holds. The caller's own writes of the run must be stored already (a
        passivated run's are): a store need not wait for its queue. The default is
        `load(run_id)`.

        Raises:
            SteerableError: as `load`.
        """
        return self.load(run_id)

    @abstractmethod
    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first."""

    @abstractmethod
    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first."""

    # ------------------------------------------------------------------ stored events
    # A store that does not override these keeps no events (docs/durability.md, "Stored
    # events"): `rt.events()` then serves only runs that live in the calling runtime.

    stores_events: bool = False
    """Whether the store keeps runs' event streams."""

    event_retention: int = DEFAULT_EVENT_RETENTION
    """Events kept per run stream; older ones are deleted as new ones land."""

    def append_events(  # noqa: B027 - a store without events ignores them
        self,
        run_id: str,
        trace_id: str,
        records: Sequence[EventRecord],
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        """Store events of top-level run `run_id`'s stream (its subagents' included).

        May return before they are stored (a writer thread); a later `events()` sees them.
        Idempotent per (run_id, seq). Fenced like `journal`: refused once this store object
        lost the run's lease. `on_failed(error)` if a writer gives the write up (quick).
        """

    keeps_history: bool = False
    """Whether `append_history` keeps the history itself rather than a copy (its log then
    packs what the collector would walk before handing it over)."""

    def append_history(self, run_id: str, trace_id: str, history: EventHistory) -> None:
        """Store the last events of run `run_id`'s stream, which is closed: nothing follows.

        As `append_events(run_id, trace_id, history.records())` (this default); a store may
        keep `history` itself instead, since its records never change (`MemoryStore`).
        """
        records = history.records()
        if records:
            self.append_events(run_id, trace_id, records)

    def events(self, run_id: str, start: int = 0, limit: int | None = None) -> list[RunEvent]:
        """The stored events of run `run_id`'s stream with seq >= `start`, oldest first.

        Raises:
            SteerableError: `not_found` if the store knows neither the run nor an event of it;
                `checkpoint_corrupt` for a stored event that does not decode.
        """
        del start, limit
        raise not_found(run_id)

    def next_event_seq(self, run_id: str) -> int:
        """One more than the highest stored seq of the run's stream (0: none stored)."""
        del run_id
        return 0

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything accepted is written; True if it was within `timeout`."""
        del timeout
        return True

    def commit_now(self, run_id: str) -> bool:
        """Commit run `run_id`'s queued writes on the calling thread, if that needs no waiting.

        Called by a run that waits for its own checkpoint on a pool worker (a thread that
        may block for a commit). A store that commits on a thread of its own may do so
        instead of waking that thread (`SqliteStore`); it must never wait for a lock held
        elsewhere, retry, or give a write up here. Returns False if it did nothing (the
        default): the writes are committed as usual.
        """
        del run_id
        return False

    def compact(self, run_id: str) -> None:  # noqa: B027 - most stores hold nothing to compact
        """Run `run_id` has ended and its supervisor is stopping: keep what is left of it in
        its most compact form. Called once the run's outcome is published, so none of it is
        on the way to the host that waits for it (`MemoryStore` encodes the run's transcript
        here, as a durable store holds it). Must not raise. Default: nothing."""

    def commit_soon(self) -> None:  # noqa: B027 - a store with no thread has none to wake
        """Have writes queued without waking the store's thread (see `commit_now`) committed
        without delay: a run handled on a pool worker waits for them. Default: nothing."""

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
