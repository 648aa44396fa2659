"""One process of the ownership harness (tests/test_ownership_processes.py) on a shared store.

Usage: owner_driver.py DB JOURNAL TTL ROLE [N]  (DB: a SQLite file, or `pg:SCHEMA`)

ROLE is one of:
- `start N`: start N runs, each blocked in its first `hold` call; print `run <id>` for each
  once its first checkpoint is stored, then `ready`.
- `resume`: print `up`, wait for a `go` line on stdin, then resume every run `unfinished()`
  lists, printing `resumed <id>` or `owned <id>` (refused with run_owned) for each.
- `adopt`: a runtime with `adopt_orphans=True`; prints `adopted <id> <monotonic>` as runs are
  adopted.

Every role then prints `ended <id> <state>` as its runs end, `lost <id>` for a run fenced out
(`result()` raised run_owned), and `done` when every run it drove has ended or been lost; it
then waits for stdin to close (the parent decides when it exits; SIGKILL, SIGSTOP and SIGCONT
come from the parent too).

The agent of every run plans `hold(step)` then `write(step)` for two steps, then finishes.
`hold` blocks in the process started with `start` until a `release` line arrives on stdin
(so the parent freezes or kills it with calls in flight); elsewhere it returns at once. Every
tool call appends `<pid> <run_id> <tool> <call_id> <key> <time.monotonic()>` to JOURNAL as it
starts (O_APPEND, one write, fsync), and `write` records its idempotency key in JOURNAL's
`.effects` file the first time it sees it (at most once per key across processes).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.crash_drivers.stores import open_store
else:  # run as a script: its folder is on sys.path
    from stores import open_store

from steerable.actors import RunHandle, Runtime, ToolContext, tool
from steerable.protocol import ErrorCode, Finish, Plan, RunView, SteerableError, ToolCall

ARGS = sys.argv[1:]
DB, JOURNAL, TTL, ROLE = ARGS[0], ARGS[1], float(ARGS[2]), ARGS[3]
COUNT = int(ARGS[4]) if len(ARGS) > 4 else 0
_out_lock = threading.Lock()
_released = threading.Event()


def say(*words: object) -> None:
    with _out_lock:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def journal(tool_name: str, ctx: ToolContext) -> None:
    line = (
        f"{os.getpid()} {ctx.run_id} {tool_name} {ctx.call_id} {ctx.idempotency_key} "
        f"{time.monotonic()}\n"
    )
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool(side_effect="none")
def hold(step: int, ctx: ToolContext) -> str:
    """Blocks in the starting process until released; returns at once elsewhere."""
    journal("hold", ctx)
    if ROLE == "start":
        while not _released.is_set() and not ctx.cancelled:
            _released.wait(0.05)
    return f"held {step}"


@tool(side_effect="write", honors_idempotency_key=True)
def write(step: int, ctx: ToolContext) -> str:
    """Records its key once (a lock file serialises processes)."""
    journal("write", ctx)
    effects = JOURNAL + ".effects"
    fd = os.open(effects, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(effects, encoding="utf-8") as f:
            seen = {line.split()[0] for line in f if line.strip()}
        if ctx.idempotency_key in seen:
            return f"dup {ctx.idempotency_key}"
        os.write(fd, f"{ctx.idempotency_key} {os.getpid()} {ctx.run_id}\n".encode())
        os.fsync(fd)
        return f"wrote {ctx.idempotency_key}"
    finally:
        os.close(fd)


class Worker:
    """hold(n), write(n) for n in 0, 1; then finish. Stateless: decides from the view."""

    name = "worker"

    def decide(self, view: RunView) -> Any:
        steps = view.steps
        if steps >= 4:
            return Finish(output="done")
        step = steps // 2
        name = "hold" if steps % 2 == 0 else "write"
        return Plan(steps=[ToolCall(name=name, arguments={"step": step})])


def follow(rt: Runtime, run_id: str, pending: set[str], all_done: threading.Event) -> None:
    """Report the run's end (`rt.outcome` serves a run that lives here or already ended)."""

    def wait() -> None:
        try:
            outcome = rt.outcome(run_id, 600.0)
            say("ended", run_id, outcome.state.value)
        except SteerableError as exc:
            if exc.code is ErrorCode.RUN_OWNED:
                say("lost", run_id)
            else:
                say("failed", run_id, exc.code.value)
        with _out_lock:
            pending.discard(run_id)
            if not pending:
                all_done.set()

    threading.Thread(target=wait, daemon=True).start()


def watch_adoptions(rt: Runtime, pending: set[str], all_done: threading.Event) -> None:
    """Report each run the runtime adopts (from its `run_adopted` log record)."""

    class Adopted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "run_adopted" in message:
                run_id = message.split("run_id=")[1].split()[0].strip("'\"")
                say("adopted", run_id, time.monotonic())
                with _out_lock:
                    pending.add(run_id)
                follow(rt, run_id, pending, all_done)

    logger = logging.getLogger("steerable")
    logger.setLevel(logging.INFO)
    logger.addHandler(Adopted())


def main() -> None:
    store = open_store(DB)
    pending: set[str] = set()
    all_done = threading.Event()
    rt = Runtime(
        store=store,
        tools=[hold, write],
        agents={"worker": Worker()},
        adopt_orphans=ROLE == "adopt",
        lease_ttl=TTL,
    )
    handles: list[RunHandle] = []
    if ROLE == "start":
        for _ in range(COUNT):
            handles.append(rt.start("own", agent=Worker()))
        store.flush()
        for h in handles:
            h._cell.stored.wait(60.0)  # first checkpoint stored: the run is in the store
            say("run", h.run_id)
        say("ready")
    elif ROLE == "resume":
        say("up")
        assert sys.stdin.readline().strip() == "go"
        for run_id in rt.unfinished():
            try:
                handles.append(rt.resume(run_id, agent=Worker()))
                say("resumed", run_id)
            except SteerableError as exc:
                if exc.code is not ErrorCode.RUN_OWNED:
                    raise
                say("owned", run_id)
    else:
        watch_adoptions(rt, pending, all_done)
        say("up")
    with _out_lock:
        pending.update(h.run_id for h in handles)
    for h in handles:
        follow(rt, h.run_id, pending, all_done)
    if not handles and ROLE == "resume":
        all_done.set()

    def done_when_all() -> None:
        all_done.wait()
        say("done")

    if ROLE != "adopt":
        threading.Thread(target=done_when_all, daemon=True).start()
    for line in sys.stdin:
        if line.strip() == "release":
            _released.set()
    rt.shutdown(timeout=5.0, cancel_runs=False)


if __name__ == "__main__":
    main()
