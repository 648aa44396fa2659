"""The commands that act on a run: `send`, `cancel`, `approve`, `deny`, and `events`.

Each opens a client `Runtime` on the store (`common.client`: it owns nothing, starts and adopts
no run) and uses its run-addressed operations, which work the same whether the run lives in
another process or nowhere: the operation is stored before the command returns; a live owner
takes it within its wake interval, a parked run gets it on its next resume (docs/cli.md).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .common import (
    OK,
    REFUSED,
    client,
    db_argument,
    emit_json,
    guarded,
    json_argument,
    keeps_events,
    short,
    stamp,
)
from .reads import timed_replay

if TYPE_CHECKING:
    from steerable.actors._host.runtime import Runtime
    from steerable.protocol import RunEvent

__all__ = [
    "cmd_approve",
    "cmd_cancel",
    "cmd_deny",
    "cmd_events",
    "cmd_send",
    "decision_arguments",
    "events_arguments",
    "run_op_arguments",
    "send_arguments",
]

CHECKPOINT_POLL = 0.05
"""Seconds between two looks at the store's change counter while following a run's
checkpoints (a store that keeps no events)."""


def run_op_arguments(parser: argparse.ArgumentParser) -> None:
    """`--db`, `--json`, `--timeout`, `RUN`."""
    db_argument(parser)
    json_argument(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for a live owner to take the operation (default 10); "
        "past it the command exits 3 and the operation stays stored",
    )
    parser.add_argument("run_id", help="the run")


def send_arguments(parser: argparse.ArgumentParser) -> None:
    """`steerable send RUN TEXT [--mode queue|interrupt] [--message-id ID]`."""
    run_op_arguments(parser)
    parser.add_argument("text", help="the message")
    parser.add_argument(
        "--mode",
        choices=("queue", "interrupt"),
        default=None,
        help="queue (default): seen at the agent's next decision; interrupt: also discards "
        "the decision in progress (docs/steering.md)",
    )
    parser.add_argument(
        "--message-id",
        default=None,
        help="an id that makes a retried send one message (the same id twice is one message)",
    )


def cancel_arguments(parser: argparse.ArgumentParser) -> None:
    """`steerable cancel RUN [--reason R]`."""
    run_op_arguments(parser)
    parser.add_argument("--reason", default="cancelled", help="why (recorded on the run)")


def decision_arguments(parser: argparse.ArgumentParser, *, reason: bool = False) -> None:
    """`steerable approve RUN CALL_ID` / `steerable deny RUN CALL_ID [--reason R]`."""
    run_op_arguments(parser)
    parser.add_argument("call_id", help="the call waiting for approval (`steerable approvals`)")
    if reason:
        parser.add_argument("--reason", default="", help="why (the agent sees it)")


def deny_arguments(parser: argparse.ArgumentParser) -> None:
    """`steerable deny RUN CALL_ID [--reason R]`."""
    decision_arguments(parser, reason=True)


def _refused(text: str) -> None:
    print(f"steerable: [refused] {text}", file=sys.stderr)


@guarded
def cmd_send(args: argparse.Namespace) -> int:
    """Send a user message to a run; prints its inbox seq."""
    with client(args) as rt:
        seq = rt.send(args.run_id, args.text, args.mode, args.message_id, timeout=args.timeout)
    if args.json:
        emit_json({"run_id": args.run_id, "seq": seq})
    else:
        print(f"message #{seq} sent to {args.run_id}")
    return OK


@guarded
def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a run; exit 1 if it is terminal or already cancelling."""
    with client(args) as rt:
        cancelled = rt.cancel(args.run_id, args.reason, timeout=args.timeout)
        state = rt.state(args.run_id)
    if args.json:
        emit_json({"run_id": args.run_id, "cancelled": cancelled, "state": state.value})
    elif cancelled:
        print(f"cancel of {args.run_id} requested")
    if not cancelled:
        why = "already ending" if not state.is_terminal else "over: nothing to cancel"
        _refused(f"run {args.run_id} is {state.value}, {why}")
        return REFUSED
    return OK


def _decide(args: argparse.Namespace, approved: bool) -> int:
    with client(args) as rt:
        if approved:
            settled = rt.approve(args.run_id, args.call_id, timeout=args.timeout)
        else:
            settled = rt.deny(args.run_id, args.call_id, args.reason, timeout=args.timeout)
    verb = "approved" if approved else "denied"
    if args.json:
        emit_json(
            {
                "run_id": args.run_id,
                "call_id": args.call_id,
                "approved": approved,
                "settled": settled,
            }
        )
    elif settled:
        print(f"call {args.call_id} of {args.run_id} {verb}")
    if not settled:
        _refused(f"call {args.call_id} of run {args.run_id} is not waiting for approval")
        return REFUSED
    return OK


@guarded
def cmd_approve(args: argparse.Namespace) -> int:
    """Approve a call waiting for approval; exit 1 if none such is waiting."""
    return _decide(args, True)


@guarded
def cmd_deny(args: argparse.Namespace) -> int:
    """Deny a call waiting for approval; exit 1 if none such is waiting."""
    return _decide(args, False)


# ---------------------------------------------------------------------------------- events


def events_arguments(parser: argparse.ArgumentParser) -> None:
    """`steerable events RUN [--start SEQ] [--follow] [--json]`."""
    db_argument(parser)
    json_argument(parser)
    parser.add_argument("run_id", help="the run")
    parser.add_argument(
        "--start", type=int, default=0, help="the first seq to print (reconnect: last seen + 1)"
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep printing events as they happen, until the run ends (JSON lines with --json)",
    )


def _stored_events(rt: Runtime, run_id: str, start: int) -> list[RunEvent]:
    """The events stored so far: the store's own, else derived from the checkpoints."""
    store: Any = rt.store
    stored = store.load(run_id)  # not_found for an unknown run, whatever the store keeps
    if keeps_events(store, run_id):
        return [event for event in store.events(run_id, start=start) if event.seq >= start]
    return [e for e in timed_replay(store, stored).events if e.seq >= start]


def _follow(rt: Runtime, run_id: str, start: int) -> Iterator[RunEvent]:
    """Events from `start` as they happen, until the run ends."""
    from steerable.protocol import ErrorCode, SteerableError

    try:
        stream = rt.events(run_id, start)
    except SteerableError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise
        rt.store.load(run_id)  # unknown to the store too: not_found
        yield from _follow_checkpoints(rt, run_id, start)
        return
    yield from stream


def _follow_checkpoints(rt: Runtime, run_id: str, start: int) -> Iterator[RunEvent]:
    """The checkpoint-derived events (as `replay`) of the run's latest revision, then those
    of each new revision, until it is terminal: for a runtime whose `events(run_id)` cannot
    reach a run that lives elsewhere."""
    store = rt.store
    counter = getattr(store, "change_counter", None)
    position = start
    seen: object = object()
    pause = threading.Event()
    while True:
        now = counter() if callable(counter) else None
        if now is None or now != seen:
            seen = now
            replay = timed_replay(store, store.load(run_id))
            yield from replay.events[position:]
            position = max(position, len(replay.events))
            if replay.outcome is not None:
                return
        pause.wait(CHECKPOINT_POLL)


def _line(event: RunEvent, run_id: str) -> str:
    data = ", ".join(f"{k}={short(repr(v), 60)}" for k, v in event.data.items())
    who = "" if event.run_id == run_id else f"[{event.run_id}] "
    return f"{event.seq:>5}  {stamp(event.at)}  {event.kind.value:<20} {who}{data}"


@guarded
def cmd_events(args: argparse.Namespace) -> int:
    """A run's events: those stored so far, or (`--follow`) live until the run ends."""
    with client(args) as rt:
        if not args.follow:
            events = _stored_events(rt, args.run_id, args.start)
            if args.json:
                emit_json(
                    {
                        "run_id": args.run_id,
                        "events": [event.model_dump(mode="json") for event in events],
                    }
                )
            else:
                for event in events:
                    print(_line(event, args.run_id))
            return OK
        for event in _follow(rt, args.run_id, args.start):
            if args.json:
                emit_json(event.model_dump(mode="json"), line=True)
            else:
                print(_line(event, args.run_id), flush=True)
    return OK
