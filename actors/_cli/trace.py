"""`steerable trace RUN`: a run's timeline as one HTML file or Chrome Trace Event JSON.

The events come from `--events FILE` (JSON lines, e.g. written by a `Runtime.subscribe`
callback: docs/observability.md), else from the store when it keeps events.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .common import emit_json, guarded, json_argument, keeps_events, open_store

if TYPE_CHECKING:
    from steerable.protocol import RunEvent

__all__ = ["cmd_trace", "trace_arguments"]


def trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `steerable trace`."""
    parser.add_argument("run_id", help="the run (its subagents are drawn nested under it)")
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        help="the SQLite store (default: $STEERABLE_DB, else ~/.local/share/steerable/runs.db)",
    )
    parser.add_argument(
        "--events", type=Path, default=None, help="read the events from this JSON-lines file"
    )
    parser.add_argument(
        "--format", choices=("html", "chrome"), default="html", help="what to write (html)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write (default: RUN.html / RUN.json)"
    )
    parser.add_argument(
        "--content",
        action="store_true",
        help="include message and tool content (task, arguments, results)",
    )
    json_argument(parser)


def _stored_events(args: argparse.Namespace) -> list[RunEvent] | None:
    store = open_store(args)  # a missing database is not_found, never created
    try:
        if not keeps_events(store, args.run_id):
            store.load(args.run_id)  # an unknown run is not_found, whatever the store keeps
            return None
        reader = cast("Callable[[str], Iterable[Any]]", store.events)
        return list(reader(args.run_id))
    finally:
        store.close()


@guarded
def cmd_trace(args: argparse.Namespace) -> int:
    """Write a run's timeline; exit 2 if its events cannot be found."""
    from steerable.actors._observe.files import read_events, run_tree_events, write_timeline

    if args.events is not None:
        try:
            events = run_tree_events(read_events(args.events), args.run_id)
        except (OSError, ValueError) as exc:
            print(f"steerable: {exc}", file=sys.stderr)
            return 2
    else:
        stored = _stored_events(args)
        if stored is None:
            print(
                f"steerable: the store holds no events of run {args.run_id}; record them with "
                "Runtime.subscribe and pass --events FILE (docs/observability.md)",
                file=sys.stderr,
            )
            return 2
        events = run_tree_events(stored, args.run_id)
    if not events:
        print(
            f"steerable: no events of run {args.run_id} (events are stored with runs of a "
            "SqliteStore; for others record them with Runtime.subscribe and pass --events "
            "FILE: docs/observability.md)",
            file=sys.stderr,
        )
        return 2
    suffix = ".html" if args.format == "html" else ".json"
    out = args.out if args.out is not None else Path(f"{args.run_id}{suffix}")
    write_timeline(events, out, format=args.format, content=args.content)
    if args.json:
        emit_json(
            {"run_id": args.run_id, "format": args.format, "events": len(events), "out": str(out)}
        )
    else:
        print(f"{args.format} timeline of {args.run_id} ({len(events)} events): {out}")
    return 0
