"""W11, takeover: SIGKILL a run's owner -> the run's next checkpoint by the adopting process.

    python -m tests.bench.w11_takeover [--kills N] [--runs N] [--ttl SECONDS]

Two adopting processes (`--adopter`), each a `Runtime(adopt_orphans=True, lease_ttl=TTL)` on one
SQLite file, print `checkpoint <run_id> <time.monotonic()>` when a run they adopted checkpoints.
For each kill, a new process (`--owner`) starts 10 runs whose first tool blocks, prints their ids
once their first checkpoints are stored, and is SIGKILLed by the parent, which notes
`time.monotonic()` just before (the monotonic clock is the machine's, shared by the processes);
every run must be adopted by exactly one adopter. On one machine a killed
owner's pid is gone, so its lease is not waited out: the adopter takes the run at its next pass
(every `lease_ttl / 3`). The figure is reported against the TTL; the floor is that pass
interval. Target (docs/benchmarks.md): within `lease_ttl + 1 s`, every run adopted once;
typically within one pass.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from steerable.actors import Runtime, SqliteStore, ToolContext, tool
from steerable.protocol import EventKind, Finish, Plan, RunEvent, RunView, ToolCall

from ._common import Result, expect, metric, temp_dir

TTL = 1.0
ROOT = Path(__file__).resolve().parents[2]


@tool(side_effect="none")
def block(ctx: ToolContext) -> str:
    """Blocks in the owner (which is killed in it); returns at once in the adopter."""
    if os.environ.get("W11_ROLE") == "owner":
        ctx.wait(600.0)
    return "ok"


class Blocker:
    """Calls `block` once, then finishes."""

    name = "w11"

    def decide(self, view: RunView) -> Any:
        if view.steps == 0:
            return Plan(steps=(ToolCall(name="block"),))
        return Finish(output="done")


def owner(db: str, ttl: float, runs: int) -> None:
    os.environ["W11_ROLE"] = "owner"
    rt = Runtime(store=SqliteStore(db), tools=[block], lease_ttl=ttl)
    handles = [rt.start("w11", agent=Blocker()) for _ in range(runs)]
    for handle in handles:
        handle._cell.stored.wait(30.0)
    rt.store.flush()
    print("runs", *[h.run_id for h in handles], flush=True)
    threading.Event().wait(600.0)  # killed here


def adopter(db: str, ttl: float) -> None:
    os.environ["W11_ROLE"] = "adopter"
    with Runtime(
        store=SqliteStore(db),
        tools=[block],
        agents={"w11": Blocker()},
        adopt_orphans=True,
        lease_ttl=ttl,
    ) as rt:
        first: set[str] = set()

        def on_event(event: RunEvent) -> None:
            if event.kind is EventKind.CHECKPOINT and event.run_id not in first:
                first.add(event.run_id)
                print("checkpoint", event.run_id, time.monotonic(), flush=True)

        rt.subscribe(on_event)
        print("up", flush=True)
        sys.stdin.read()  # until the parent closes it


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bench.w11_takeover", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def measure(kills: int, runs: int, ttl: float) -> list[float]:
    """Seconds from SIGKILL of an owner of `runs` runs to each run's first checkpoint by one
    of two adopting processes; every run must be adopted exactly once."""
    out: list[float] = []
    with temp_dir() as work:
        db = str(work / "w11.db")
        SqliteStore(db).close()  # the schema exists before several processes open the file
        adopters = [_child("--adopter", db, str(ttl)) for _ in range(2)]
        lines: queue.Queue[tuple[str, float]] = queue.Queue()

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                words = line.split()
                if words and words[0] == "checkpoint":
                    lines.put((words[1], float(words[2])))

        readers = []
        try:
            for proc in adopters:
                assert proc.stdout is not None
                expect(proc.stdout.readline().split() == ["up"], "W11: an adopter did not start")
                readers.append(threading.Thread(target=pump, args=(proc,), daemon=True))
                readers[-1].start()
            adopted: dict[str, int] = {}
            for _ in range(kills):
                own = _child("--owner", db, str(ttl), str(runs))
                assert own.stdout is not None
                words = own.stdout.readline().split()
                expect(len(words) == runs + 1 and words[0] == "runs", f"W11: owner said {words}")
                killed = time.monotonic()
                own.send_signal(signal.SIGKILL)
                own.wait(30)
                own.stdout.close()
                if own.stdin is not None:
                    own.stdin.close()
                for _ in range(runs):
                    run_id, at = lines.get(timeout=60.0)
                    expect(run_id in words[1:], f"W11: {run_id} was not this owner's")
                    adopted[run_id] = adopted.get(run_id, 0) + 1
                    out.append(at - killed)
            expect(all(n == 1 for n in adopted.values()), f"W11: adopted twice: {adopted}")
        finally:
            for proc in adopters:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(30)
            for reader in readers:
                reader.join(30)
            for proc in adopters:
                if proc.stdout is not None:
                    proc.stdout.close()
    return out


def case_steerable(quick: bool) -> Result:
    """W11 with `lease_ttl=1`: owners of 10 runs SIGKILLed, two adopters."""
    kills, runs = (2, 3) if quick else (50, 10)
    samples = measure(kills, runs, TTL)
    bound = TTL + 1.0
    expect(quick or max(samples) <= bound, f"W11: a takeover took {max(samples):.3f}s")
    return {
        "metrics": {
            "takeover_ms": metric([s * 1e3 for s in samples], "ms"),
            "takeover_per_ttl": metric([s / TTL for s in samples], "x TTL"),
            "floor_pass_ms": metric([TTL / 3 * 1e3], "ms"),
        },
        "config": f"SqliteStore, lease_ttl={TTL}, 2 adopters, {kills} kills x {runs} runs",
    }


CASES = {"steerable": case_steerable}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=TTL)
    args = parser.parse_args()
    samples = sorted(measure(args.kills, args.runs, args.ttl))
    p50 = samples[len(samples) // 2]
    print(
        f"W11 SIGKILL -> adopter's checkpoint: p50 {p50 * 1e3:.0f} ms, max "
        f"{samples[-1] * 1e3:.0f} ms (lease_ttl {args.ttl}s, pass {args.ttl / 3 * 1e3:.0f} ms)"
    )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--owner":
        owner(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--adopter":
        adopter(sys.argv[2], float(sys.argv[3]))
    else:
        main()
