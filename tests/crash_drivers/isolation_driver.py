"""Start a process-isolated tool call that never returns, report the worker pids, wait to die.

Used by tests/test_isolation.py, which SIGKILLs this process and then checks that its worker
processes exit on their own (no orphan).

Usage: isolation_driver.py TOOL DIR (a tool of tests/isolation_tools.py taking `beacon`; DIR, a
short directory the test owns and removes, since this process dies by SIGKILL and cleans up
nothing), run with tests/ as the working directory. Prints one line,
`workers <busy pid> <other pids...>`.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from steerable.actors import Runtime
from steerable.actors.testing import ScriptedAgent, call, plan

if TYPE_CHECKING:
    from tests import isolation_tools as kit
else:  # the tools' module must be importable by the same name in the workers
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import isolation_tools as kit


def main() -> None:
    name, directory = sys.argv[1], Path(sys.argv[2])
    beacon = kit.Beacon(directory)
    rt = Runtime(tools=[getattr(kit, name)], process_workers=2)
    rt.start("t", agent=ScriptedAgent([plan(call(name, beacon=beacon.address))]))
    busy = int(beacon.wait())
    others = [p for p in rt.services.executors.process_pool().pids() if p != busy]
    sys.stdout.write(" ".join(["workers", str(busy), *map(str, others)]) + "\n")
    sys.stdout.flush()
    threading.Event().wait()  # until SIGKILLed


if __name__ == "__main__":
    main()
