"""Connection chaos and store faults on PostgreSQL: every backend terminated mid-run
(`pg_terminate_backend`), again and again, and the server restarted mid-run. Runs go on (a
dropped connection is a reconnect and a retry inside the store), no psycopg error reaches a
run or a caller, and nothing is lost or duplicated: every run finishes with its whole
transcript, every message sent (from the owner's runtime and from another one) is delivered
exactly once. And the server down past `write_timeout`: the write is given up
(`store_unavailable`), never said stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, tool
from steerable.actors.testing import ScriptedAgent, call, plan
from steerable.protocol import (
    AskUser,
    ErrorCode,
    Finish,
    RunState,
    RunView,
    SteerableError,
    ToolResult,
    UserMessage,
)

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.pg_kit import (
        pg_store,
        restart_server,
        start_server_again,
        stop_server,
        terminate_backends,
    )
    from tests.test_stores import message, snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import pg_store, restart_server, start_server_again, stop_server, terminate_backends
    from test_stores import message, snapshot

WAIT = 90.0  # fail-instead-of-hang bound
STEPS = 12
RUNS = 3
MIDWAY = STEPS // 2

_midway = threading.Event()  # a run's tool reached step MIDWAY
_go_on = threading.Event()  # the first hit is done: the held steps go on


@tool
def step(i: int) -> int:
    """One quick tool step; step MIDWAY holds until the chaos hit once (so it hits mid-run)."""
    if i == MIDWAY:
        _midway.set()
        _go_on.wait(WAIT)
    return i


def _messages(view: RunView) -> list[str]:
    return [e.content for e in view.transcript if isinstance(e, UserMessage)]


def chaos_agent(wanted: int) -> ScriptedAgent:
    """STEPS one-call plans, then asks until `wanted` messages arrived; finishes with them."""
    return ScriptedAgent(
        [plan(call("step", i=k)) for k in range(STEPS)],
        then=lambda view: (
            Finish(output=sorted(_messages(view)))
            if len(_messages(view)) >= wanted
            else AskUser(question="more?")
        ),
        name="chaos",
    )


def _run_with_chaos(schema: str, hit: Callable[[], Any], times: int, every: float) -> list[Any]:
    """Runs under `times` hits, the first while a run holds its step MIDWAY (held until the hit
    is done: no run can end before it), the others `every` seconds apart; what each returned."""
    hits: list[Any] = []
    _midway.clear()
    _go_on.clear()

    def chaos(stop: threading.Event) -> None:
        try:
            if not _midway.wait(WAIT):
                return
            hits.append(hit())
        finally:
            _go_on.set()
        for _ in range(times - 1):
            if stop.wait(every):
                return
            hits.append(hit())

    per_run = 6  # messages per run: half from the owner's runtime, half from another one
    stores = [pg_store(schema, write_timeout=60.0) for _ in range(2)]
    stop = threading.Event()
    failures: list[BaseException] = []
    with (
        Runtime(store=stores[0], tools=[step], lease_ttl=30.0) as owner,
        Runtime(store=stores[1], tools=[step], lease_ttl=30.0) as other,
    ):
        handles = [owner.start(f"t{i}", agent=chaos_agent(per_run)) for i in range(RUNS)]

        def senders() -> None:
            try:
                for k in range(per_run // 2):
                    for h in handles:
                        h.send(f"local {k}")
                        seq = other.send(h.run_id, f"remote {k}", message_id=f"{h.run_id}-{k}")
                        # A client retrying the same request: still one message.
                        assert (
                            other.send(h.run_id, f"remote {k}", message_id=f"{h.run_id}-{k}") == seq
                        )
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        sender = threading.Thread(target=senders)
        killer = threading.Thread(target=chaos, args=(stop,))
        killer.start()
        sender.start()
        sender.join(WAIT)
        outcomes = [h.result(WAIT) for h in handles]
        stop.set()
        killer.join(WAIT)
    assert not failures, failures
    expected = sorted([f"local {k}" for k in range(3)] + [f"remote {k}" for k in range(3)])
    for outcome in outcomes:
        assert outcome.state is RunState.FINISHED, outcome.errors
        assert outcome.output == expected  # each message exactly once
    check = pg_store(schema)
    try:
        for handle in handles:
            stored = check.load(handle.run_id)
            assert stored.snapshot.state is RunState.FINISHED
            results = [e for e in stored.transcript if isinstance(e, ToolResult)]
            assert [r.value for r in results] == list(range(STEPS))  # no step lost or doubled
            delivered = sorted(e.content for e in stored.transcript if isinstance(e, UserMessage))
            assert delivered == expected
    finally:
        check.close()
    for store in stores:
        assert store.statistics()["writes_given_up"] == 0
    return hits


def test_every_backend_terminated_again_and_again_loses_nothing(pg_schema: str) -> None:
    # Every connection of every store, the listeners', the pools'.
    killed = _run_with_chaos(pg_schema, terminate_backends, times=10, every=0.1)
    assert killed[0] > 0  # the first hit, mid-run, did hit live connections


def _restart() -> bool:
    restart_server()
    return True


def test_a_server_restart_mid_run_loses_nothing(pg_schema: str) -> None:
    restarts = _run_with_chaos(pg_schema, _restart, times=2, every=0.3)
    assert restarts[0]  # the first restart came with the runs mid-way


def test_a_server_down_past_write_timeout_is_store_unavailable_and_nothing_is_said_stored(
    pg_schema: str,
) -> None:
    """docs/reliability.md, "Store faults", on PostgreSQL: a write given up is never reported
    stored; the store keeps the last good revision; once the server is back it writes again."""
    store = pg_store(pg_schema, write_timeout=0.5)
    stored: list[int] = []
    failed: list[Any] = []
    try:
        store.write_checkpoint(
            "r", 0, snapshot("r", 0, transcript_len=0), 0, [], lambda: stored.append(0)
        )
        store.flush()
        stop_server()
        try:
            store.write_checkpoint(
                "r", 1, snapshot("r", 1, transcript_len=0), 0, [],
                lambda: stored.append(1), on_failed=failed.append,
            )  # fmt: skip
            store.flush()
            assert [e.code for e in failed] == [ErrorCode.STORE_UNAVAILABLE]
            with pytest.raises(SteerableError) as info:
                store.append_message("r", message(0))
            assert info.value.code is ErrorCode.STORE_UNAVAILABLE
        finally:
            start_server_again()
        assert stored == [0]  # revision 1 was never said stored
        assert store.load("r").snapshot.revision == 0  # the last good revision, whole
        # A revision on top of one that was given up is refused, never stored with a hole.
        store.write_checkpoint(
            "r", 2, snapshot("r", 2, transcript_len=0), 0, [],
            lambda: stored.append(2), on_failed=failed.append,
        )  # fmt: skip
        store.flush()
        assert stored == [0]
        assert len(failed) == 2
        store.append_message("r", message(0))  # the server is back: writes land again
        assert [m.seq for m in store.load("r").messages] == [0]
        assert store.statistics()["writes_given_up"] >= 1
    finally:
        store.close()
