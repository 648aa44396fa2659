"""The `steerable` command line: `demo`, and `runs`, `show`, `revisions`, `replay`, `trace`.

Every command works on the SQLite store at `--db`, else `$STEERABLE_DB`, else
`~/.local/share/steerable/runs.db` (see `default_db_path`).

Each subcommand is one function `(args) -> exit code` plus an optional function that adds its
arguments, registered in `SUBCOMMANDS`; `main()` builds the parser from that registry.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .trace import cmd_trace, trace_arguments

if TYPE_CHECKING:
    from steerable.actors._stores.sqlite import SqliteStore
    from steerable.protocol import TranscriptEntry

__all__ = ["SUBCOMMANDS", "Subcommand", "build_parser", "main", "quiet_logs"]


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Subcommand:
    """One `steerable <name>` subcommand.

    Attributes:
        name: What the user types.
        help: One line for `steerable --help`.
        run: Does the work; returns the process exit code.
        arguments: Adds the subcommand's own arguments to its parser.
        description: Shown by `steerable <name> --help` (default: `help`).
    """

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    description: str = ""


def quiet_logs() -> None:
    """Log warnings and errors to stderr, unless the process already configured logging.

    Only the command line calls this: it owns its process. The library itself never configures
    logging or structlog (the host's globals); its records go to the `steerable` loggers.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")


# ---------------------------------------------------------------------------------- demo


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        help="the SQLite store (default: $STEERABLE_DB, else ~/.local/share/steerable/runs.db)",
    )


def _store(args: argparse.Namespace, *, create: bool = False) -> SqliteStore:
    """The store at `--db`; only the demo creates one (reading a missing file is an error)."""
    from steerable.actors._stores.sqlite import SqliteStore, default_db_path

    path: Path = args.db if args.db is not None else default_db_path()
    return SqliteStore(path, create=create)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    _db_argument(parser)
    parser.add_argument(
        "--memory",
        action="store_true",
        help="keep the demo's runs in memory instead of the SQLite store",
    )
    parser.add_argument(
        "--timeline",
        type=Path,
        default=None,
        help="where to write the runs' HTML timeline (default: the temp directory)",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo scenario on the SQLite default store; exit 0 if both runs ended as designed."""
    from .demo import demo_ok, run_demo  # lazy: `steerable --help` starts no runtime code

    quiet_logs()
    out = functools.partial(print, flush=True)  # lines appear as events happen, even in a pipe
    store = None if args.memory else _store(args, create=True)
    outcomes = run_demo(out, store=store, timeline=args.timeline)
    if store is not None:
        out(
            f"Runs stored in {store.path}: try `steerable runs` and "
            f"`steerable show {outcomes[0].run_id}`."
        )
    return 0 if demo_ok(outcomes) else 1


# ---------------------------------------------------------------------------------- stored runs


def _ids_argument(parser: argparse.ArgumentParser) -> None:
    _db_argument(parser)
    parser.add_argument("run_id", help="the run")


def _revision_argument(parser: argparse.ArgumentParser) -> None:
    _ids_argument(parser)
    parser.add_argument(
        "--revision", type=int, default=None, help="the revision (default: the latest)"
    )


def _guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report a SteerableError (unknown run, corrupt row...) as one line and exit 2."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        from steerable.protocol import SteerableError

        quiet_logs()
        try:
            return run(args)
        except SteerableError as exc:
            print(f"steerable: {exc}", file=sys.stderr)
            return 2

    return wrapper


@_guarded
def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs in the store, oldest first."""
    store = _store(args)
    try:
        runs = store.runs()
    finally:
        store.close()
    print(f"{'run id':<40} {'state':<10} {'rev':>5}  {'agent':<16} task")
    for run in runs:
        name = run.run_id if run.parent_run_id is None else f"  {run.run_id}"
        print(
            f"{name:<40} {run.state.value:<10} {run.revision:>5}  {run.agent:<16} "
            f"{_short(run.task, 60)}"
        )
    print(f"{len(runs)} run(s) in {store.path}")
    return 0


@_guarded
def cmd_show(args: argparse.Namespace) -> int:
    """A run's state, counters, errors and a transcript summary."""
    store = _store(args)
    try:
        stored = store.load(args.run_id)
    finally:
        store.close()
    snap = stored.snapshot
    waiting = f" (waiting for {snap.waiting_for.value})" if snap.waiting_for else ""
    print(f"run       {snap.run_id}")
    print(f"state     {snap.state.value}{waiting}   revision {snap.revision}")
    print(f"task      {snap.task}")
    print(f"agent     {snap.agent}   depth {snap.depth}   parent {snap.parent_run_id or '-'}")
    if snap.forked_from is not None:
        print(f"forked    from {snap.forked_from.run_id} at revision {snap.forked_from.revision}")
    print(
        f"counters  {snap.steps} tool steps, {snap.model_calls} model calls, "
        f"{snap.usage.total} tokens, {snap.metrics.retries} retries"
    )
    if snap.output is not None:
        print(f"output    {_short(repr(snap.output), 200)}")
    for error in snap.errors:
        print(f"error     [{error.code.value}] {error.message}")
    print(f"transcript ({len(stored.transcript)} entries):")
    for index, entry in enumerate(stored.transcript):
        print(f"  {index:>4}  {_describe(entry)}")
    return 0


@_guarded
def cmd_revisions(args: argparse.Namespace) -> int:
    """Every revision of a run."""
    store = _store(args)
    try:
        revisions = store.revisions(args.run_id)
    finally:
        store.close()
    print(f"{'rev':>5}  {'state':<10} {'entries':>7}  updated")
    for rev in revisions:
        print(
            f"{rev.revision:>5}  {rev.state.value:<10} {rev.transcript_len:>7}  "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rev.updated_at))}"
        )
    return 0


@_guarded
def cmd_replay(args: argparse.Namespace) -> int:
    """A run's events up to a revision, rebuilt from the store; nothing is executed (R23)."""
    from steerable.actors._stores.replay import replay_of

    store = _store(args)
    try:
        replay = replay_of(store.load(args.run_id, args.revision))
    finally:
        store.close()
    print(f"replay of {replay.run_id} at revision {replay.revision} (read-only)")
    for event in replay.events:
        data = ", ".join(f"{k}={_short(repr(v), 60)}" for k, v in event.data.items())
        print(f"  {event.seq:>4}  {event.kind.value:<20} {data}")
    if replay.outcome is not None:
        print(f"outcome: {replay.outcome.state.value}")
    return 0


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(entry: TranscriptEntry) -> str:
    from steerable.protocol import DecisionEntry, Plan, SubagentResult, ToolResult, UserMessage

    if isinstance(entry, UserMessage):
        return f"user #{entry.seq}: {_short(entry.content, 100)}"
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
    return f"note: {_short(entry.text, 100)}"


# ---------------------------------------------------------------------------------- registry

SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        name="demo",
        help="run a scripted demo of parallel tools, steering, approval, timeout, retry, cancel",
        run=cmd_demo,
        arguments=_demo_arguments,
        description=(
            "Two real runs on one Runtime: parallel tools, a queued and an interrupting "
            "message, an approval, a tool timeout, a retry, then a second run cancelled "
            "mid-tool. Prints one line per event as it happens, then a summary. Takes under "
            "a second; leaves nothing behind."
        ),
    ),
]
SUBCOMMANDS += [
    Subcommand("runs", "list the stored runs", cmd_runs, _db_argument),
    Subcommand("show", "a run's state, errors and transcript summary", cmd_show, _ids_argument),
    Subcommand("revisions", "a run's revisions", cmd_revisions, _ids_argument),
    Subcommand(
        "replay", "a run's events up to a revision, read-only", cmd_replay, _revision_argument
    ),
    Subcommand(
        "trace",
        "a run's timeline: one HTML file, or Chrome Trace Event JSON (Perfetto)",
        cmd_trace,
        trace_arguments,
    ),
]
"""Every subcommand, in `--help` order. Add one by appending a `Subcommand`."""


def build_parser() -> argparse.ArgumentParser:
    """The `steerable` argument parser, with one subparser per entry of `SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="steerable",
        description="steerable: an actor-model agent runtime. Try `steerable demo`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS:
        child = sub.add_parser(
            command.name, help=command.help, description=command.description or command.help
        )
        command.arguments(child)
        child.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `steerable` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `steerable show ... | head`: the reader left; so do we
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0
