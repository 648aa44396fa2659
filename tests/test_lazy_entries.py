"""A stored run's transcript decoded lazily (W4): `LazyEntries` and SqliteStore's load.

The load checks every row's checksum and the transcript's completeness; each entry is decoded
and validated when first read, once, and a record that does not decode is refused every time it
is read, with the `checkpoint_corrupt` an eager load gave.
"""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from steerable.actors import SqliteStore
from steerable.protocol import ErrorCode, SteerableError, SystemNote, TranscriptEntry
from steerable.protocol._codec import decode, encode
from steerable.protocol._stored import LazyEntries

if TYPE_CHECKING:  # mypy resolves the kit as tests.* (explicit package bases)
    from tests.test_stores import notes, snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from test_stores import notes, snapshot

NOTES = [SystemNote(text=f"n{i}") for i in range(5)]


class Counting:
    """A decode function that counts its calls, and refuses the indices in `bad`."""

    def __init__(self, bad: frozenset[int] = frozenset()) -> None:
        self.calls: list[int] = []
        self.bad = bad

    def __call__(self, index: int, raw: bytes) -> TranscriptEntry:
        self.calls.append(index)
        if index in self.bad:
            raise ValueError(f"entry {index} is bad")
        entry: TranscriptEntry = decode(raw, kind="entry")
        return entry


def lazy(decoder: Counting) -> LazyEntries:
    return LazyEntries([encode(n, kind="entry") for n in NOTES], decoder)


def test_nothing_is_decoded_until_read_and_each_entry_once() -> None:
    decoder = Counting()
    entries = lazy(decoder)
    assert len(entries) == 5
    assert decoder.calls == []
    assert entries[2] == NOTES[2]
    assert entries[-1] == NOTES[4]
    assert decoder.calls == [2, 4]  # a negative index decodes the entry it names
    assert list(entries) == NOTES
    assert list(entries) == NOTES
    assert sorted(decoder.calls) == [0, 1, 2, 3, 4]


def test_it_reads_as_the_list_of_its_entries() -> None:
    entries = lazy(Counting())
    assert entries == NOTES
    assert NOTES == entries  # noqa: SIM300 - the reflected comparison, on purpose
    assert entries != NOTES[:4]
    assert entries != tuple(NOTES)  # a list is never equal to a tuple either
    assert entries[1:4] == NOTES[1:4]
    assert entries[::-2] == NOTES[::-2]
    assert list(reversed(entries)) == NOTES[::-1]
    assert NOTES[3] in entries
    assert entries.index(NOTES[3]) == 3
    assert entries == lazy(Counting())
    assert pickle.loads(pickle.dumps(entries)) == NOTES
    assert repr(entries).startswith("LazyEntries([SystemNote(")
    with pytest.raises(IndexError):
        entries[5]
    with pytest.raises(TypeError):
        hash(entries)


def test_an_entry_that_does_not_decode_is_refused_each_time_it_is_read() -> None:
    decoder = Counting(bad=frozenset({3}))
    entries = lazy(decoder)
    assert entries[:3] == NOTES[:3]
    for _ in range(2):
        with pytest.raises(ValueError, match="entry 3"):
            entries[3]
    with pytest.raises(ValueError, match="entry 3"):
        list(entries)
    assert decoder.calls.count(3) == 3  # never cached as if it had decoded
    assert entries[4] == NOTES[4]


def _stored(path: Path, count: int) -> None:
    store = SqliteStore(path)
    try:
        store.write_checkpoint(
            "r", 0, snapshot("r", 0, transcript_len=count), 0, notes("r", 0, count)
        )
    finally:
        store.close()


def test_sqlite_load_checks_every_checksum_before_anything_is_read(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    _stored(path, 3)
    with sqlite3.connect(path) as conn:  # a flipped byte: the checksum no longer holds
        (blob,) = conn.execute("SELECT entry FROM entries WHERE idx=2").fetchone()
        conn.execute("UPDATE entries SET entry=? WHERE idx=2", (blob[:-1] + b"!",))
    conn.close()
    store = SqliteStore(path)
    try:
        with pytest.raises(SteerableError) as raised:
            store.load("r")
        assert raised.value.code is ErrorCode.CHECKPOINT_CORRUPT
        assert "entry 2 fails its checksum" in raised.value.error.message
    finally:
        store.close()


@pytest.mark.parametrize("hole", ["missing", "misnumbered", "fractional", "text"])
def test_sqlite_load_refuses_a_transcript_with_a_hole(tmp_path: Path, hole: str) -> None:
    path = tmp_path / "runs.db"
    _stored(path, 3)
    with sqlite3.connect(path) as conn:
        if hole == "missing":
            conn.execute("DELETE FROM entries WHERE idx=1")
        else:  # entry 1 goes, a row that is no entry index comes (the load counts the others)
            value = {"misnumbered": -1, "fractional": 0.5, "text": "one"}[hole]
            conn.execute("UPDATE entries SET idx=? WHERE idx=1", (value,))
    conn.close()
    store = SqliteStore(path)
    try:
        with pytest.raises(SteerableError) as raised:
            store.load("r")
        assert raised.value.code is ErrorCode.CHECKPOINT_CORRUPT
        assert "transcript has" in raised.value.error.message
    finally:
        store.close()


def test_sqlite_load_reads_entries_after_the_store_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    _stored(path, 4)
    store = SqliteStore(path)
    stored = store.load("r")
    store.close()
    assert isinstance(stored.transcript, LazyEntries)
    assert [e.text for e in stored.transcript if isinstance(e, SystemNote)] == [
        f"r/{i}" for i in range(4)
    ]
