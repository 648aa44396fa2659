"""The `steerable` command line: `demo`; the reads `runs`, `show`, `revisions`, `replay`,
`approvals`, `events`, `trace`; and the operations `send`, `cancel`, `approve`, `deny`.

Every command works on the SQLite store at `--db`, else `$STEERABLE_DB`, else
`~/.local/share/steerable/runs.db` (see `default_db_path`); only `demo` creates it. Exit codes
and JSON shapes: docs/cli.md (and `common.py`).

Each subcommand is one function `(args) -> exit code` plus an optional function that adds its
arguments, registered in `SUBCOMMANDS`; `main()` builds the parser from that registry.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common import db_argument, open_store, quiet_logs
from .ops import (
    cancel_arguments,
    cmd_approve,
    cmd_cancel,
    cmd_deny,
    cmd_events,
    cmd_send,
    decision_arguments,
    deny_arguments,
    events_arguments,
    send_arguments,
)
from .reads import (
    cmd_approvals,
    cmd_replay,
    cmd_revisions,
    cmd_runs,
    cmd_show,
    list_arguments,
    revision_arguments,
    run_arguments,
)
from .trace import cmd_trace, trace_arguments

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


# ---------------------------------------------------------------------------------- demo


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    db_argument(parser)
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
    store = None if args.memory else open_store(args, create=True)
    outcomes = run_demo(out, store=store, timeline=args.timeline)
    if store is not None:
        out(
            f"Runs stored in {store.path}: try `steerable runs` and "
            f"`steerable show {outcomes[0].run_id}`."
        )
    return 0 if demo_ok(outcomes) else 1


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
    Subcommand("runs", "list the stored runs", cmd_runs, list_arguments),
    Subcommand("show", "a run's state, errors and dated transcript", cmd_show, run_arguments),
    Subcommand("revisions", "a run's revisions", cmd_revisions, run_arguments),
    Subcommand(
        "replay", "a run's events up to a revision, read-only", cmd_replay, revision_arguments
    ),
    Subcommand(
        "events",
        "a run's events so far, or live until it ends (--follow)",
        cmd_events,
        events_arguments,
    ),
    Subcommand(
        "approvals", "the calls of a run waiting for approval", cmd_approvals, run_arguments
    ),
    Subcommand(
        "trace",
        "a run's timeline: one HTML file, or Chrome Trace Event JSON (Perfetto)",
        cmd_trace,
        trace_arguments,
    ),
    Subcommand("send", "send a message to a run (queue or interrupt)", cmd_send, send_arguments),
    Subcommand("cancel", "cancel a run", cmd_cancel, cancel_arguments),
    Subcommand("approve", "approve a call waiting for approval", cmd_approve, decision_arguments),
    Subcommand("deny", "deny a call waiting for approval", cmd_deny, deny_arguments),
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
