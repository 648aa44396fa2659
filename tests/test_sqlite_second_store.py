"""A second `SqliteStore` on a file this process already has open must not break its locks.

POSIX drops every lock a process holds on a file when it closes any descriptor of that file.
Opening a store used to read the file's header with a plain `open()`: with a store already
open in the process, that dropped its locks, another process closing its last connection then
believed it was the last one and deleted the WAL, and every later write of the first store
went to a deleted file that no other process could see (found by the CLI's process tests: an
approval stored by `steerable approve` never reached the owner).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from steerable.actors import Runtime, SqliteStore
from steerable.actors.testing import ScriptedAgent, wait_state
from steerable.protocol import AskUser, RunState, UserMessage

WAIT = 60.0

_READ = """
import sys
from steerable.actors import SqliteStore
store = SqliteStore(sys.argv[1], create=False)
try:
    stored = store.load(sys.argv[2])
    said = [e for e in stored.transcript if e.kind == "user"]
    said += [m for m in stored.messages if m.kind == "user"]
    print(" ".join(m.content for m in said))
finally:
    store.close()
"""


def _in_another_process(db: Path, run_id: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(db), run_id],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_writes_after_a_second_store_opened_stay_visible_to_other_processes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    agent = ScriptedAgent(then=AskUser(question="anything?"))
    with Runtime(store=SqliteStore(db)) as rt:
        handle = rt.start("wait", agent=agent)
        wait_state(handle, RunState.WAITING, timeout=WAIT)
        assert rt.store.flush(WAIT)
        SqliteStore(db, create=False).close()  # a second store in this process
        assert _in_another_process(db, handle.run_id) == ""  # its last connection closes
        handle.send("after")
        assert rt.store.flush(WAIT)
        assert _in_another_process(db, handle.run_id) == "after"
        assert (tmp_path / "runs.db-wal").exists()
        handle.cancel()
        handle.result(WAIT)
    store = SqliteStore(db, create=False)
    try:
        stored = store.load(handle.run_id)
        said = [e.content for e in stored.transcript if isinstance(e, UserMessage)]
        assert stored.snapshot.state is RunState.CANCELLED
        assert said + [m.content for m in stored.messages if isinstance(m, UserMessage)] == [
            "after"
        ]
    finally:
        store.close()
