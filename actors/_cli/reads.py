"""The read commands: `runs`, `show`, `revisions`, `replay`, `approvals` (text or `--json`).

They read the store only; none of them creates a database, starts a run or takes a lease.

Timestamps: a checkpoint records when it was written (`updated_at`) and a user message when
it was accepted (`at`); other transcript entries carry no time of their own. Each entry is
therefore dated by its message time, else by the first checkpoint of the run that holds it (it
happened at or before that moment, after the previous checkpoint): `entry_times`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .common import OK, db_argument, emit_json, guarded, json_argument, open_store, short, stamp

if TYPE_CHECKING:
    from steerable.actors._stores.replay import Replay
    from steerable.actors._stores.store import CheckpointStore, RevisionInfo
    from steerable.protocol import ApprovalRequest, RunSnapshot, StoredRun, TranscriptEntry

__all__ = [
    "cmd_approvals",
    "cmd_replay",
    "cmd_revisions",
    "cmd_runs",
    "cmd_show",
    "entry_times",
    "list_arguments",
    "revision_arguments",
    "run_arguments",
    "timed_replay",
]


def list_arguments(parser: argparse.ArgumentParser) -> None:
    """`--db`, `--json`."""
    db_argument(parser)
    json_argument(parser)


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """`--db`, `--json`, `RUN`."""
    list_arguments(parser)
    parser.add_argument("run_id", help="the run")


def revision_arguments(parser: argparse.ArgumentParser) -> None:
    """`--db`, `--json`, `RUN`, `--revision N`."""
    run_arguments(parser)
    parser.add_argument(
        "--revision", type=int, default=None, help="the revision (default: the latest)"
    )


# ---------------------------------------------------------------------------------- timestamps


def entry_times(
    transcript: Sequence[TranscriptEntry], revisions: Sequence[RevisionInfo], fallback: float
) -> list[float]:
    """When each transcript entry happened, as well as the store can say (module docstring).

    Args:
        transcript: The entries, in order.
        revisions: The run's revisions, oldest first (those after the replayed one ignored).
        fallback: The time of an entry no listed revision holds (the loaded checkpoint's).
    """
    from steerable.protocol import UserMessage

    times: list[float] = []
    index = 0
    for position, entry in enumerate(transcript):
        while index < len(revisions) and revisions[index].transcript_len <= position:
            index += 1
        at = revisions[index].updated_at if index < len(revisions) else fallback
        if isinstance(entry, UserMessage) and entry.at > 0:
            at = entry.at
        times.append(at)
    return times


def _times_of(store: CheckpointStore, stored: StoredRun) -> list[float]:
    snap = stored.snapshot
    revisions = [r for r in store.revisions(snap.run_id) if r.revision <= snap.revision]
    return entry_times(stored.transcript, revisions, snap.updated_at)


def timed_replay(store: CheckpointStore, stored: StoredRun) -> Replay:
    """`replay_of(stored)` with each event dated (module docstring) instead of all of them
    carrying the loaded checkpoint's time."""
    from steerable.actors._stores.replay import replay_of

    replay = replay_of(stored)
    times = _times_of(store, stored)
    events = list(replay.events)
    snap = stored.snapshot
    events[0] = events[0].model_copy(update={"at": snap.created_at})
    for index, at in enumerate(times, start=1):
        events[index] = events[index].model_copy(update={"at": at})
    # A terminal replay's last event (run_ended) keeps the terminal checkpoint's time.
    return dataclasses.replace(replay, events=tuple(events))


# ---------------------------------------------------------------------------------- runs


@guarded
def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs in the store, oldest first."""
    store = open_store(args)
    try:
        runs = store.runs()
    finally:
        store.close()
    if args.json:
        emit_json(
            {
                "db": str(store.path),
                "runs": [
                    {
                        "run_id": run.run_id,
                        "parent_run_id": run.parent_run_id,
                        "state": run.state.value,
                        "revision": run.revision,
                        "agent": run.agent,
                        "task": run.task,
                        "updated_at": run.updated_at,
                    }
                    for run in runs
                ],
            }
        )
        return OK
    print(f"{'run id':<40} {'state':<10} {'rev':>5}  {'agent':<16} {'updated':<19}  task")
    for run in runs:
        name = run.run_id if run.parent_run_id is None else f"  {run.run_id}"
        print(
            f"{name:<40} {run.state.value:<10} {run.revision:>5}  {run.agent:<16} "
            f"{stamp(run.updated_at)[:19]}  {short(run.task, 60)}"
        )
    print(f"{len(runs)} run(s) in {store.path}")
    return OK


# ---------------------------------------------------------------------------------- show


def _snapshot_json(snap: RunSnapshot) -> dict[str, Any]:
    return {
        "run_id": snap.run_id,
        "state": snap.state.value,
        "waiting_for": None if snap.waiting_for is None else snap.waiting_for.value,
        "revision": snap.revision,
        "task": snap.task,
        "agent": snap.agent,
        "depth": snap.depth,
        "parent_run_id": snap.parent_run_id,
        "forked_from": None
        if snap.forked_from is None
        else {"run_id": snap.forked_from.run_id, "revision": snap.forked_from.revision},
        "created_at": snap.created_at,
        "updated_at": snap.updated_at,
        "counters": {
            "steps": snap.steps,
            "model_calls": snap.model_calls,
            "tokens": snap.usage.total,
            "retries": snap.metrics.retries,
        },
        "output": snap.output,
        "errors": [error.model_dump(mode="json") for error in snap.errors],
    }


def _owner_json(store: CheckpointStore, run_id: str) -> dict[str, Any] | None:
    """Who holds the run's lease, and whether it still does (None: never claimed)."""
    import time

    from steerable.actors._stores.lease import owner_gone

    lease = store.lease(run_id)
    if lease is None:
        return None
    return {
        "instance_id": lease.owner.instance_id,
        "host": lease.owner.host,
        "pid": lease.owner.pid,
        "epoch": lease.epoch,
        "expires_at": lease.expires_at,
        "live": lease.expires_at > time.time() and not owner_gone(lease.owner),
    }


def _owner_line(owner: dict[str, Any] | None, terminal: bool) -> str:
    if terminal:
        return "-"
    if owner is None or not owner["live"]:
        return "nobody (parked or orphaned: its next resume or adoption takes it)"
    return (
        f"{owner['host']} pid {owner['pid']} (epoch {owner['epoch']}, "
        f"lease until {stamp(owner['expires_at'])})"
    )


@guarded
def cmd_show(args: argparse.Namespace) -> int:
    """A run's state, owner, counters, errors and a dated transcript summary."""
    store = open_store(args)
    try:
        stored = store.load(args.run_id)
        times = _times_of(store, stored)
        owner = _owner_json(store, args.run_id)
    finally:
        store.close()
    snap = stored.snapshot
    if args.json:
        emit_json(
            {
                **_snapshot_json(snap),
                "owner": owner,
                "transcript": [
                    {
                        "index": index,
                        "at": at,
                        "summary": describe(entry),
                        "entry": entry.model_dump(mode="json"),
                    }
                    for index, (entry, at) in enumerate(zip(stored.transcript, times, strict=True))
                ],
            }
        )
        return OK
    waiting = f" (waiting for {snap.waiting_for.value})" if snap.waiting_for else ""
    print(f"run       {snap.run_id}")
    print(f"state     {snap.state.value}{waiting}   revision {snap.revision}")
    print(f"task      {snap.task}")
    print(f"agent     {snap.agent}   depth {snap.depth}   parent {snap.parent_run_id or '-'}")
    print(f"created   {stamp(snap.created_at)}   updated {stamp(snap.updated_at)}")
    print(f"owner     {_owner_line(owner, snap.state.is_terminal)}")
    if snap.forked_from is not None:
        print(f"forked    from {snap.forked_from.run_id} at revision {snap.forked_from.revision}")
    print(
        f"counters  {snap.steps} tool steps, {snap.model_calls} model calls, "
        f"{snap.usage.total} tokens, {snap.metrics.retries} retries"
    )
    if snap.output is not None:
        print(f"output    {short(repr(snap.output), 200)}")
    for error in snap.errors:
        print(f"error     [{error.code.value}] {error.message}")
    print(f"transcript ({len(stored.transcript)} entries):")
    for index, (entry, at) in enumerate(zip(stored.transcript, times, strict=True)):
        print(f"  {index:>4}  {stamp(at)}  {describe(entry)}")
    return OK


# ---------------------------------------------------------------------------------- revisions


@guarded
def cmd_revisions(args: argparse.Namespace) -> int:
    """Every revision of a run."""
    store = open_store(args)
    try:
        revisions = store.revisions(args.run_id)
    finally:
        store.close()
    if args.json:
        emit_json(
            {
                "run_id": args.run_id,
                "revisions": [
                    {
                        "revision": rev.revision,
                        "state": rev.state.value,
                        "transcript_len": rev.transcript_len,
                        "updated_at": rev.updated_at,
                    }
                    for rev in revisions
                ],
            }
        )
        return OK
    print(f"{'rev':>5}  {'state':<10} {'entries':>7}  updated")
    for rev in revisions:
        print(
            f"{rev.revision:>5}  {rev.state.value:<10} {rev.transcript_len:>7}  "
            f"{stamp(rev.updated_at)}"
        )
    return OK


# ---------------------------------------------------------------------------------- replay


@guarded
def cmd_replay(args: argparse.Namespace) -> int:
    """A run's dated events up to a revision, rebuilt from the store; nothing is executed."""
    store = open_store(args)
    try:
        replay = timed_replay(store, store.load(args.run_id, args.revision))
    finally:
        store.close()
    if args.json:
        emit_json(
            {
                "run_id": replay.run_id,
                "revision": replay.revision,
                "events": [event.model_dump(mode="json") for event in replay.events],
                "outcome": None
                if replay.outcome is None
                else replay.outcome.model_dump(mode="json"),
            }
        )
        return OK
    print(f"replay of {replay.run_id} at revision {replay.revision} (read-only)")
    for event in replay.events:
        data = ", ".join(f"{k}={short(repr(v), 60)}" for k, v in event.data.items())
        print(f"  {event.seq:>4}  {stamp(event.at)}  {event.kind.value:<20} {data}")
    if replay.outcome is not None:
        print(f"outcome: {replay.outcome.state.value}")
    return OK


# ---------------------------------------------------------------------------------- approvals


def approvals_json(run_id: str, pending: Sequence[ApprovalRequest]) -> dict[str, Any]:
    """The `approvals --json` document."""
    return {
        "run_id": run_id,
        "pending": [
            {"call_id": req.call_id, "tool": req.tool, "arguments": req.arguments}
            for req in pending
        ],
    }


@guarded
def cmd_approvals(args: argparse.Namespace) -> int:
    """The calls of a run waiting for a person's approval (`steerable approve RUN CALL_ID`)."""
    from .common import client

    with client(args) as rt:
        pending = rt.pending_approvals(args.run_id)
    if args.json:
        emit_json(approvals_json(args.run_id, pending))
        return OK
    for req in pending:
        arguments = ", ".join(f"{k}={short(repr(v), 40)}" for k, v in req.arguments.items())
        print(f"{req.call_id}  {req.tool}({arguments})")
    print(f"{len(pending)} call(s) of {args.run_id} waiting for approval")
    return OK


# ---------------------------------------------------------------------------------- transcript


def describe(entry: TranscriptEntry) -> str:
    """One line saying what a transcript entry is."""
    from steerable.protocol import DecisionEntry, Plan, SubagentResult, ToolResult, UserMessage

    if isinstance(entry, UserMessage):
        return f"user #{entry.seq}: {short(entry.content, 100)}"
    if isinstance(entry, DecisionEntry):
        decision = entry.decision
        if isinstance(decision, Plan):
            steps = ", ".join(
                step.name if step.kind == "tool" else f"subagent {step.agent}"
                for step in decision.steps
            )
            return f"decision #{entry.model_call}: plan [{steps}]"
        return f"decision #{entry.model_call}: {decision.kind}"
    if isinstance(entry, ToolResult):
        what = "ok" if entry.error is None else f"error {entry.error.code.value}"
        return f"result {entry.call_id} {entry.tool}: {what}"
    if isinstance(entry, SubagentResult):
        return (
            f"subagent {entry.call_id} {entry.agent} -> {entry.child_run_id}: {entry.state.value}"
        )
    return f"note: {short(entry.text, 100)}"
