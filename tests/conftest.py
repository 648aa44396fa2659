"""Shared fixtures: every test must leave no steerable thread and no steerable actor behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pykka
import pytest
import structlog

# Thread-name prefixes of everything steerable starts (docs/architecture.md).
STEERABLE_THREAD_PREFIXES = ("steerable-", "RunSupervisor-", "ToolWorker-")


def _steerable_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(STEERABLE_THREAD_PREFIXES)}


@pytest.fixture(autouse=True)
def no_thread_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a steerable thread or actor alive (abandoned workers excepted).

    A test that deliberately abandons a hung worker marks itself `allow_abandoned` and
    releases the tool before it ends, so the abandoned thread exits.
    """
    before = _steerable_threads()
    yield
    leaked = {t for t in _steerable_threads() - before if t.is_alive()}
    for t in leaked:
        t.join(timeout=5.0)
    leaked = {t for t in leaked if t.is_alive()}
    assert not leaked, f"steerable threads left alive: {sorted(t.name for t in leaked)}"
    actors = [
        ref
        for ref in pykka.ActorRegistry.get_all()
        if type(ref.actor_class).__module__.startswith("steerable")
        or ref.actor_class.__module__.startswith("steerable")
    ]
    assert not actors, f"steerable actors left registered: {actors}"


@pytest.fixture(autouse=True)
def structlog_as_a_fresh_process() -> Iterator[None]:
    """Leave structlog unconfigured after each test, as a host that never set it up.

    `structlog.testing.capture_logs` marks structlog configured, and a configured structlog
    with its default logger prints to stdout: a later test's debug records would then appear
    on the suite's output although steerable, in a fresh process, is quiet.
    """
    yield
    structlog.reset_defaults()


if TYPE_CHECKING:  # mypy resolves the kit as tests.pg_kit (explicit package bases)
    from tests.pg_kit import pg_schema
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import pg_schema

__all__ = ["no_thread_leaks", "pg_schema"]
