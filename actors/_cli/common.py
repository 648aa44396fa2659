"""What every `steerable` subcommand shares: the store it opens, exit codes, errors, output.

Exit codes (docs/cli.md): `OK` (0) the command did what it says; `REFUSED` (1) the run said
no (an approval of a call that is not waiting, a cancel of a run already ending, a message to a
run that ended); `BAD` (2) bad input, an unknown run or revision, no such database, a store
that cannot be read; `NOT_TAKEN` (3) the operation is stored but its run's owner did not take
it within `--timeout` (it reaches the run when the owner, or the next one, reads it).
Errors are one line on stderr, `steerable: [code] message`, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steerable.actors._host.runtime import Runtime
    from steerable.actors._stores.sqlite import SqliteStore

__all__ = [
    "BAD",
    "NOT_TAKEN",
    "OK",
    "REFUSED",
    "client",
    "db_argument",
    "emit_json",
    "guarded",
    "json_argument",
    "keeps_events",
    "open_store",
    "quiet_logs",
    "short",
    "stamp",
]

OK = 0
REFUSED = 1
BAD = 2
NOT_TAKEN = 3


def quiet_logs() -> None:
    """Log warnings and errors to stderr, unless the process already configured logging.

    Only the command line calls this: it owns its process. The library itself never configures
    logging or structlog (the host's globals); its records go to the `steerable` loggers.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")


def db_argument(parser: argparse.ArgumentParser) -> None:
    """`--db PATH`."""
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        help="the SQLite store (default: $STEERABLE_DB, else ~/.local/share/steerable/runs.db)",
    )


def json_argument(parser: argparse.ArgumentParser) -> None:
    """`--json`: machine-readable output (docs/cli.md lists every shape)."""
    parser.add_argument(
        "--json", action="store_true", help="print JSON (shapes: docs/cli.md) instead of text"
    )


def open_store(args: argparse.Namespace, *, create: bool = False) -> SqliteStore:
    """The store at `--db`; only the demo creates one (a missing file is `not_found`)."""
    from steerable.actors._stores.sqlite import SqliteStore, default_db_path

    path: Path = args.db if args.db is not None else default_db_path()
    return SqliteStore(path, create=create)


@contextlib.contextmanager
def client(args: argparse.Namespace) -> Iterator[Runtime]:
    """A `Runtime` on `--db` that only operates runs other processes own (or nobody does).

    It starts no run and adopts none (`adopt_orphans=False`), so its lease keeper renews
    nothing and its wake thread has no run to bring operations to; `shutdown()` joins every
    thread it started and closes the store.
    """
    from steerable.actors._host.runtime import Runtime

    store = open_store(args)
    try:
        rt = Runtime(store=store, adopt_orphans=False, max_workers=4, hook_workers=1)
    except BaseException:
        store.close()
        raise
    try:
        yield rt
    finally:
        rt.shutdown(cancel_runs=False)


def keeps_events(store: Any, run_id: str) -> bool:
    """Whether `store` keeps events and holds some of `run_id`'s (docs/durability.md, "Stored
    events"); a store of an older steerable has no `stores_events` and keeps them if it has
    `events`."""
    flag = getattr(store, "stores_events", None)
    if flag is None:
        flag = callable(getattr(store, "events", None))
    if not flag:
        return False
    next_seq = getattr(store, "next_event_seq", None)
    return not callable(next_seq) or int(next_seq(run_id)) > 0


def guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report a failure as one line on stderr and turn it into the documented exit code.

    `SteerableError`: `run_ended` exits `REFUSED`, every other code `BAD`. `ValueError` and
    `TypeError` (bad input the library refused) exit `BAD`; `TimeoutError` (an operation
    stored but not taken in time) exits `NOT_TAKEN`.
    """

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        from steerable.protocol import ErrorCode, SteerableError

        quiet_logs()
        try:
            return run(args)
        except SteerableError as exc:
            print(f"steerable: {exc}", file=sys.stderr)
            return REFUSED if exc.code is ErrorCode.RUN_ENDED else BAD
        except (ValueError, TypeError) as exc:
            print(f"steerable: [invalid_arguments] {exc}", file=sys.stderr)
            return BAD
        except TimeoutError as exc:
            print(f"steerable: [timeout] {exc}", file=sys.stderr)
            return NOT_TAKEN

    return wrapper


def _plain(value: Any) -> Any:
    """A value `json.dumps` can write: pydantic models dumped, the rest by `repr`."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)


def emit_json(document: Any, *, line: bool = False) -> None:
    """Print one JSON document (indented), or one compact line (`line=True`, JSON lines)."""
    if line:
        text = json.dumps(document, default=_plain, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps(document, default=_plain, ensure_ascii=False, indent=2)
    print(text, flush=line)


def stamp(at: float) -> str:
    """Wall-clock seconds as local `YYYY-MM-DD HH:MM:SS.mmm`; `-` for an unknown (0) time."""
    if at <= 0:
        return "-" + " " * 22
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{whole}.{int(at * 1000) % 1000:03d}"


def short(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
