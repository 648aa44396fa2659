"""A run as a store hands it back: the input of a resume, a replay or a fork."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ._checkpoint import RunSnapshot
from ._messages import HostMessage, SubagentResult, ToolResult, TranscriptEntry

__all__ = [
    "DERIVED_METRICS",
    "SNAPSHOT_DEFAULTS",
    "STATIC_KEYS",
    "LazyEntries",
    "SnapshotBody",
    "StoredRun",
    "body_template",
    "dynamic_part",
    "snapshot_body",
    "templated_body",
    "trimmed_metrics",
]

STATIC_KEYS: tuple[str, ...] = (
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
_STATIC_SET = frozenset(STATIC_KEYS)

SNAPSHOT_DEFAULTS: dict[str, Any] = {
    "waiting_for": None,
    "pending_messages": [],
    "plan": [],
    "errors": [],
    "output": None,
    "deadline_left": None,
    "last_seq": -1,
    "delivered_seq": -1,
}
"""Per-revision fields left out of a revision while they hold their default (validation
restores them). Read-only: a body gets fresh lists of its own."""
_DEFAULT_ITEMS = tuple(SNAPSHOT_DEFAULTS.items())

DERIVED_METRICS = frozenset({"steps", "model_calls", "input_tokens", "output_tokens"})
"""Metrics that repeat a snapshot's top-level counters: a revision keeps them once, at the top."""


def dynamic_part(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The per-revision part of a snapshot body: what a store writes per revision.

    It leaves out the static fields, what holds its default and the metrics that repeat
    top-level counters (or are zero), so a revision costs a few hundred bytes (W4: bytes <= 3x
    transcript); validation restores them (`join_snapshot` in the stores). A `SnapshotBody`
    hands over the part it was built with (no work); any other dict gets a new part and is
    left as it is. Either way the part must not be mutated: a store keeps it as it is.
    """
    if type(snapshot) is SnapshotBody:
        part = snapshot.dynamic
        if part is not None:
            return part
    dynamic = snapshot.copy()  # a copy that deletes is cheaper than a filtering comprehension
    pop = dynamic.pop
    for key in STATIC_KEYS:
        pop(key, None)
    for key, default in _DEFAULT_ITEMS:
        if key in dynamic and dynamic[key] == default:
            del dynamic[key]
    metrics = snapshot.get("metrics")
    if isinstance(metrics, dict):
        dynamic["metrics"] = trimmed_metrics(metrics)
    return dynamic


def trimmed_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics a revision keeps: the non-zero ones that no top-level counter repeats."""
    return {key: value for key, value in metrics.items() if value and key not in DERIVED_METRICS}


class SnapshotBody(dict[str, Any]):
    """A `RunSnapshot` body (JSON shape) built together with its per-revision part
    (`snapshot_body` builds one).

    It is the plain dict a store's `write_checkpoint` takes (a full body, every field), and it
    carries `dynamic`, equal to what `dynamic_part` would compute from it, so that the
    built-in stores do not split each checkpoint again (W4, W1). Setting a per-revision field
    that is never left out (`updated_at`, the host's stamp) keeps `dynamic` in step; any other
    change drops it (`dynamic` None: `dynamic_part` computes the part from the body).

    Pickles and deep-copies as a plain dict.
    """

    dynamic: dict[str, Any] | None = None
    """The per-revision part the body was built with (None: not known, or changed since)."""

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        dynamic = self.dynamic
        if dynamic is not None:
            if key in _STATIC_SET or key in SNAPSHOT_DEFAULTS or key == "metrics":
                self.dynamic = None  # left out or trimmed by rule: computed again if needed
            else:
                dynamic[key] = value

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.dynamic = None

    def __ior__(self, other: Any) -> SnapshotBody:  # type: ignore[override,misc]
        dict.update(self, other)
        self.dynamic = None
        return self

    def update(self, *args: Any, **kwargs: Any) -> None:
        dict.update(self, *args, **kwargs)
        self.dynamic = None

    def pop(self, *args: Any) -> Any:
        self.dynamic = None
        return dict.pop(self, *args)

    def popitem(self) -> tuple[str, Any]:
        self.dynamic = None
        return dict.popitem(self)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.dynamic = None
        return dict.setdefault(self, key, default)

    def clear(self) -> None:
        self.dynamic = None
        dict.clear(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class LazyEntries(Sequence[TranscriptEntry]):
    """A stored transcript whose entries are decoded and validated when first read.

    A durable store checks every row's checksum when it loads a run, then hands the raw
    records over: a run of thousands of entries loads in the time of its SQL query, and an
    entry costs its decoding only once it is read (then it is kept). Reading an entry that does
    not decode or validate raises what an eager load would have raised (`checkpoint_corrupt`
    naming the run, revision and entry); it is tried again on the next read.

    It compares equal to a list (or another `LazyEntries`) of the same entries. Safe to read
    from several threads: an entry two threads read at once may be decoded twice, never
    differently.
    """

    __slots__ = ("_decode", "_items")

    def __init__(
        self, raw: Sequence[bytes], decode: Callable[[int, bytes], TranscriptEntry]
    ) -> None:
        """Wrap `raw` records.

        Args:
            raw: One encoded record per entry, in transcript order (already checksummed).
            decode: `decode(index, raw)` returns the validated entry, or raises the store's
                typed error for a record that does not decode.
        """
        self._items: list[Any] = list(raw)  # bytes until read, then the entry
        self._decode = decode

    def _at(self, index: int) -> TranscriptEntry:
        item = self._items[index]
        if type(item) is bytes:
            if index < 0:
                index += len(self._items)
            item = self._decode(index, item)
            self._items[index] = item
        entry: TranscriptEntry = item
        return entry

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> TranscriptEntry: ...

    @overload
    def __getitem__(self, index: slice) -> list[TranscriptEntry]: ...

    def __getitem__(self, index: int | slice) -> TranscriptEntry | list[TranscriptEntry]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self._items)))]
        return self._at(index)

    def __iter__(self) -> Iterator[TranscriptEntry]:
        for index in range(len(self._items)):
            yield self._at(index)

    def __reversed__(self) -> Iterator[TranscriptEntry]:
        for index in range(len(self._items) - 1, -1, -1):
            yield self._at(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyEntries | list):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable cache, compared by value

    def __repr__(self) -> str:
        return f"LazyEntries({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))  # pickles as the plain list it reads as


@dataclass(slots=True)
class StoredRun:
    """A run loaded at one revision: everything a resume, replay or fork needs."""

    snapshot: RunSnapshot
    transcript: Sequence[TranscriptEntry]
    """The entries up to the revision, in order: a list, or a `LazyEntries` a durable store
    decodes as they are read."""
    journal: dict[str, ToolResult | SubagentResult] = field(default_factory=dict)
    """Results of the current plan's calls recorded after the snapshot (durable inbox)."""
    messages: list[HostMessage] = field(default_factory=list)
    """Host messages accepted after the snapshot (seq > snapshot.last_seq), in seq order."""


_update = dict.update
_set = dict.__setitem__


def snapshot_body(
    static: dict[str, Any], dynamic: dict[str, Any], metrics: dict[str, Any]
) -> SnapshotBody:
    """The full body of `static` fields, `dynamic` (as `dynamic_part` leaves it: no static
    field, none at its default, metrics trimmed) and `metrics` (the full metrics).

    Fields `dynamic` leaves out take their defaults (fresh lists: a body is the caller's).
    """
    body = SnapshotBody(
        static,
        waiting_for=None,
        pending_messages=[],
        plan=[],
        errors=[],
        output=None,
        deadline_left=None,
        last_seq=-1,
        delivered_seq=-1,
    )
    _update(body, dynamic)
    _set(body, "metrics", metrics)
    body.dynamic = dynamic
    return body


TEMPLATE_KEYS: tuple[str, ...] = (
    "revision",
    "state",
    "model_calls",
    "model_retries",
    "steps",
    "usage",
    "decisions",
    "transcript_len",
    "metrics",
    "updated_at",
)
"""The per-revision fields every revision holds (never at a default), in the order a
`templated_body`'s `dynamic` gives them."""
_LIST_DEFAULTS = ("pending_messages", "plan", "errors")


def body_template(static: dict[str, Any]) -> dict[str, Any]:
    """A template for `templated_body`: `static`, the defaults, and a placeholder for each of
    `TEMPLATE_KEYS`, in the key order `snapshot_body` gives a body.

    Read-only (its default lists are shared): a run builds it once.
    """
    template = {**static, **SNAPSHOT_DEFAULTS}
    for key in TEMPLATE_KEYS:
        template[key] = None
    return template


def templated_body(
    template: dict[str, Any], dynamic: dict[str, Any], metrics: dict[str, Any]
) -> SnapshotBody:
    """`snapshot_body(static, dynamic, metrics)` for a `body_template(static)`, when `dynamic`
    holds every one of `TEMPLATE_KEYS` first, in that order (then any of the others).

    The same body, built as one copy of the template that no key makes grow (per checkpoint:
    two per W1 iteration, docs/performance.md "Wave 4: machine CPU, session 6").
    """
    body = SnapshotBody(template)
    _update(body, dynamic)
    for key in _LIST_DEFAULTS:
        if key not in dynamic:
            _set(body, key, [])  # fresh: a body is the caller's
    _set(body, "metrics", metrics)
    body.dynamic = dynamic
    return body
