"""The ownership tests of tests/test_ownership.py that open `SqliteStore` objects on one file
(two runtimes, two store objects, as two hosts would), run unchanged on PostgreSQL.

Each case is the same function, called with the module's `SqliteStore` name pointing at a
factory of `PostgresStore` objects on one fresh schema of the test server (tests/pg_kit.py):
every store object the test opens "on the file" is a store object on that schema, so what the
test asserts is exactly what it asserts on SQLite.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    import tests.test_ownership as own
    from tests.pg_kit import pg_store
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    import test_ownership as own
    from pg_kit import pg_store

CASES: list[Callable[..., None]] = [
    own.test_a_write_with_an_old_epoch_is_refused_and_reported,
    own.test_a_zombies_events_alone_are_refused_and_reported,
    own.test_a_zombies_send_is_refused_and_replaces_no_message_of_the_new_owner,
    own.test_a_zombie_takes_no_operation_and_refuses_none,
    own.test_adopting_stores_never_claim_the_same_run_twice,
    own.test_resume_of_a_run_a_live_runtime_holds_is_refused_with_run_owned,
    own.test_a_fenced_out_run_stops_at_once_and_the_new_owner_finishes_it,
    own.test_shutdown_releases_leases_so_another_runtime_resumes_at_once,
    own.test_adopt_orphans_resumes_released_runs_of_registered_agents,
    own.test_send_cancel_and_state_reach_a_run_another_runtime_owns,
    own.test_approve_and_deny_reach_a_run_another_runtime_owns,
    own.test_a_message_to_a_run_nobody_holds_is_delivered_when_it_is_resumed,
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__.removeprefix("test_"))
def test_ownership_on_postgres(
    case: Callable[..., None],
    pg_schema: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[Any] = []

    def open_store(path: Any, **kwargs: Any) -> Any:
        del path, kwargs  # one schema stands for the file
        opened.append(pg_store(pg_schema))
        return opened[-1]

    monkeypatch.setattr(own, "SqliteStore", open_store)
    given: dict[str, Any] = {"tmp_path": tmp_path, "caplog": caplog}
    params = inspect.signature(case).parameters
    if "zombie" in params:  # the fixture, on PostgreSQL stores (SqliteStore is patched)
        given["zombie"] = own.Zombie(tmp_path / "runs.db")
    try:
        case(**{name: given[name] for name in params})
    finally:
        if "zombie" in given:
            given["zombie"].close()
    assert len(opened) >= 2  # the case ran on PostgreSQL stores (two hosts at least)
