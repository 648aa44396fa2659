"""Write checkpoints to a SqliteStore in a loop until killed (tests/test_stores.py).

Usage: store_writer.py DB RUNS

Each of RUNS runs gets revision after revision; revision r adds two transcript entries with
deterministic content (`SystemNote(text=f"{run_id}/{idx}")`), so a reader can check that every
stored revision is whole. After each flush the script prints `flushed <n>` (n checkpoints
accepted so far), so the parent knows writes are happening when it kills the process.
"""

from __future__ import annotations

import sys

from steerable.actors._stores.sqlite import SqliteStore
from steerable.protocol import CapabilitySnapshot, RunConfig, RunSnapshot, RunState, SystemNote

ENTRIES_PER_REVISION = 2


def snapshot(run_id: str, revision: int) -> dict[str, object]:
    return RunSnapshot(
        run_id=run_id,
        revision=revision,
        trace_id="0" * 32,
        task=f"task of {run_id}",
        agent="writer",
        state=RunState.RUNNING,
        config=RunConfig(),
        capabilities=CapabilitySnapshot(),
        transcript_len=(revision + 1) * ENTRIES_PER_REVISION,
    ).model_dump(mode="json")


def main() -> None:
    db, runs = sys.argv[1], int(sys.argv[2])
    store = SqliteStore(db, max_batch=7)  # small batches: many transactions, many commits
    run_ids = [f"run_w{i:03d}" for i in range(runs)]
    revision = 0
    written = 0
    while True:
        for run_id in run_ids:
            start = revision * ENTRIES_PER_REVISION
            entries = [
                SystemNote(text=f"{run_id}/{start + k}") for k in range(ENTRIES_PER_REVISION)
            ]
            store.write_checkpoint(run_id, revision, snapshot(run_id, revision), start, entries)
            written += 1
        revision += 1
        if revision % 5 == 0:
            store.flush()
            print(f"flushed {written}", flush=True)


if __name__ == "__main__":
    main()
