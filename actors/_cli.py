"""The `steerable` command line: `steerable demo` (more subcommands to come).

Each subcommand is one function `(args) -> exit code` plus an optional function that adds its
arguments, registered in `SUBCOMMANDS`; `main()` builds the parser from that registry.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

import structlog

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
    """Log warnings and errors to stderr, unless the process already configured structlog.

    Only the command line calls this: it owns its process. The library itself never configures
    structlog (a host's global), whose default prints every level to stdout.
    """
    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )


# ---------------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo scenario on an in-memory store; exit 0 if both runs ended as designed."""
    from ._demo import demo_ok, run_demo  # lazy: `steerable --help` starts no runtime code

    quiet_logs()
    out = functools.partial(print, flush=True)  # lines appear as events happen, even in a pipe
    outcomes = run_demo(out)
    return 0 if demo_ok(outcomes) else 1


# ---------------------------------------------------------------------------------- registry

SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        name="demo",
        help="run a scripted demo of parallel tools, steering, approval, timeout, retry, cancel",
        run=cmd_demo,
        description=(
            "Two real runs on one Runtime: parallel tools, a queued and an interrupting "
            "message, an approval, a tool timeout, a retry, then a second run cancelled "
            "mid-tool. Prints one line per event as it happens, then a summary. Takes under "
            "a second; leaves nothing behind."
        ),
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


if __name__ == "__main__":
    raise SystemExit(main())
