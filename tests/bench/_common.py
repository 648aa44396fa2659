"""Shared helpers of the benchmark suite: results, statistics, process sampling, outcomes.

A case (one function of a workload module) returns a `Result`: named metrics, each a list of
samples with a unit and a direction, plus free-form `info`. A case that did not produce its
workload's outcome (a wrong final state, a missing call) raises `OutcomeError`; `--quick`
checks nothing else.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

__all__ = [
    "Metric",
    "OutcomeError",
    "ProcSampler",
    "Result",
    "expect",
    "metric",
    "percentile",
    "proc_status",
    "sqlite_available",
    "sqlite_store",
    "summarise",
    "temp_dir",
]


class Metric(TypedDict):
    """One figure of a case: its samples (one per repetition or per event)."""

    unit: str
    samples: list[float]
    better: str  # "lower" or "higher"


class Result(TypedDict, total=False):
    """What a case reports."""

    metrics: dict[str, Metric]
    info: dict[str, Any]
    config: str
    unavailable: str  # set (with a reason) when the case cannot run here, e.g. no SqliteStore


class OutcomeError(AssertionError):
    """A workload did not produce its expected outcome (state, call count, delivery)."""


def expect(condition: bool, message: str) -> None:
    """Raise `OutcomeError(message)` unless `condition` holds."""
    if not condition:
        raise OutcomeError(message)


def metric(samples: Sequence[float], unit: str, better: str = "lower") -> Metric:
    """A metric from samples."""
    return {"unit": unit, "samples": [float(s) for s in samples], "better": better}


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    data = sorted(samples)
    if not data:
        return float("nan")
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarise(samples: Sequence[float]) -> dict[str, float]:
    """median, min, max, p99 and the sample count."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "p99": percentile(samples, 99),
    }


def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM (kB) and Threads of this process, from /proc/self/status."""
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in {"VmRSS", "VmHWM", "Threads"}:
                out[key] = int(value.split()[0])
    return out


class ProcSampler:
    """Samples RSS and the OS thread count every `interval` seconds on its own thread.

    `peak_threads` excludes the sampler's own thread; `peak_rss_mb` is the process's VmHWM
    (its lifetime high-water mark, imports included, as the anchors measure it).
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self.peak_threads = 0
        self.peak_rss_kb = 0

    def _loop(self) -> None:
        while True:
            st = proc_status()
            self.peak_threads = max(self.peak_threads, st["Threads"] - 1)
            self.peak_rss_kb = max(self.peak_rss_kb, st["VmRSS"])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> ProcSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_rss_mb(self) -> float:
        """The process's RSS high-water mark in MB (VmHWM)."""
        return max(self.peak_rss_kb, proc_status()["VmHWM"]) / 1024.0


@contextmanager
def temp_dir() -> Iterator[Path]:
    """A temporary directory on the default temp file system, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="steerable-bench-") as d:
        yield Path(d)


def sqlite_available() -> bool:
    """Whether `steerable.actors` exports `SqliteStore` (it is being written)."""
    import steerable.actors

    return hasattr(steerable.actors, "SqliteStore")


def sqlite_store(path: Path) -> Any:
    """A `SqliteStore` at `path`; call only when `sqlite_available()`."""
    import steerable.actors

    return steerable.actors.SqliteStore(path)  # type: ignore[attr-defined,unused-ignore]


def postgres_dsn() -> str | None:
    """The test server's DSN (`STEERABLE_PG_DSN`, set by `.ci/run` and `just test-pg`), if any."""
    dsn = os.environ.get("STEERABLE_PG_DSN", "")
    if not dsn:
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None
    return dsn


def postgres_schema(name: str) -> str:
    """A fresh schema name for one bench case (dropped first if a killed run left it)."""
    import psycopg

    schema = f"bench_{name}_{os.getpid()}"
    with psycopg.connect(postgres_dsn() or "", autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
    return schema


def drop_postgres_schema(schema: str) -> None:
    """Drop a bench case's schema."""
    import psycopg

    with psycopg.connect(postgres_dsn() or "", autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())


NO_POSTGRES = "no PostgreSQL: STEERABLE_PG_DSN is not set (just test-pg, .ci/run start one)"


def not_available(what: str) -> Result:
    """The result of a case that cannot run in this checkout."""
    return {"unavailable": what}


def timed_ms(t0: float) -> float:
    """Milliseconds since `t0` (a `time.perf_counter()` reading)."""
    return (time.perf_counter() - t0) * 1e3


def cpu_note() -> dict[str, Any]:
    """Which CPUs this process may run on (to record that pinning took effect)."""
    return {"affinity": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}
