"""What each part of a W1 iteration costs, in instructions (docs/performance.md, "Wave 4:
session 18"): the same count whatever else the machine does, unlike its time.

python -m tests.bench.profile_parts [PART ...] [--runs 3] [--iters 200]
    Counts instructions with `valgrind --tool=callgrind` (about 40 s per figure) for a process
    that starts one `Runtime(tools=[noop])`, runs a 20-iteration warm-up and `--runs` W1 runs
    of `--iters` iterations, minus the same process without the measured runs; prints
    instructions per iteration with nothing stubbed and with each PART stubbed out (the
    difference is that part and everything it causes later). Without PART: every part below.
python -m tests.bench.profile_parts --functions N [--runs 3] [--iters 200]
    The N C functions (the interpreter's, msgpack's, sqlite's...) that spend the most
    instructions per iteration, by callgrind_annotate, runs minus warm-up: where a cost hides
    that no Python profiler shows (docs/performance.md, "Wave 4: session 19").
python -m tests.bench.profile_parts --run PART RUNS ITERS
    The measured process itself (what valgrind runs).

The stubs monkeypatch private names of this version; a part whose names moved fails loudly.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .w1_loop import noop, run_once, thin_events

Stub = Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)  # AttributeError: the stubbed name moved
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _none() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _no_collector() -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def off() -> Iterator[None]:
        gc.disable()
        try:
            yield
        finally:
            gc.enable()

    return off()


def _no_preview() -> contextlib.AbstractContextManager[None]:
    from steerable.actors._machine import machine

    return _patched(machine, "decision_preview", lambda *args: {})


@contextlib.contextmanager
def _no_tool_payloads() -> Iterator[None]:
    from steerable.actors._machine import events

    with (
        _patched(events, "tool_started", lambda *args: {}),
        _patched(events, "tool_finished", lambda *args: {}),
    ):
        yield


def _no_store_write() -> contextlib.AbstractContextManager[None]:
    from steerable.actors import MemoryStore

    def write(self: Any, *args: Any, on_failed: Any = None) -> None:
        on_stored = args[5] if len(args) > 5 else None
        if on_stored is not None:
            on_stored()

    return _patched(MemoryStore, "write_checkpoint", write)


def _no_journal() -> contextlib.AbstractContextManager[None]:
    from steerable.actors import MemoryStore

    return _patched(MemoryStore, "journal", lambda self, *args, **kwargs: None)


def _no_lease_check() -> contextlib.AbstractContextManager[None]:
    from steerable.actors._stores.lease import LeaseTable

    return _patched(LeaseTable, "check", lambda self, *args: True)


def _no_event_append() -> contextlib.AbstractContextManager[None]:
    from steerable.actors._host.events import EventLog

    return _patched(EventLog, "append_step", lambda self, *args: None)


def _no_event_handover() -> contextlib.AbstractContextManager[None]:
    from steerable.actors._host.events import EventLog

    return _patched(EventLog, "store_pending", lambda self, **kwargs: None)


def _no_snapshot_write() -> contextlib.AbstractContextManager[None]:
    # The machine builds its snapshot; the supervisor neither writes it nor emits `checkpoint`.
    from steerable.actors._host.supervisor_ending import SupervisorEnding

    def checkpoint(self: Any, revision: int, *args: Any) -> None:
        self.cell.revision = revision
        self._stored = revision

    return _patched(SupervisorEnding, "checkpoint", checkpoint)


def _no_checkpoint() -> contextlib.AbstractContextManager[None]:
    # No snapshot, no write, no `checkpoint` event: only the revision counts on.
    from steerable.actors._machine.persist import Persistence

    def checkpoint(self: Any) -> None:
        self.revision += 1
        self._checkpointed_len = len(self._machine.transcript)

    return _patched(Persistence, "checkpoint", checkpoint)


PARTS: dict[str, tuple[str, Stub]] = {
    "none": ("nothing stubbed", _none),
    "thin": ("the rich event payloads (the bench's thin_events)", thin_events),
    "preview": ("reasoning_finished's decision preview", _no_preview),
    "tool-payloads": ("tool_started and tool_finished's payloads", _no_tool_payloads),
    "gc": ("the cyclic collector (disabled)", _no_collector),
    "store-write": ("MemoryStore.write_checkpoint", _no_store_write),
    "journal": ("MemoryStore.journal", _no_journal),
    "lease": ("the store's lease checks", _no_lease_check),
    "append": ("EventLog.append_step (no event appended, none stored)", _no_event_append),
    "handover": ("the run's events handed to its store (store_pending)", _no_event_handover),
    "write-side": ("the supervisor's side of a checkpoint (snapshot built)", _no_snapshot_write),
    "checkpoint": ("the whole checkpoint (no snapshot, no write, no event)", _no_checkpoint),
}


def _measured(part: str, runs: int, iters: int) -> None:
    """The process valgrind counts: warm-up, then `runs` W1 runs under the part's stub."""
    from steerable.actors import Runtime

    with PARTS[part][1](), Runtime(tools=[noop]) as rt:
        run_once(rt, 20)
        for _ in range(runs):
            run_once(rt, iters)


def _instructions(part: str, runs: int, iters: int, out: Path) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "tests.bench.profile_parts",
        "--run",
        part,
        str(runs),
        str(iters),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count for {part}: {done.stderr[-500:]}")
    return int(found.group(1))


def _by_function(out: Path) -> dict[str, int]:
    """Instructions per C function of one callgrind output (callgrind_annotate's table)."""
    done = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found: dict[str, int] = {}
    for line in done.stdout.splitlines():
        match = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[.*\])?$", line)
        if match is None or match.group(2) == "PROGRAM TOTALS":
            continue
        name = match.group(2).rsplit(":", 1)[-1]
        found[name] = found.get(name, 0) + int(match.group(1).replace(",", ""))
    return found


def functions(top: int, runs: int, iters: int) -> list[tuple[float, str]]:
    """The `top` C functions by instructions per W1 iteration (nothing stubbed)."""
    with tempfile.TemporaryDirectory() as tmp:
        _instructions("none", 0, iters, Path(tmp) / "base.out")
        _instructions("none", runs, iters, Path(tmp) / "runs.out")
        base = _by_function(Path(tmp) / "base.out")
        total = _by_function(Path(tmp) / "runs.out")
    rows = [((n - base.get(name, 0)) / (runs * iters), name) for name, n in total.items()]
    rows.sort(reverse=True)
    return rows[:top]


def per_iteration(part: str, runs: int, iters: int) -> float:
    """Instructions per W1 iteration with `part` stubbed (the warm-up-only process taken off)."""
    with tempfile.TemporaryDirectory() as tmp:
        base = _instructions(part, 0, iters, Path(tmp) / "base.out")
        total = _instructions(part, runs, iters, Path(tmp) / "runs.out")
    return (total - base) / (runs * iters)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.profile_parts", description=__doc__
    )
    parser.add_argument("parts", nargs="*", help=f"of: {', '.join(PARTS)}")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--functions", type=int, metavar="N", help="the top N C functions")
    parser.add_argument("--run", nargs=3, metavar=("PART", "RUNS", "ITERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        part, runs, iters = args.run
        _measured(part, int(runs), int(iters))
        return 0
    if args.functions:
        print(f"{'instr/iter':>11}  C function")
        for count, name in functions(args.functions, args.runs, args.iters):
            print(f"{count:>11,.0f}  {name}")
        return 0
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
    parts = ["none", *[p for p in (args.parts or PARTS) if p != "none"]]
    base = per_iteration("none", args.runs, args.iters)
    print(f"{'part stubbed':<58} {'instr/iter':>11} {'difference':>11}")
    print(f"{PARTS['none'][0]:<58} {base / 1000:>10.1f}k")
    for part in parts[1:]:
        count = per_iteration(part, args.runs, args.iters)
        diff = count - base
        print(f"{PARTS[part][0]:<58} {count / 1000:>10.1f}k {diff / 1000:>+10.1f}k")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
