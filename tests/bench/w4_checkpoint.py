"""W4: W1 with 200-byte tool results, a checkpoint at every safe boundary.

Figures, per store (in memory; `SqliteStore` when it exists):
- µs per checkpoint near iteration 10 and near iteration 1,000: each `write_checkpoint` call is
  timed by a subclass of the store: the CPU time the supervisor's thread spends in it
  (`time.thread_time`; its wall time near iteration 1,000 is reported beside, and includes
  waits for the GIL while a store's writer runs); means of the calls writing iterations 5-15
  and 990-1,000, their highest and lowest tenth left out (see `_trimmed_mean`). Floor:
  `msgpack.packb` of the same snapshot dict, in CPU time too. Flatness: the lower quartiles
  of the two windows' calls, late over early (see `_lower_quartile`).
- bytes the store holds for the whole run / the transcript's size (sum of encoded entries).
- SqliteStore only: time to load the latest state of a 1,000-iteration run in a fresh process
  (`SqliteStore(path).load(run_id)`, imports excluded and reported apart), and the load plus
  reading every transcript entry (the load decodes entries as they are read).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from steerable.actors import CheckpointStore, MemoryStore, Runtime, tool
from steerable.protocol import RunState, TranscriptEntry
from steerable.protocol._codec import encode, encode_body

from ._common import (
    NO_POSTGRES,
    Result,
    cpu_note,
    drop_postgres_schema,
    expect,
    metric,
    not_available,
    postgres_dsn,
    postgres_schema,
    sqlite_available,
    temp_dir,
)
from .w1_loop import config_for

RESULT_200 = "r" * 200
EARLY = (5, 15)  # iterations
LATE_SPAN = 10


@tool
def fetch200() -> str:
    """Return 200 bytes."""
    return RESULT_200


class _Timing:
    """Per-call timings of `write_checkpoint`: (transcript length before the call, µs of the
    calling thread's CPU, floor µs, µs of wall time)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float, float, float]] = []


def timed(store_cls: type[CheckpointStore]) -> type[CheckpointStore]:
    """A subclass of `store_cls` that times every `write_checkpoint` call."""

    class Timed(store_cls):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timing = _Timing()

        def write_checkpoint(
            self,
            run_id: str,
            revision: int,
            snapshot: dict[str, Any],
            entries_from: int,
            entries: Sequence[TranscriptEntry],
            on_stored: Callable[[], None] | None = None,
            **kwargs: Any,
        ) -> None:
            w0 = time.perf_counter()
            t0 = time.thread_time()
            super().write_checkpoint(
                run_id, revision, snapshot, entries_from, entries, on_stored, **kwargs
            )
            t1 = time.thread_time()
            w1 = time.perf_counter()
            msgpack.packb(snapshot)  # the floor: one msgpack pass over the same snapshot
            t2 = time.thread_time()
            self.timing.calls.append(
                (entries_from, (t1 - t0) * 1e6, (t2 - t1) * 1e6, (w1 - w0) * 1e6)
            )

    Timed.__name__ = f"Timed{store_cls.__name__}"
    return Timed


class W4Agent:
    """Plans one `fetch200` call per decision, `n` times, then finishes."""

    name = "w4"

    def __init__(self, n: int) -> None:
        from .w1_loop import LoopAgent

        self._inner = LoopAgent(n, "fetch200")

    def decide(self, view: Any) -> Any:
        return self._inner.decide(view)


def _median(values: Sequence[float]) -> float:
    data = sorted(values)
    return data[len(data) // 2] if data else float("nan")


def _window(timing: _Timing, lo_iter: int, hi_iter: int, col: int) -> float:
    return _trimmed_mean(_calls(timing, lo_iter, hi_iter, col))


def _calls(timing: _Timing, lo_iter: int, hi_iter: int, col: int) -> list[float]:
    # Each iteration adds 2 entries (decision, result): transcript length ~ 2 * iteration.
    return [c[col] for c in timing.calls if 2 * lo_iter <= c[0] < 2 * hi_iter]


def _lower_quartile(values: Sequence[float]) -> float:
    """The flatness measure: what a call costs when nothing else is paid inside it.

    A call that wakes the store's sleeping writer thread pays for the wake inside its queue
    put (~12 µs of system CPU unpinned on these machines, a cross-core wake; ~2 pinned),
    and whether the writer sleeps depends on timing, not on the run's length. Growth with
    the length shows in every call, the cheapest included.
    """
    data = sorted(values)
    return data[len(data) // 4] if data else float("nan")


def _trimmed_mean(values: Sequence[float], cut: float = 0.1) -> float:
    """The mean without the lowest and highest `cut` of the values.

    Not the median: an iteration's two checkpoints can cost apart, and the median of a
    window holding as many of each flips between the two.
    """
    data = sorted(values)
    k = int(len(data) * cut)
    kept = data[k : len(data) - k] if len(data) > 2 * k else data
    return sum(kept) / len(kept) if kept else float("nan")


def _size(item: Any, kind: str = "entry") -> int:
    """Encoded size of one stored item: bytes as is, records and dicts as the codec writes them."""
    if isinstance(item, bytes | bytearray):
        return len(item)
    if isinstance(item, tuple) and item and isinstance(item[-1], bytes | dict):
        return _size(item[-1])  # (seq, blob); a MemoryStore revision (..., body)
    if isinstance(item, dict):
        return len(encode_body("snapshot", item))
    return len(encode(item, kind=kind))


def _memory_bytes(store: Any, run_id: str) -> dict[str, int] | None:
    """What a MemoryStore holds for a run, per part, in encoded bytes.

    The store may keep bytes (encoded on write) or the objects themselves; objects are sized as
    the codec would encode them, i.e. what a durable store would have to write.
    """
    run = getattr(store, "_runs", {}).get(run_id)
    if run is None:
        return None
    static = getattr(run, "static", None)
    journal = getattr(run, "journal", {})
    return {
        "static": _size(static) if static else 0,
        "revisions": sum(_size(r) for r in run.revisions),
        "entries": sum(_size(e) for e in run.entries),
        "inbox": sum(_size(m, "host_message") for m in getattr(run, "messages", [])),
        "journal": sum(_size(j) for j in journal.values()),
    }


def _sqlite_bytes(path: Path, run_ids: Sequence[str]) -> list[dict[str, int]] | None:
    """Blob bytes stored per run and table in a closed SqliteStore file."""
    try:
        conn = sqlite3.connect(path)
        try:
            out = []
            for run_id in run_ids:
                parts = {}
                for table, col in (
                    ("runs", "static"),
                    ("revisions", "snapshot"),
                    ("entries", "entry"),
                    ("inbox", "message"),
                    ("journal", "result"),
                ):
                    sql = f"SELECT sum(length({col})) FROM {table} WHERE run_id=?"
                    parts[table] = int(conn.execute(sql, (run_id,)).fetchone()[0] or 0)
                out.append(parts)
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return out


def _run(rt: Runtime, n: int) -> tuple[str, float]:
    t0 = time.perf_counter()
    out = rt.start("w4", agent=W4Agent(n), config=config_for(n)).result(timeout=120)
    us_iter = (time.perf_counter() - t0) / n * 1e6
    expect(out.state is RunState.FINISHED, f"W4: ended {out.state.value}: {out.errors}")
    expect(out.metrics.steps == n, f"W4: {out.metrics.steps} steps, not {n}")
    expect(out.metrics.checkpoints >= 2 * n, f"W4: only {out.metrics.checkpoints} checkpoints")
    return out.run_id, us_iter


def _measure(
    store: Any, quick: bool, reps: int
) -> tuple[dict[str, Any], list[str], list[int], dict[str, int]]:
    n = 100 if quick else 1000
    early: list[float] = []
    late: list[float] = []
    early_floor: list[float] = []
    late_floor: list[float] = []
    late_wall: list[float] = []
    flat: list[float] = []
    per_iter: list[float] = []
    per_ckpt: list[float] = []
    ratios: list[float] = []
    run_ids: list[str] = []
    sizes: list[int] = []
    breakdown: dict[str, int] = {}
    with Runtime(store=store, tools=[fetch200]) as rt:
        _run(rt, 50)  # warm-up
        for _ in range(reps):
            store.timing.calls.clear()
            run_id, us_iter = _run(rt, n)
            timing = store.timing
            per_iter.append(us_iter)
            per_ckpt.append(_median([c[1] for c in timing.calls]))
            early.append(_window(timing, *EARLY, col=1))
            early_floor.append(_window(timing, *EARLY, col=2))
            late.append(_window(timing, n - LATE_SPAN, n, col=1))
            late_floor.append(_window(timing, n - LATE_SPAN, n, col=2))
            late_wall.append(_window(timing, n - LATE_SPAN, n, col=3))
            flat.append(
                _lower_quartile(_calls(timing, n - LATE_SPAN, n, col=1))
                / _lower_quartile(_calls(timing, *EARLY, col=1))
            )
            store.flush()
            transcript = store.load(run_id).transcript
            expect(len(transcript) >= 2 * n, f"W4: {len(transcript)} entries loaded")
            size = sum(len(encode(e, kind="entry")) for e in transcript)
            run_ids.append(run_id)
            sizes.append(size)
            written = _memory_bytes(store, run_id)
            if written is not None:
                ratios.append(sum(written.values()) / size)
                breakdown = written
    metrics = {
        "ckpt_us_iter10": metric(early, "µs"),
        "ckpt_us_late": metric(late, "µs"),
        "ckpt_us_all": metric(per_ckpt, "µs"),
        "floor_packb_us_iter10": metric(early_floor, "µs"),
        "floor_packb_us_late": metric(late_floor, "µs"),
        "ckpt_wall_us_late": metric(late_wall, "µs"),
        "flatness": metric(flat, "x"),
        "us_per_iter": metric(per_iter, "µs/iter"),
    }
    if ratios:
        metrics["bytes_vs_transcript"] = metric(ratios, "x")
    metrics["transcript_bytes"] = metric(sizes, "B")
    return metrics, run_ids, sizes, breakdown


def case_memory(quick: bool) -> Result:
    """W4 with the in-memory store."""
    store = timed(MemoryStore)()
    metrics, _, sizes, breakdown = _measure(store, quick, 1 if quick else 3)
    info = {"bytes_by_part_last_run": breakdown, "transcript_bytes_last_run": sizes[-1]}
    return {"metrics": metrics, "config": "MemoryStore", "info": {**info, **cpu_note()}}


_LOAD_SNIPPET = """
import json, sys, time
t0 = time.perf_counter()
from steerable.actors import SqliteStore
t1 = time.perf_counter()
store = SqliteStore(sys.argv[1])
t2 = time.perf_counter()
stored = store.load(sys.argv[2])
t3 = time.perf_counter()
entries = list(stored.transcript)  # decoded as they are read (a lazy transcript)
t4 = time.perf_counter()
store.close()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "open_ms": (t2 - t1) * 1e3,
                  "load_ms": (t3 - t2) * 1e3, "read_all_ms": (t4 - t2) * 1e3,
                  "entries": len(entries)}))
"""


def case_sqlite(quick: bool) -> Result:
    """W4 with SqliteStore, plus the fresh-process load of the 1,000-iteration run."""
    if not sqlite_available():
        return not_available("steerable.actors.SqliteStore does not exist yet")
    cls: Any = timed(_sqlite_cls())
    with temp_dir() as d:
        path = d / "w4.db"
        store = cls(path)
        metrics, run_ids, sizes, _ = _measure(store, quick, 1 if quick else 3)
        # The Runtime is shut down: the store is closed, its writer flushed.
        files = sum(p.stat().st_size for p in d.iterdir())
        payload = _sqlite_bytes(path, run_ids)
        if payload is not None:
            ratios = [sum(p.values()) / s for p, s in zip(payload, sizes, strict=True)]
            metrics["bytes_vs_transcript"] = metric(ratios, "x")
        run_id = run_ids[-1]
        loads: list[float] = []
        read_all: list[float] = []
        opens: list[float] = []
        imports: list[float] = []
        entries = 0
        for _ in range(3 if quick else 7):
            proc = subprocess.run(
                [sys.executable, "-c", _LOAD_SNIPPET, str(path), run_id],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            loads.append(got["load_ms"])
            read_all.append(got["read_all_ms"])
            opens.append(got["open_ms"])
            imports.append(got["import_ms"])
            entries = got["entries"]
        expect(entries >= (200 if quick else 2000), f"W4: loaded {entries} entries")
    metrics["fresh_load_ms"] = metric(loads, "ms")
    metrics["fresh_load_read_all_ms"] = metric(read_all, "ms")
    metrics["fresh_open_ms"] = metric(opens, "ms")
    metrics["fresh_import_ms"] = metric(imports, "ms")
    return {
        "metrics": metrics,
        "config": "SqliteStore(tmp file)",
        "info": {
            "bytes_by_table_last_run": payload[-1] if payload else None,
            "transcript_bytes_last_run": sizes[-1],
            "db_file_bytes_all_runs": files,
        },
    }


def _sqlite_cls() -> type[CheckpointStore]:
    import steerable.actors

    cls: type[CheckpointStore] = steerable.actors.SqliteStore  # type: ignore[attr-defined,unused-ignore]
    return cls


def case_postgres(quick: bool) -> Result:
    """W4 with PostgresStore on the local server (the write off the supervisor's thread)."""
    dsn = postgres_dsn()
    if dsn is None:
        return not_available(NO_POSTGRES)
    from steerable.actors import PostgresStore

    schema = postgres_schema("w4")
    try:
        cls: Any = timed(PostgresStore)
        store = cls(dsn, schema=schema)
        metrics, _, _, _ = _measure(store, quick, 1 if quick else 3)
    finally:
        drop_postgres_schema(schema)
    return {"metrics": metrics, "config": "PostgresStore(local socket)", "info": cpu_note()}


CASES = {"memory": case_memory, "sqlite": case_sqlite, "postgres": case_postgres}
