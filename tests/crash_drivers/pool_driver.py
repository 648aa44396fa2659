"""One worker process of the cross-process crash loop (tests/test_crash_processes.py).

Usage: pool_driver.py DB EFFECTS SENT SEED RUNS WRITES MESSAGES KILL [start]
(DB: a SQLite file, or `pg:SCHEMA`)

Several of these run at once on one database, as a web server's workers would: each is a
`Runtime(adopt_orphans=True)` that adopts the runs nobody holds (the one given `start` starts
RUNS runs first), and each steers every unfinished run from outside: it sends each run the
messages `<run_id>:m<i>` (i < MESSAGES) in order, with `rt.send(run_id, text,
message_id=text)`, only once the previous ones are stored (so a retried send is one message
wherever the run lives). After each `send` returns it appends `<run_id> <seq> <text>` to SENT.

Each run makes WRITES calls of the key-honouring `write` tool (plans of two), then asks the user
until it has MESSAGES messages, then finishes. `write` records `<key> <run> <n> <nonce> <pid>` in
EFFECTS the first time any process sees its key (an flock serialises the processes) and
answers `wrote <key> <nonce>`, else `dup <key> <nonce asked> <nonce recorded>`. Every tool
start appends `<pid> <run_id> <call_id> <key> <epoch> <time.monotonic()>` to EFFECTS + `.starts`
(the lease epoch the process holds the run at).

KILL is `none`, `tool:<k>:before`, `tool:<k>:after` (SIGKILL self in this process's k-th tool
call, before or after its effect) or `send:<k>` (right after the k-th send returned and was
logged); the parent also kills at random moments. The `start` worker starts its runs once the
file `go` exists in EFFECTS's folder (the parent's other workers are up by then). Every
`write` call first waits until the file `release` exists there (the parent creates it after
its first kill), so that kill always lands mid-run however fast the store is. Prints `done`
and exits once every run in the store is FINISHED.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.crash_drivers.stores import open_store
else:  # run as a script: its folder is on sys.path
    from stores import open_store

from steerable.actors import Runtime, ToolContext, tool
from steerable.protocol import (
    AskUser,
    ErrorCode,
    Finish,
    Plan,
    RunState,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
)

ARGS = sys.argv[1:]
DB, EFFECTS, SENT = ARGS[0], ARGS[1], ARGS[2]
SEED, RUNS, WRITES, MESSAGES = int(ARGS[3]), int(ARGS[4]), int(ARGS[5]), int(ARGS[6])
KILL = ARGS[7].split(":")
START = len(ARGS) > 8 and ARGS[8] == "start"
TTL = 1.0
GO = os.path.join(os.path.dirname(os.path.abspath(EFFECTS)), "go")
RELEASE = os.path.join(os.path.dirname(os.path.abspath(EFFECTS)), "release")
rng = random.Random(SEED)
_pause = threading.Event()  # never set: waits are plain timeouts
_lock = threading.Lock()
_counts = {"tool": 0, "send": 0}
RT: list[Runtime] = []  # the runtime, for the tool's journal line (the epoch it holds)


def kill_point(kind: str, when: str = "") -> None:
    """SIGKILL this process if KILL names this moment (call with _lock held)."""
    if KILL[0] == kind and int(KILL[1]) == _counts[kind] and (kind != "tool" or KILL[2] == when):
        os.kill(os.getpid(), signal.SIGKILL)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool(side_effect="write", honors_idempotency_key=True)
def write(run: str, n: int, nonce: str, ctx: ToolContext) -> str:
    """A key-honouring write: its effect happens at most once per key, across processes."""
    key = ctx.idempotency_key
    entry = RT[0].directory.get(ctx.run_id) if RT else None
    epoch = entry.cell.epoch if entry is not None else -1
    _append(
        EFFECTS + ".starts",
        f"{os.getpid()} {ctx.run_id} {ctx.call_id} {key} {epoch} {time.monotonic()}\n",
    )
    # Held until the parent's first kill: without it a fast store can finish every run before
    # the first kill timer fires (an iteration of no kills proves nothing).
    while not os.path.exists(RELEASE) and not ctx.cancelled:
        _pause.wait(0.01)
    if rng.random() < 0.5:
        _pause.wait(rng.random() * 0.05)
    with _lock:
        _counts["tool"] += 1
        kill_point("tool", "before")
        fd = os.open(EFFECTS, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with open(EFFECTS, encoding="utf-8") as f:
                recorded = {line.split()[0]: line.split()[3] for line in f if line.endswith("\n")}
            if key in recorded:
                answer = f"dup {key} {nonce} {recorded[key]}"
            else:
                os.write(fd, f"{key} {run} {n} {nonce} {os.getpid()}\n".encode())
                os.fsync(fd)
                answer = f"wrote {key} {nonce}"
        finally:
            os.close(fd)
        kill_point("tool", "after")
    _pause.wait(rng.random() * 0.05)
    return answer


class CrashAgent:
    """Writes, then waits for its messages, then finishes. Deterministic but for the nonces."""

    name = "crash-agent"

    def decide(self, view: RunView) -> Any:
        writes = sum(1 for e in view.transcript if isinstance(e, ToolResult))
        messages = sum(1 for e in view.transcript if isinstance(e, UserMessage))
        if writes < WRITES:
            nonce = os.urandom(6).hex()
            steps = [
                ToolCall(name="write", arguments={"run": view.run_id, "n": n, "nonce": nonce})
                for n in range(writes, min(writes + 2, WRITES))
            ]
            return Plan(steps=steps)
        if messages < MESSAGES:
            return AskUser(question="more?")
        return Finish(output={"writes": writes, "messages": messages})


def accepted(store: Any, run_id: str) -> set[str]:
    """Texts of the messages the store holds for a run (delivered, pending or in the inbox)."""
    stored = store.load(run_id)
    texts = {m.content for m in stored.transcript if isinstance(m, UserMessage)}
    texts |= {m.content for m in stored.snapshot.pending_messages if isinstance(m, UserMessage)}
    texts |= {m.content for m in stored.messages if isinstance(m, UserMessage)}
    return texts


def steer(rt: Runtime, store: Any) -> bool:
    """One pass: send each unfinished run its next message. True once every run finished."""
    runs = store.runs()
    if len(runs) < RUNS:
        return False
    unfinished = [r.run_id for r in runs if r.state is not RunState.FINISHED]
    rng.shuffle(unfinished)
    for run_id in unfinished:
        have = accepted(store, run_id)
        missing = [f"{run_id}:m{k}" for k in range(MESSAGES) if f"{run_id}:m{k}" not in have]
        if not missing:
            continue
        text = missing[0]
        try:
            seq = rt.send(run_id, text, message_id=text, timeout=3.0)
        except TimeoutError:
            continue  # stored: its owner (or the next) takes it; resent with its id later
        except SteerableError as exc:
            if exc.code in {ErrorCode.RUN_ENDED, ErrorCode.NOT_FOUND}:
                continue
            raise
        with _lock:
            _append(SENT, f"{run_id} {seq} {text}\n")
            _counts["send"] += 1
            kill_point("send")
    return not unfinished


def main() -> None:
    store = open_store(DB)
    rt = Runtime(
        store=store,
        tools=[write],
        agents={"crash-agent": CrashAgent()},
        adopt_orphans=True,
        lease_ttl=TTL,
    )
    RT.append(rt)
    if START:  # every run is stored before the parent's kill timer starts
        while not os.path.exists(GO):  # the parent's other workers are up
            _pause.wait(0.01)
        handles = [rt.start(f"crash run {i}", agent=CrashAgent()) for i in range(RUNS)]
        for handle in handles:
            handle._cell.stored.wait(60.0)
        store.flush()
    fd = os.environ.get("STEERABLE_READY_FD")
    if fd is not None:
        os.write(int(fd), b"r")
        os.close(int(fd))
    while not steer(rt, store):
        _pause.wait(0.02 + rng.random() * 0.05)
    rt.shutdown(timeout=10.0)
    print("done", flush=True)


if __name__ == "__main__":
    main()
