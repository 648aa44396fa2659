"""The multi-process ownership harness (tests/test_ownership_processes.py) on PostgreSQL.

The driver processes stand for hosts sharing one database (a fresh schema of the test server):
four processes resuming `unfinished()` together resume each run once; a SIGKILLed owner's runs
are adopted within the lease TTL; a SIGSTOPped owner is fenced out and lands nothing after it
thaws; a process that owns nothing steers, approves, denies and cancels another process's runs
(each message delivered once, in order; each decision settled once; the cancel ends the run).
Each case is the SQLite scenario itself, with the harness's store hooks pointed here. (The
crash loop across processes runs on PostgreSQL in tests/test_crash_processes.py.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    import tests.test_ownership_processes as procs
    from tests.pg_kit import admin, pg_store
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    import test_ownership_processes as procs
    from pg_kit import admin, pg_store

CASES: list[Callable[..., None]] = [
    procs.test_four_processes_resuming_unfinished_resume_each_run_exactly_once,
    procs.test_a_killed_owners_runs_are_adopted_within_the_lease_ttl,
    procs.test_a_frozen_owner_is_fenced_out_and_lands_nothing_after_it_thaws,
    procs.test_steer_approve_deny_and_cancel_from_a_process_that_does_not_own_the_run,
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__.removeprefix("test_"))
def test_processes_on_postgres(
    case: Callable[..., None], pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg_store(pg_schema).close()  # the schema exists before the processes race to open it

    def epochs(work: Path, run_id: str) -> list[tuple[Any, ...]]:
        del work
        return admin(
            f"SELECT revision, epoch FROM {pg_schema}.revisions WHERE run_id=%s ORDER BY revision",
            (run_id,),
        )

    monkeypatch.setattr(procs, "store_arg", lambda work: f"pg:{pg_schema}")
    monkeypatch.setattr(procs, "open_store", lambda work: pg_store(pg_schema))
    monkeypatch.setattr(procs, "revision_epochs", epochs)
    case(**dict.fromkeys(inspect.signature(case).parameters, tmp_path))
    assert admin(f"SELECT count(*) FROM {pg_schema}.runs")[0][0] > 0  # it ran on PostgreSQL
