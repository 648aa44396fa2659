"""The `steerable demo` scenario as a script: `python examples/demo.py`.

Two real runs on one Runtime show parallel tools, a queued and an interrupting steering message,
an approval, a tool timeout, a retry and a cancel, one line per event. The scenario lives in
`steerable.actors._cli.demo` so that the `steerable demo` command ships it too.
"""

from __future__ import annotations

import functools

from steerable.actors._cli.cli import quiet_logs
from steerable.actors._cli.demo import demo_ok, run_demo


def main() -> int:
    quiet_logs()  # this script owns its process: warnings to stderr, no debug noise
    outcomes = run_demo(functools.partial(print, flush=True))
    return 0 if demo_ok(outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
