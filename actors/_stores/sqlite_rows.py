"""Reading SqliteStore rows that may be damaged or crafted: every way a row can be wrong
becomes `checkpoint_corrupt` naming the run and revision (docs/reliability.md, "Store faults")."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from steerable.protocol import AgentError, ErrorCode, RunState, SteerableError, TranscriptEntry
from steerable.protocol._codec import decode, decode_body
from steerable.protocol._stored import LazyEntries

from .store import RevisionInfo, RunSummary, corrupt_row

__all__ = [
    "bound_blob",
    "checked",
    "checksum",
    "corrupt",
    "decoded",
    "lazy_entries",
    "named",
    "revision_info",
    "summary",
]

_T = TypeVar("_T")


bound_blob = bytearray
"""How a row's blob is bound (`bound_blob(blob)`): sqlite3 binds an exact int, float, str or
bytearray as it is, and looks anything else up in its adapter registry first, which on Python
3.11 raises and clears an AttributeError per parameter (~0.7 µs, ~15 blobs a W1 iteration).
A bytearray copy of a few hundred bytes is a tenth of that; it reads back as bytes."""


def checksum(blob: bytes) -> int:
    """The CRC32 every row carries of its bytes."""
    return zlib.crc32(blob)


def checked(blob: bytes, crc: int, run_id: str, what: str) -> bytes:
    """The row's bytes, if their checksum holds (the codec alone cannot see a flipped bit
    inside a string or a number)."""
    if not isinstance(blob, bytes) or zlib.crc32(blob) != crc:
        raise corrupt(
            f"run {run_id}: {what} fails its checksum (damaged or truncated row)",
            run_id=run_id,
            row=what,
        )
    return blob


def named(run_id: str, revision: int | None, read: Callable[[], _T]) -> _T:
    """`read()`, with every way a crafted row can fail it turned into `checkpoint_corrupt`
    naming the run and revision."""
    try:
        return read()
    except SteerableError as exc:
        if exc.code is not ErrorCode.CHECKPOINT_CORRUPT or exc.error.details.get("run_id"):
            raise
        raise corrupt_row(run_id, revision, exc.error.message) from None
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        raise corrupt_row(run_id, revision, f"{type(exc).__name__}: {str(exc)[:200]}") from None


def decoded(blob: bytes, crc: int, run_id: str, revision: int | None, what: str, kind: str) -> Any:
    """The record a row holds, checked and validated, or `checkpoint_corrupt` naming it."""
    return named(run_id, revision, lambda: decode(checked(blob, crc, run_id, what), kind=kind))


def lazy_entries(
    rows: Sequence[tuple[Any, Any]],
    length: int,
    run_id: str,
    revision: int | None,
    start: int = 0,
) -> LazyEntries:
    """Transcript rows `(blob, crc)` as a `LazyEntries` of the `length` entries from `start`.

    `rows` are the run's rows with an integer index in `start .. start + length - 1`, in order
    (unique: the table's primary key), so `length` of them are the whole transcript. Every
    row's checksum is checked now; each record is decoded and validated when first read
    (`checkpoint_corrupt` naming the run, revision and entry if it does not).

    Raises:
        SteerableError: `checkpoint_corrupt` for a missing entry or a failed checksum.
    """
    if len(rows) != length:
        raise corrupt_row(
            run_id, revision, f"transcript has {start + len(rows)} of {start + length} entries"
        )
    raw: list[bytes] = []
    crc32 = zlib.crc32
    for idx, (blob, crc) in enumerate(rows, start):
        if type(blob) is not bytes or crc32(blob) != crc:
            checked(blob, crc, run_id, f"entry {idx}")  # raises
        raw.append(blob)

    def entry(index: int, blob: bytes) -> TranscriptEntry:
        try:
            record: TranscriptEntry = decode(blob, kind="entry")
        except SteerableError as exc:
            raise corrupt_row(
                run_id, revision, f"entry {start + index}: {exc.error.message}"
            ) from None
        return record

    return LazyEntries(raw, entry)


def revision_info(run_id: str, revision: int | None, blob: bytes, crc: int) -> RevisionInfo:
    """A `revisions` row as a RevisionInfo (raises plain errors: call it through `named`)."""
    _, body = decode_body(checked(blob, crc, run_id, f"revision {revision}"), kind="snapshot")
    if not isinstance(body, dict):
        raise TypeError("the revision is not a map")
    info = RevisionInfo(
        run_id=run_id,
        revision=_int(body["revision"]),
        state=RunState(body["state"]),
        transcript_len=_int(body["transcript_len"]),
        updated_at=_number(body["updated_at"]),
    )
    if info.revision != revision:
        raise ValueError(f"the row of revision {revision} holds revision {info.revision}")
    return info


def summary(row: tuple[Any, ...]) -> RunSummary:
    """A `runs` row as a RunSummary, every column checked."""
    run_id = row[0]
    if not isinstance(run_id, str):
        raise corrupt_row(repr(run_id)[:40], None, "the run id is not text")
    revision = row[2] if type(row[2]) is int else None
    return named(
        run_id,
        revision,
        lambda: RunSummary(
            run_id=run_id,
            state=RunState(row[1]),
            revision=_int(row[2]),
            task=_text(row[3]),
            agent=_text(row[4]),
            parent_run_id=None if row[5] is None else _text(row[5]),
            updated_at=_number(row[6]),
        ),
    )


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, found {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if type(value) not in (int, float):
        raise TypeError(f"expected a number, found {type(value).__name__}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, found {type(value).__name__}")
    return value


def corrupt(message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.CHECKPOINT_CORRUPT, message, **details))
