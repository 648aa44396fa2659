"""One process of the crash loop (tests/test_crash.py): drive runs on a store until done,
unless killed first.

Usage: crash_driver.py DB EFFECTS SENT MODE SEED RUNS WRITES MESSAGES KILL
(DB: a SQLite file, or `pg:SCHEMA`)

- MODE `start` starts RUNS runs; MODE `resume` resumes every run `rt.unfinished()` lists.
- Each run makes WRITES calls of the key-honouring write tool `write` (plans of two parallel
  calls), then asks the user until it has MESSAGES messages, then finishes.
- The driver sends each run the messages `<run_id>:m<i>` (i < MESSAGES) it has not accepted yet
  (read from the store before resuming: transcript, inbox and pending messages), interleaved
  across runs in random order, never re-sending an accepted one. After each `send()` returns it
  appends `<run_id> <seq> <text>` to SENT (fsync). In `start` mode it sends to a run only once
  the run's first checkpoint was handed to the store: a message sent before that is covered
  by tests/test_resume.py.
- `write(run, n, nonce, ctx)` records `<key> <run> <n> <nonce>` in EFFECTS (fsync) the first
  time it sees `ctx.idempotency_key` and answers `wrote <key> <nonce>`; for a key already
  recorded it does nothing and answers `dup <key> <nonce asked> <nonce recorded>`. The agent
  draws a fresh random nonce for every plan, so a key reused for a different write shows.
- KILL is `none`, `tool:<k>:before`, `tool:<k>:after` (SIGKILL self in the k-th tool call,
  before or after recording its effect), `send:<k>` (right after the k-th send returned and
  was logged) or `checkpoint:<k>` (inside the k-th checkpoint's transaction, before COMMIT; on
PostgreSQL just before the batch holding it is sent, so the server never sees its COMMIT).
  The parent may also kill the process at a random moment.

Prints `done` when every run it drove ended.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.crash_drivers.stores import open_store
else:  # run as a script: its folder is on sys.path
    from stores import open_store

from steerable.actors import RunHandle, Runtime, SqliteStore, ToolContext, tool
from steerable.actors.testing import wait_event
from steerable.protocol import (
    AskUser,
    EventKind,
    Finish,
    Plan,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
)

ARGS = sys.argv[1:]
DB, EFFECTS, SENT, MODE = ARGS[0], ARGS[1], ARGS[2], ARGS[3]
SEED, RUNS, WRITES, MESSAGES = int(ARGS[4]), int(ARGS[5]), int(ARGS[6]), int(ARGS[7])
KILL = ARGS[8].split(":")
rng = random.Random(SEED)
_pause = threading.Event()  # never set: waits are plain timeouts
_lock = threading.Lock()
_counts = {"tool": 0, "send": 0, "checkpoint": 0}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_point(kind: str, when: str = "") -> None:
    """SIGKILL this process if KILL names this moment (call with _lock held)."""
    if KILL[0] != kind or int(KILL[1]) != _counts[kind]:
        return
    if kind != "tool" or KILL[2] == when:
        die()


def _load_effects() -> dict[str, str]:
    recorded: dict[str, str] = {}
    if os.path.exists(EFFECTS):
        with open(EFFECTS, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    key, _, _, nonce = line.split()
                    recorded[key] = nonce
    return recorded


_effects = _load_effects()
_effects_fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_sent_fd = os.open(SENT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _append(fd: int, line: str) -> None:
    os.write(fd, line.encode())
    os.fsync(fd)


@tool(side_effect="write", honors_idempotency_key=True)
def write(run: str, n: int, nonce: str, ctx: ToolContext) -> str:
    """A key-honouring write: its effect happens at most once per idempotency key."""
    if rng.random() < 0.5:  # half the calls act at once, racing the store's writer thread
        _pause.wait(rng.random() * 0.01)
    key = ctx.idempotency_key
    with _lock:
        _counts["tool"] += 1
        kill_point("tool", "before")
        recorded = _effects.get(key)
        if recorded is None:
            _append(_effects_fd, f"{key} {run} {n} {nonce}\n")
            _effects[key] = nonce
            answer = f"wrote {key} {nonce}"
        else:
            answer = f"dup {key} {nonce} {recorded}"
        kill_point("tool", "after")
    _pause.wait(rng.random() * 0.01)
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


def patch_checkpoints() -> None:
    """Kill inside the k-th checkpoint's transaction (after its rows, before COMMIT)."""
    if DB.startswith("pg:"):
        from steerable.actors import PostgresStore

        commit = PostgresStore._commit

        def send(self: PostgresStore, batch: list[Any]) -> None:
            with _lock:
                for op, _, _ in batch:
                    if op[0] == "checkpoint":
                        _counts["checkpoint"] += 1
                        kill_point("checkpoint")
            commit(self, batch)

        PostgresStore._commit = send  # type: ignore[method-assign]
        return
    original = SqliteStore._apply_checkpoint

    def apply(self: SqliteStore, conn: Any, *args: Any, **kwargs: Any) -> Any:
        refused = original(self, conn, *args, **kwargs)  # a refusal (stale) passes through
        with _lock:
            _counts["checkpoint"] += 1
            kill_point("checkpoint")
        return refused

    SqliteStore._apply_checkpoint = apply  # type: ignore[method-assign,assignment]


def accepted(store: Any, run_id: str) -> set[str]:
    """Texts of the messages the store holds for a run (delivered, pending or in the inbox)."""
    stored = store.load(run_id)
    texts = {m.content for m in stored.transcript if isinstance(m, UserMessage)}
    texts |= {m.content for m in stored.snapshot.pending_messages if isinstance(m, UserMessage)}
    texts |= {m.content for m in stored.messages if isinstance(m, UserMessage)}
    return texts


def signal_ready() -> None:
    """Tell the test the driver is up: its kill timer counts from here, not from the spawn
    (on a loaded machine the interpreter's start-up alone can outlast the timer)."""
    fd = os.environ.get("STEERABLE_READY_FD")
    if fd is not None:
        os.write(int(fd), b"r")
        os.close(int(fd))


def main() -> None:
    if KILL[0] == "checkpoint":
        patch_checkpoints()
    store = open_store(DB)
    rt = Runtime(store=store, tools=[write])
    signal_ready()
    handles: list[RunHandle] = []
    todo: dict[str, list[str]] = {}
    if MODE == "start":
        for i in range(RUNS):
            handle = rt.start(f"crash run {i}", agent=CrashAgent())
            handles.append(handle)
            todo[handle.run_id] = [f"{handle.run_id}:m{k}" for k in range(MESSAGES)]
        for handle in handles:
            wait_event(handle, EventKind.CHECKPOINT, timeout=30.0)
    else:
        for run_id in rt.unfinished():
            have = accepted(store, run_id)
            todo[run_id] = [
                f"{run_id}:m{k}" for k in range(MESSAGES) if f"{run_id}:m{k}" not in have
            ]
            handles.append(rt.resume(run_id, agent=CrashAgent()))
    by_id = {h.run_id: h for h in handles}
    # A random interleaving across runs; each run's messages stay in order.
    order = [run_id for run_id, texts in todo.items() for _ in texts]
    rng.shuffle(order)
    for run_id in order:
        text = todo[run_id].pop(0)
        _pause.wait(rng.random() * 0.02)
        try:
            seq = by_id[run_id].send(text)
        except SteerableError as exc:
            print(f"send-failed {run_id} {text} {exc}", flush=True)
            continue
        with _lock:
            _append(_sent_fd, f"{run_id} {seq} {text}\n")
            _counts["send"] += 1
            kill_point("send")
    for handle in handles:
        outcome = handle.result(timeout=60.0)
        print(f"ended {handle.run_id} {outcome.state.value}", flush=True)
    rt.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main()
