"""Run ownership (docs/durability.md, "Ownership"): leases, epochs, fencing, adoption, in process.

The store contract runs against both stores; the takeover tests use two `SqliteStore` objects
on one file (as two processes would: fencing is per store object). The multi-process harness
is tests/test_ownership_processes.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import CheckpointStore, MemoryStore, Runtime, SqliteStore, tool
from steerable.actors._host.leases import LeaseKeeper
from steerable.actors._stores.lease import Owner
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    RunEvent,
    RunState,
    SteerableError,
    ToolResult,
    UserMessage,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.test_stores (explicit package bases)
    from tests.test_stores import make_store, snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from test_stores import make_store, snapshot

WAIT = 10.0


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    made.close()


def until_expired(store: CheckpointStore, run_id: str) -> None:
    """Wait until the stored lease of `run_id` has expired on the store's clock.

    The wait is the lease's own remaining time (read from the store), not a guess.
    """
    lease = store.lease(run_id)
    assert lease is not None
    clock = time.monotonic if isinstance(store, MemoryStore) else time.time  # durable: the
    # machine's clock (SQLite), or the database server's, here on the same machine (PostgreSQL)
    remaining = lease.expires_at - clock()
    if remaining > 0:
        threading.Event().wait(remaining + 0.01)
    assert (store.lease(run_id) or lease).expires_at <= clock()


def stored_run(store: CheckpointStore, run_id: str, state: RunState = RunState.RUNNING) -> None:
    store.write_checkpoint(run_id, 0, snapshot(run_id, 0, transcript_len=0, state=state), 0, [])
    store.flush()


# ---------------------------------------------------------------------- the store contract


def test_claims_count_epochs_and_refuse_a_live_owner(store: CheckpointStore) -> None:
    a, b = Owner.new(), Owner.new()
    stored_run(store, "r")
    first = store.claim("r", a, 30.0)
    assert first.epoch == 1
    with pytest.raises(SteerableError) as info:
        store.claim("r", b, 30.0)
    assert info.value.code is ErrorCode.RUN_OWNED
    assert info.value.error.details["owner"]["pid"] == a.pid
    assert 0 < info.value.error.details["expires_in"] <= 30.0
    assert store.claim("r", a, 30.0).epoch == 2  # an owner may claim again (resume here)
    assert store.lease("r") is not None
    with pytest.raises(SteerableError) as missing:
        store.claim("nope", a, 1.0)
    assert missing.value.code is ErrorCode.NOT_FOUND


def test_an_expired_lease_is_taken_over_and_the_old_owner_loses_it(
    store: CheckpointStore,
) -> None:
    a, b = Owner.new(), Owner.new()
    stored_run(store, "r")
    store.claim("r", a, 0.2)
    assert store.renew(a, ["r"], 0.2) == set()
    until_expired(store, "r")
    taken = store.claim("r", b, 30.0)
    assert taken.epoch == 2
    assert taken.owner == b
    # b's claim is on the same store object here: only b's renewal holds it now.
    assert store.renew(b, ["r"], 30.0) == set()


def test_a_write_with_an_old_epoch_is_refused_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    first, second = SqliteStore(path), SqliteStore(path)
    fenced: list[str] = []
    first.add_fence_listener(fenced.append)
    stored: list[int] = []
    try:
        a, b = Owner.new(), Owner.new()
        stored_run(first, "r")
        first.claim("r", a, 0.2)
        until_expired(first, "r")
        second.claim("r", b, 30.0)
        first.write_checkpoint(
            "r", 1, snapshot("r", 1, transcript_len=0), 0, [], lambda: stored.append(1)
        )
        first.journal("r", ToolResult(call_id="c", tool="t", ok=True, value="zombie"))
        first.flush()
        assert fenced == ["r"]  # once per batch, then the store no longer writes for it
        assert stored == []  # on_stored never says a refused write was stored
        assert [r.revision for r in second.revisions("r")] == [0]
        assert second.load("r").journal == {}
        assert first.renew(a, ["r"], 1.0) == {"r"}
        assert second.renew(b, ["r"], 30.0) == set()
    finally:
        first.close()
        second.close()


class Zombie:
    """Two store objects on one file, as two hosts: `first` owns run "r" (a short lease) until
    `take_over()`, after which `second` owns it and `first` is a zombie. `fenced` is what
    `first`'s fence listeners were told."""

    def __init__(self, path: Path) -> None:
        self.first, self.second = SqliteStore(path), SqliteStore(path)
        self.fenced: list[str] = []
        self.first.add_fence_listener(self.fenced.append)
        stored_run(self.first, "r")
        self.first.claim("r", Owner.new(), 0.2)

    def take_over(self) -> None:
        until_expired(self.first, "r")
        self.second.claim("r", Owner.new(), 30.0)

    def close(self) -> None:
        self.first.close()
        self.second.close()


@pytest.fixture
def zombie(tmp_path: Path) -> Iterator[Zombie]:
    pair = Zombie(tmp_path / "runs.db")
    try:
        yield pair
    finally:
        pair.close()


def test_a_zombies_events_alone_are_refused_and_reported(zombie: Zombie) -> None:
    # A batch that holds only events is fenced as a checkpoint is (on PostgreSQL it is one
    # statement that locks and checks the lease row of each event it stores).
    first, second = zombie.first, zombie.second

    def event(seq: int) -> tuple[int, str, str | None, float, dict[str, Any], str, None]:
        return (seq, EventKind.MESSAGE_ACCEPTED, None, 1.0, {"seq": seq}, "r", None)

    first.append_events("r", "t", [event(0)])
    first.flush()
    assert [e.seq for e in second.events("r")] == [0]  # the owner's events land
    assert zombie.fenced == []
    zombie.take_over()
    first.append_events("r", "t", [event(1), event(2)])
    first.flush()
    assert zombie.fenced == ["r"]
    assert [e.seq for e in second.events("r")] == [0]  # nothing of the zombie's


def test_a_zombies_send_is_refused_and_replaces_no_message_of_the_new_owner(
    zombie: Zombie,
) -> None:
    first, second = zombie.first, zombie.second
    first.append_message("r", UserMessage(seq=0, content="the owner's", at=0.0))
    assert zombie.fenced == []
    zombie.take_over()
    second.append_message("r", UserMessage(seq=1, content="the new owner's", at=1.0))
    with pytest.raises(SteerableError) as refused:
        first.append_message("r", UserMessage(seq=1, content="the zombie's", at=2.0))
    assert refused.value.error.code is ErrorCode.RUN_OWNED
    assert refused.value.error.details["epoch"] == 1
    assert zombie.fenced == ["r"]
    assert second.load("r").messages == [
        UserMessage(seq=0, content="the owner's", at=0.0),
        UserMessage(seq=1, content="the new owner's", at=1.0),
    ]


def test_a_zombie_takes_no_operation_and_refuses_none(zombie: Zombie) -> None:
    # An operation stored by a third process for the run waits for its owner. The zombie
    # (its lease taken over) must neither take it into the inbox at a seq of its own, nor
    # refuse it: either would settle it, and the new owner would never see it.
    first, second = zombie.first, zombie.second
    zombie.take_over()
    op_id, seq = second.submit_op("r", UserMessage(seq=0, content="to the owner", at=0.0))
    assert seq is None  # held by `second`: the operation waits for it
    with pytest.raises(SteerableError) as refused:
        first.settle_op(op_id, "r", UserMessage(seq=0, content="to the owner", at=0.0), None)
    assert refused.value.error.code is ErrorCode.RUN_OWNED
    assert refused.value.error.details["epoch"] == 1
    assert zombie.fenced == ["r"]
    first.settle_op(op_id, "r", None, None)  # a refusal that is not the zombie's to make
    assert second.op_seq(op_id) is None
    assert second.load("r").messages == []
    assert [op for op, *_ in second.open_ops(["r"])] == [op_id]
    second.settle_op(op_id, "r", UserMessage(seq=0, content="to the owner", at=0.0), None)
    assert second.op_seq(op_id) == 0
    assert second.load("r").messages == [UserMessage(seq=0, content="to the owner", at=0.0)]
    # Taken once: settling it again (a second owner's retry, a zombie) is refused.
    with pytest.raises(SteerableError):
        second.settle_op(op_id, "r", UserMessage(seq=1, content="again", at=1.0), None)
    assert second.op_seq(op_id) == 0


def test_release_lets_another_owner_claim_at_once(store: CheckpointStore) -> None:
    a, b = Owner.new(), Owner.new()
    stored_run(store, "r")
    store.claim("r", a, 30.0)
    store.release_lease("r", a)
    store.flush()
    assert store.claim("r", b, 30.0).epoch == 2


def test_claim_orphans_takes_expired_top_level_runs_of_known_agents(
    store: CheckpointStore,
) -> None:
    a, b = Owner.new(), Owner.new()
    stored_run(store, "orphan")
    stored_run(store, "held")
    stored_run(store, "done", RunState.FINISHED)
    store.write_checkpoint(
        "child", 0, snapshot("child", 0, transcript_len=0, parent_run_id="orphan"), 0, []
    )
    store.flush()
    store.claim("held", a, 30.0)
    taken, left = store.claim_orphans(b, 30.0, {"agent"})
    assert [lease.run_id for lease in taken] == ["orphan"]
    assert left == []
    assert taken[0].agent == "agent"
    assert store.claim_orphans(a, 30.0, {"agent"}) == ([], [])
    stored_run(store, "other")
    assert store.claim_orphans(a, 30.0, {"someone-else"}) == ([], [("other", "agent")])


def test_adopting_stores_never_claim_the_same_run_twice(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    seed = SqliteStore(path)
    for i in range(20):
        stored_run(seed, f"r{i:02}")
    seed.close()
    stores = [SqliteStore(path) for _ in range(4)]
    owners = [Owner.new() for _ in stores]
    barrier = threading.Barrier(len(stores))
    claimed: list[list[str]] = [[] for _ in stores]

    def adopt(i: int) -> None:
        barrier.wait(WAIT)
        while True:
            taken, _ = stores[i].claim_orphans(owners[i], 30.0, {"agent"}, limit=3)
            if not taken:
                return
            claimed[i].extend(lease.run_id for lease in taken)

    threads = [threading.Thread(target=adopt, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for s in stores:
        s.close()
    every = [run_id for ids in claimed for run_id in ids]
    assert sorted(every) == [f"r{i:02}" for i in range(20)]


# ---------------------------------------------------------------------- runtimes


class BlockingRenewals:
    """Holds a store's renewals (a frozen renewer) until `thaw()`."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.frozen = threading.Event()
        self.thawed = threading.Event()
        self._renew = store.renew

        def renew(owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
            if self.frozen.is_set():
                self.thawed.wait(WAIT)
            return self._renew(owner, run_ids, ttl)

        store.renew = renew  # type: ignore[method-assign]

    def thaw(self) -> None:
        self.thawed.set()


def two_step_agent(name: str = "worker") -> ScriptedAgent:
    return ScriptedAgent(
        [plan(call("gate", value="one")), plan(call("gate", value="two"))],
        then=Finish(output="done"),
        name=name,
    )


def test_resume_of_a_run_a_live_runtime_holds_is_refused_with_run_owned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    gate = Gate()
    with (
        Runtime(store=SqliteStore(path), tools=[gate.tool()]) as first,
        Runtime(store=SqliteStore(path), tools=[gate.tool()]) as second,
    ):
        handle = first.start("t", agent=two_step_agent())
        gate.wait_started()
        wait_event(handle, EventKind.CHECKPOINT)
        first.store.flush()
        with pytest.raises(SteerableError) as info:
            second.resume(handle.run_id, agent=two_step_agent())
        assert info.value.code is ErrorCode.RUN_OWNED
        assert info.value.error.details["owner"]["instance_id"] == first.owner.instance_id
        gate.release()
        assert handle.result(WAIT).state is RunState.FINISHED


def test_a_fenced_out_run_stops_at_once_and_the_new_owner_finishes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    gate = Gate()
    frozen_store = SqliteStore(path)
    renewals = BlockingRenewals(frozen_store)
    with Runtime(store=frozen_store, tools=[gate.tool()], lease_ttl=0.3) as zombie:
        handle = zombie.start("t", agent=two_step_agent())
        gate.wait_started()
        wait_event(handle, EventKind.CHECKPOINT)
        frozen_store.flush()
        renewals.frozen.set()  # the zombie stops renewing, as a frozen process would
        until_expired(frozen_store, handle.run_id)
        with Runtime(store=SqliteStore(path), tools=[gate.tool()]) as owner:
            adopted = owner.resume(handle.run_id, agent=two_step_agent())
            # The zombie's call returns now: its result must not land, nothing may start.
            gate.release()
            with pytest.raises(SteerableError) as info:
                handle.result(WAIT)
            assert info.value.code is ErrorCode.RUN_OWNED
            assert wait_event(handle, EventKind.LEASE_LOST).data["epoch"] == 1
            outcome = adopted.result(WAIT)
            assert outcome.state is RunState.FINISHED
            renewals.thaw()
    zombie_calls = [c for c in gate.contexts if c.run_id == handle.run_id]
    # The zombie started c1.0 only. The new owner re-ran it (the zombie's result was refused)
    # and its agent planned two more: one c2.0 in all, so the zombie never started its next.
    assert [c.call_id for c in zombie_calls] == ["c1.0", "c1.0", "c2.0", "c3.0"]
    store = SqliteStore(path)
    try:
        lease = store.lease(handle.run_id)
        assert lease is not None
        assert lease.epoch == 2
        assert store.load(handle.run_id).snapshot.state is RunState.FINISHED
    finally:
        store.close()


def test_shutdown_releases_leases_so_another_runtime_resumes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    gate = Gate()
    first = Runtime(store=SqliteStore(path), tools=[gate.tool()], lease_ttl=60.0)
    handle = first.start("t", agent=two_step_agent())
    gate.wait_started()
    wait_event(handle, EventKind.CHECKPOINT)
    gate.release()
    first.shutdown(cancel_runs=False)
    with Runtime(store=SqliteStore(path), tools=[gate.tool()], lease_ttl=60.0) as second:
        outcome = second.resume(handle.run_id, agent=two_step_agent()).result(WAIT)
    assert outcome.state in {RunState.FINISHED}


def test_adopt_orphans_resumes_released_runs_of_registered_agents(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "runs.db"
    gate = Gate()
    first = Runtime(store=SqliteStore(path), tools=[gate.tool()])
    known = first.start("t", agent=two_step_agent("worker"))
    unknown = first.start("t", agent=two_step_agent("stranger"))
    gate.wait_started(2)
    wait_event(known, EventKind.CHECKPOINT)
    wait_event(unknown, EventKind.CHECKPOINT)
    first.shutdown(timeout=1.0, cancel_runs=False)  # parked mid-call: the runs are orphans
    gate.release()  # the abandoned calls return (and the adopter's calls pass at once)
    caplog.set_level(logging.INFO, logger="steerable")
    finished: list[str] = []
    ended = threading.Event()

    def on_finish(event: RunEvent) -> None:
        finished.append(event.run_id)
        ended.set()

    with Runtime(
        store=SqliteStore(path),
        tools=[gate.tool()],
        agents={"worker": two_step_agent("worker")},
        adopt_orphans=True,
        lease_ttl=0.9,
    ) as second:
        second.on("on_finish", on_finish)  # the first adoption pass is ttl / 3 away
        assert ended.wait(WAIT)
        assert finished == [known.run_id]
        assert second.store.load(known.run_id).snapshot.state is RunState.FINISHED
        assert unknown.run_id in second.unfinished()
    assert any(
        "orphan_not_adopted" in r.getMessage() and unknown.run_id in r.getMessage()
        for r in caplog.records
    )


# ---------------------------------------------------------------------- run-addressed operations


def asking_agent(name: str = "asker") -> ScriptedAgent:
    """Asks the user until it was given a message, then finishes with the messages."""
    return ScriptedAgent(
        [],
        then=lambda view: (
            Finish(output=[m.content for m in view.delivered])
            if view.delivered
            else AskUser(question="anything?")
        ),
        name=name,
    )


def test_send_cancel_and_state_reach_a_run_another_runtime_owns(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with (
        Runtime(store=SqliteStore(path)) as owner,
        Runtime(store=SqliteStore(path)) as other,
    ):
        handle = owner.start("t", agent=asking_agent())
        wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
        owner.store.flush()
        assert other.state(handle.run_id) is RunState.WAITING
        sent_at = time.monotonic()
        seq = other.send(handle.run_id, "from elsewhere", message_id="m-1")
        assert other.send(handle.run_id, "from elsewhere", message_id="m-1") == seq  # once
        outcome = other.outcome(handle.run_id, WAIT)
        assert time.monotonic() - sent_at < WAIT
        assert outcome.state is RunState.FINISHED
        assert outcome.output == ["from elsewhere"]
        assert handle.result(WAIT).output == ["from elsewhere"]
        with pytest.raises(SteerableError) as ended:
            other.send(handle.run_id, "too late")
        assert ended.value.code is ErrorCode.RUN_ENDED
        assert other.cancel(handle.run_id, "late") is False
        with pytest.raises(SteerableError) as unknown:
            other.send("run_unknown", "hello")
        assert unknown.value.code is ErrorCode.NOT_FOUND

        second = owner.start("t", agent=asking_agent())
        wait_event(second, EventKind.CHECKPOINT, lambda e: second.state is RunState.WAITING)
        owner.store.flush()
        assert other.cancel(second.run_id, "from elsewhere") is True
        assert second.result(WAIT).state is RunState.CANCELLED


def test_approve_and_deny_reach_a_run_another_runtime_owns(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"

    @tool(requires_approval=True)
    def publish(text: str) -> str:
        return f"published {text}"

    agent = ScriptedAgent(
        [plan(call("publish", text="a"), call("publish", text="b"))],
        then=lambda view: Finish(output=[(r.ok, r.value) for r in view.last_results]),
    )
    with (
        Runtime(store=SqliteStore(path), tools=[publish]) as owner,
        Runtime(store=SqliteStore(path), tools=[publish]) as other,
    ):
        handle = owner.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED, lambda e: e.data["call_id"] == "c1.1")
        wait_event(handle, EventKind.CHECKPOINT, lambda e: len(handle.pending_approvals()) == 2)
        owner.store.flush()
        pending = other.pending_approvals(handle.run_id)
        assert [p.call_id for p in pending] == ["c1.0", "c1.1"]
        assert other.approve(handle.run_id, "c1.0") is True
        assert other.deny(handle.run_id, "c1.1", "no") is True
        assert other.approve(handle.run_id, "nope") is False
        outcome = handle.result(WAIT)
        assert outcome.output[0] == [True, "published a"]
        assert outcome.output[1][0] is False


def test_a_message_to_a_run_nobody_holds_is_delivered_when_it_is_resumed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    first = Runtime(store=SqliteStore(path))
    handle = first.start("t", agent=asking_agent())
    wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
    first.shutdown(cancel_runs=False)  # parked, its lease released
    with Runtime(store=SqliteStore(path)) as sender:
        seq = sender.send(handle.run_id, "while parked")
        assert seq >= 0
    with Runtime(store=SqliteStore(path)) as later:
        outcome = later.resume(handle.run_id, agent=asking_agent()).result(WAIT)
    assert outcome.output == ["while parked"]


def _keeper(store: CheckpointStore, owner: Owner, lost: list[str]) -> LeaseKeeper:
    # A TTL far beyond the test: the keeper's own thread never renews; the test does.
    return LeaseKeeper(store, owner, 600.0, on_lost=lost.append, on_renewed=lambda _r: None)


def test_a_run_whose_last_write_released_its_lease_is_not_reported_lost(
    store: CheckpointStore,
) -> None:
    """The terminal write lands between a renewal pass's look and the store's renewal."""
    owner = Owner.new()
    lost: list[str] = []
    keeper = _keeper(store, owner, lost)
    try:
        cell = SimpleNamespace(run_id="r", epoch=0, lease_deadline=0.0, lease_wait=False)
        keeper.new_run(cell)  # type: ignore[arg-type]
        stored_run(store, "r")
        # The run ends: its terminal write releases the lease; the host forgets it a moment
        # later (after the Stored message), so the keeper still tracks it for this pass.
        store.write_checkpoint(
            "r", 1, snapshot("r", 1, transcript_len=0, state=RunState.FINISHED), 0, []
        )
        store.flush()
        keeper.renew_now()
        assert lost == []
        assert keeper.holds("r")
    finally:
        keeper.stop()


def test_a_run_another_owner_claimed_is_reported_lost_by_renewal(
    store: CheckpointStore,
) -> None:
    a, b = Owner.new(), Owner.new()
    stored_run(store, "r")
    lost: list[str] = []
    keeper = _keeper(store, a, lost)
    try:
        cell = SimpleNamespace(run_id="r", epoch=0, lease_deadline=0.0, lease_wait=False)
        lease = store.claim("r", a, 0.2)
        keeper.claimed(cell, lease, time.monotonic())  # type: ignore[arg-type]
        until_expired(store, "r")
        store.claim("r", b, 30.0)
        keeper.renew_now()
        assert lost == ["r"]
        assert not keeper.holds("r")
    finally:
        keeper.stop()
