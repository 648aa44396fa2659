"""A run as a store hands it back: the input of a resume, a replay or a fork."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ._checkpoint import RunSnapshot
from ._messages import HostMessage, SubagentResult, ToolResult, TranscriptEntry

__all__ = ["LazyEntries", "StoredRun"]


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
