"""Stored events (docs/durability.md, "Stored events") and `message_id` for a run that lives here.

The store contract runs on both stores; the runtime tests replay a run's events from the store
after it ended, continue a resumed run's seqs, and follow a run another runtime owns (two
`SqliteStore` objects on one file, as two processes have) with `for` and `async for`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import CheckpointStore, MemoryStore, Runtime, SqliteStore, tool
from steerable.actors._host.events import EventLog, _History
from steerable.actors._stores.events import EventRecord
from steerable.actors._stores.lease import Lease, Owner
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    Phase,
    Plan,
    RunEvent,
    RunState,
    SteerableError,
    SubagentCall,
)

if TYPE_CHECKING:
    from tests.test_ownership import asking_agent, stored_run, until_expired
else:
    from test_ownership import asking_agent, stored_run, until_expired

WAIT = 10.0


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made: CheckpointStore = (
        MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "runs.db")
    )
    yield made
    made.close()


@tool(side_effect="write", requires_approval=True)
def charge(items: list[int]) -> int:
    return sum(items)


def record(seq: int, kind: EventKind = EventKind.STATE_CHANGED, **data: Any) -> EventRecord:
    return (seq, kind, Phase.REASON, 1000.0 + seq, data, "r", None)


# ---------------------------------------------------------------------- the store contract


def test_events_are_stored_read_from_a_seq_and_trimmed_to_the_retention(
    store: CheckpointStore,
) -> None:
    assert store.stores_events
    stored_run(store, "r")
    assert store.events("r") == []
    assert store.next_event_seq("r") == 0
    store.append_events("r", "t" * 32, [record(0, step=0), record(1, step=1)])
    store.append_events("r", "t" * 32, [record(2, EventKind.RUN_ENDED, state="finished")])
    events = store.events("r")
    assert [(e.seq, e.kind, e.at, e.data) for e in events] == [
        (0, EventKind.STATE_CHANGED, 1000.0, {"step": 0}),
        (1, EventKind.STATE_CHANGED, 1001.0, {"step": 1}),
        (2, EventKind.RUN_ENDED, 1002.0, {"state": "finished"}),
    ]
    assert all(e.trace_id == "t" * 32 and e.phase is Phase.REASON for e in events)
    assert [e.seq for e in store.events("r", start=1)] == [1, 2]
    assert [e.seq for e in store.events("r", start=1, limit=1)] == [1]
    assert store.next_event_seq("r") == 3
    store.append_events("r", "t" * 32, [record(2, EventKind.RUN_ENDED, state="again")])
    assert store.events("r", start=2)[0].data == {"state": "again"}  # idempotent per seq
    store.event_retention = 3
    store.append_events("r", "t" * 32, [record(3), record(4)])
    assert [e.seq for e in store.events("r")] == [2, 3, 4]
    assert store.next_event_seq("r") == 5
    with pytest.raises(SteerableError) as missing:
        store.events("nope")
    assert missing.value.code is ErrorCode.NOT_FOUND


def test_a_seq_stored_again_replaces_the_tail_across_batches_and_retention_counts_events(
    store: CheckpointStore,
) -> None:
    stored_run(store, "r")
    store.append_events("r", "t" * 32, [record(0), record(1), record(2, step=2)])
    store.append_events("r", "t" * 32, [record(3), record(5)])  # seqs may have gaps
    store.append_events("r", "t" * 32, [record(2, step=20), record(3), record(5, step=50)])
    assert [(e.seq, e.data) for e in store.events("r")] == [
        (0, {}),
        (1, {}),
        (2, {"step": 20}),
        (3, {}),
        (5, {"step": 50}),
    ]
    assert store.next_event_seq("r") == 6
    store.event_retention = 2
    store.append_events("r", "t" * 32, [record(7), record(9)])
    store.append_events("r", "t" * 32, [record(10)])
    assert [e.seq for e in store.events("r")] == [9, 10]  # the last two events, not seqs
    assert [e.seq for e in store.events("r", start=10)] == [10]
    assert store.next_event_seq("r") == 11


def test_stored_event_data_reads_back_as_a_durable_store_returns_it(
    store: CheckpointStore,
) -> None:
    """What `events()` returns is the stored value: tuples read back as lists on every store."""
    stored_run(store, "r")
    data: dict[str, Any] = {"items": (1, "two"), "nested": {"deep": [True, None, 1.5]}}
    store.append_events("r", "t" * 32, [(0, EventKind.CUSTOM, None, 1.0, data, "r", None)])
    (event,) = store.events("r")
    assert event.data == {"items": [1, "two"], "nested": {"deep": [True, None, 1.5]}}


def test_an_event_msgpack_cannot_carry_is_left_out_and_the_rest_of_its_batch_is_kept(
    store: CheckpointStore,
) -> None:
    stored_run(store, "r")
    odd = {"value": object()}  # not JSON-like: the codec refuses it
    store.append_events(
        "r", "t" * 32, [record(0), (1, EventKind.CUSTOM, None, 1.0, odd, "r", None), record(2)]
    )
    assert [e.seq for e in store.events("r")] == [0, 2]


class History:
    """A closed stream's last events, as `EventLog` hands them over (`EventHistory`)."""

    def __init__(self, records: list[EventRecord]) -> None:
        self._records = records
        self.first = records[0][0]
        self.last = records[-1][0]
        self.read = 0

    def __len__(self) -> int:
        return self.last - self.first + 1

    def records(self) -> list[EventRecord]:
        self.read += 1
        return list(self._records)


def test_a_history_reads_as_appended_events_and_counts_toward_the_retention(
    store: CheckpointStore,
) -> None:
    stored_run(store, "r")
    store.append_events("r", "t" * 32, [record(0), record(1)])
    history = History([record(2, step=2), record(3, EventKind.RUN_ENDED, state="finished")])
    store.append_history("r", "t" * 32, history)
    assert [(e.seq, e.kind, e.data) for e in store.events("r")] == [
        (0, EventKind.STATE_CHANGED, {}),
        (1, EventKind.STATE_CHANGED, {}),
        (2, EventKind.STATE_CHANGED, {"step": 2}),
        (3, EventKind.RUN_ENDED, {"state": "finished"}),
    ]
    assert [e.seq for e in store.events("r", start=3)] == [3]
    assert store.next_event_seq("r") == 4
    store.event_retention = 3
    store.append_events("r", "t" * 32, [record(4)])
    assert [e.seq for e in store.events("r")] == [2, 3, 4]  # trimmed by events, a history's too
    store.append_history("r", "t" * 32, History([record(3, step=30), record(4, step=40)]))
    assert [(e.seq, e.data) for e in store.events("r")] == [
        (2, {"step": 2}),
        (3, {"step": 30}),
        (4, {"step": 40}),
    ]  # a history that does not follow the stored tail replaces it, as a batch would


def test_the_memory_store_keeps_a_history_without_reading_it() -> None:
    # Nothing is copied or packed when a run's end hands its log over (docs/performance.md,
    # "Wave 4: session 18"): the records are read when someone reads the events.
    store = MemoryStore()
    stored_run(store, "r")
    history = History([record(0), record(1)])
    store.append_history("r", "t" * 32, history)
    assert history.read == 0
    assert [e.seq for e in store.events("r")] == [0, 1]
    assert history.read == 1


def test_a_logs_last_hand_over_is_kept_and_reads_json_like_before_and_after_it_closes() -> None:
    store = MemoryStore()
    stored_run(store, "r")
    log = EventLog("t" * 32)
    log.store_to(store, "r")
    log.append("r", EventKind.STATE_CHANGED, None, 1.0, {"to": "running"})
    log.append("r", EventKind.TOOL_STARTED, Phase.EXECUTE, 2.0, {"arguments": {"xs": (1, 2)}})
    log.store_pending(final=True)  # as a run's end does, just before its log closes
    (segment,) = store._events["r"]._segments
    assert not isinstance(segment[1], bytes)
    expected = [(0, {"to": "running"}), (1, {"arguments": {"xs": [1, 2]}})]
    assert log._compacted  # its tracked data packed as it was handed over
    assert [(e.seq, e.data) for e in store.events("r")] == expected  # not closed yet
    log.close()
    assert [(e.seq, e.data) for e in store.events("r")] == expected
    log.append("r", EventKind.ERROR, None, 3.0, {"late": True})  # after the hand-over
    assert [(e.seq, e.data) for e in store.events("r")] == expected


def test_a_reader_that_follows_a_kept_log_reads_its_tail_without_the_whole_array(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A live reader (an SSE stream of the run) reads the run's last events after the hand-over
    # packed the log: those are packed one by one, so it never decodes the whole history.
    from steerable.actors._host import events

    store = MemoryStore()
    stored_run(store, "r")
    log = EventLog("t" * 32)
    log.store_to(store, "r")
    for i in range(200):
        log.append("r", EventKind.TOOL_STARTED, Phase.EXECUTE, float(i), {"xs": [i]})
    log.store_pending(final=True)
    decoded: list[int] = []
    real = events._unpack

    def counting(data: bytes) -> Any:
        decoded.append(len(data))
        return real(data)

    monkeypatch.setattr(events, "_unpack", counting)
    assert log._packed is not None
    tail = [raw[4] for raw in log._records(190)]
    assert tail == [{"xs": [i]} for i in range(190, 200)]
    assert len(log._packed) not in decoded  # only the tail's own small blobs
    assert len(decoded) == 10
    assert [raw[4] for raw in log._records(0)] == [{"xs": [i]} for i in range(200)]
    assert len(log._packed) in decoded  # a replay from the start decodes the array once


def test_a_history_read_from_a_log_not_compacted_is_json_like_too() -> None:
    # What `append_history`'s default copies for a store that keeps no history.
    log = EventLog("t" * 32)
    log.append("r", EventKind.TOOL_STARTED, Phase.EXECUTE, 2.0, {"arguments": {"xs": (1, 2)}})
    log.append("r", EventKind.STATE_CHANGED, None, 3.0, {"to": "running"})
    history = _History(log, 0, 1)
    assert not log._compacted
    assert [(r[0], r[4]) for r in history.records()] == [
        (0, {"arguments": {"xs": [1, 2]}}),
        (1, {"to": "running"}),
    ]
    assert len(history) == 2


def test_a_log_with_live_only_events_hands_over_a_filtered_copy() -> None:
    store = MemoryStore()
    stored_run(store, "r")
    log = EventLog("t" * 32)
    log.store_to(store, "r")
    log.append("r", EventKind.MODEL_DELTA, Phase.REASON, 1.0, {"live": True, "text": "he"})
    log.append("r", EventKind.RUN_ENDED, None, 2.0, {"state": "finished"})
    log.store_pending(final=True)
    (segment,) = store._events["r"]._segments
    assert isinstance(segment[1], bytes)  # packed as a batch: the delta is not kept
    assert [e.kind for e in store.events("r")] == [EventKind.RUN_ENDED]


def test_a_fenced_out_store_object_keeps_no_history() -> None:
    store = MemoryStore()
    fenced: list[str] = []
    store.add_fence_listener(fenced.append)
    stored_run(store, "r")
    lease = store.claim("r", Owner.new(), 30.0)
    # Another runtime took the run over: the stored lease is its, a later epoch.
    store._leases.leases["r"] = Lease("r", Owner.new(), lease.epoch + 1, lease.expires_at, "")
    store.append_history("r", "t" * 32, History([record(0)]))
    assert fenced == ["r"]
    assert store.events("r") == []


def test_a_fenced_out_store_object_stores_no_event(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    first, second = SqliteStore(path), SqliteStore(path)
    fenced: list[str] = []
    first.add_fence_listener(fenced.append)
    try:
        a, b = Owner.new(), Owner.new()
        stored_run(first, "r")
        first.claim("r", a, 0.2)
        first.append_events("r", "t" * 32, [record(0)])
        until_expired(first, "r")
        second.claim("r", b, 30.0)
        first.append_events("r", "t" * 32, [record(1, zombie=True)])
        first.flush()
        assert fenced == ["r"]
        assert [e.seq for e in second.events("r")] == [0]
    finally:
        first.close()
        second.close()


# ---------------------------------------------------------------------- the runtime


class Streaming:
    """Streams two deltas, emits one live and one stored custom event, then finishes."""

    name = "streaming"

    def decide(self, view: Any) -> Finish:
        view.call.emit({"text": "he"})
        view.call.emit({"text": "llo"})
        view.call.event("progress", {"pct": 50})  # live only (the default)
        view.call.event("summary", "kept", live=False)
        return Finish(output="hello")


def test_a_finished_runs_events_replay_from_the_store_without_live_only_ones(
    store: CheckpointStore,
) -> None:
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=Streaming())
        live = list(handle.events())
        assert handle.result(WAIT).state is RunState.FINISHED
        assert any(e.kind is EventKind.MODEL_DELTA for e in live)
        kept = [
            e
            for e in live
            if e.kind is not EventKind.MODEL_DELTA and e.data.get("live") is not True
        ]
        stored = store.events(handle.run_id)
        assert [(e.seq, e.kind, e.at, e.data) for e in stored] == [
            (e.seq, e.kind, e.at, e.data) for e in kept
        ]
        assert [e.data["name"] for e in stored if e.kind is EventKind.CUSTOM] == ["summary"]
        assert stored[-1].kind is EventKind.RUN_ENDED
        replayed = list(rt.events(handle.run_id))  # the run no longer lives here
        assert [e.model_dump() for e in replayed] == [e.model_dump() for e in stored]
        assert [e.seq for e in rt.events(handle.run_id, start=stored[3].seq)] == [
            e.seq for e in stored[3:]
        ]

        async def frames() -> list[str]:
            return [f async for f in rt.events(handle.run_id).sse(keepalive=None)]

        sse = asyncio.run(frames())
        assert [f.split("\n")[0] for f in sse] == [f"id: {e.seq}" for e in stored]


def test_a_finished_runs_stored_event_data_is_json_like_before_and_after_compaction(
    store: CheckpointStore,
) -> None:
    # An approval's arguments hold a frozen list (a tuple inside): every store returns it as
    # JSON carries it, the MemoryStore both before its run's log is compacted and after.
    agent = ScriptedAgent([plan(call("charge", items=[1, 2])), Finish(output="done")])
    with Runtime(tools=[charge], store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        handle.approve(handle.pending_approvals()[0].call_id)
        assert handle.result(WAIT).state is RunState.FINISHED
        first = [(e.seq, e.kind, e.data) for e in store.events(handle.run_id)]
        asked = [d for _, kind, d in first if kind is EventKind.APPROVAL_REQUESTED]
        assert asked[0]["arguments"] == {"items": [1, 2]}
        assert type(asked[0]["arguments"]["items"]) is list
        again = ScriptedAgent([Finish(output="again")])
        assert rt.start("t", agent=again).result(WAIT).state is RunState.FINISHED
        assert [(e.seq, e.kind, e.data) for e in store.events(handle.run_id)] == first


def test_a_resumed_runs_seqs_continue_and_its_whole_stream_replays(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    first = Runtime(store=SqliteStore(path))
    handle = first.start("t", agent=asking_agent())
    wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
    first.shutdown(cancel_runs=False)
    before = SqliteStore(path)
    try:
        parked = before.events(handle.run_id)
    finally:
        before.close()
    assert parked
    assert [e.seq for e in parked] == list(range(len(parked)))
    with Runtime(store=SqliteStore(path)) as later:
        resumed = later.resume(handle.run_id, agent=asking_agent())
        stream = later.events(handle.run_id)  # live here: the stored prefix, then live
        resumed.send("hello")
        assert resumed.result(WAIT).state is RunState.FINISHED
        seen = list(stream)
        stored = later.store.events(handle.run_id)
    seqs = [e.seq for e in seen]
    assert seqs == sorted(set(seqs))
    assert seqs[0] == 0
    assert seen[: len(parked)] == parked
    assert seen[len(parked)].seq == len(parked)  # the resumed stream goes on after them
    assert seen[-1].kind is EventKind.RUN_ENDED
    assert [e.seq for e in stored] == seqs


def test_another_runtime_follows_a_runs_events_live_until_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    gate = Gate()
    agent = ScriptedAgent([plan(call("gate", value="one"))], then=Finish(output="done"))
    with (
        Runtime(store=SqliteStore(path), tools=[gate.tool()]) as owner,
        Runtime(store=SqliteStore(path)) as other,
    ):
        handle = owner.start("t", agent=agent)
        gate.wait_started()
        wait_event(handle, EventKind.TOOL_STARTED)
        owner.store.flush()
        seen: list[RunEvent] = []
        started = threading.Event()

        def follow() -> None:
            for event in other.events(handle.run_id, timeout=WAIT):
                seen.append(event)
                if event.kind is EventKind.TOOL_STARTED:
                    started.set()

        follower = threading.Thread(target=follow)
        follower.start()
        assert started.wait(WAIT)  # replayed what was stored before the stream began
        gate.release()  # the rest is followed live
        follower.join(WAIT)
        assert not follower.is_alive()
        assert handle.result(WAIT).state is RunState.FINISHED
        live = [e for e in handle.events() if e.kind is not EventKind.MODEL_DELTA]
    assert seen[-1].kind is EventKind.RUN_ENDED
    assert [(e.seq, e.kind, e.at) for e in seen] == [(e.seq, e.kind, e.at) for e in live]


def test_async_iteration_of_a_run_elsewhere_survives_a_cancelled_wait(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with (
        Runtime(store=SqliteStore(path)) as owner,
        Runtime(store=SqliteStore(path)) as other,
    ):
        handle = owner.start("t", agent=asking_agent())
        wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
        owner.store.flush()

        async def follow() -> list[RunEvent]:
            stream = other.events(handle.run_id)
            out: list[RunEvent] = []
            while True:  # everything stored so far, until the run waits quietly
                try:
                    out.append(await asyncio.wait_for(stream.__anext__(), 0.5))
                except TimeoutError:
                    break
            handle.send("go")  # a cancelled wait lost nothing: the stream goes on
            out.extend([event async for event in stream])
            return out

        seen = asyncio.run(follow())
        assert handle.result(WAIT).state is RunState.FINISHED
    seqs = [e.seq for e in seen]
    assert seqs == list(range(len(seqs)))
    assert seen[-1].kind is EventKind.RUN_ENDED
    assert any(e.kind is EventKind.MESSAGE_DELIVERED for e in seen)


def test_a_child_runs_id_gives_its_own_events_from_its_roots_stream(
    store: CheckpointStore,
) -> None:
    child_agent = ScriptedAgent([], then=Finish(output="child done"), name="helper")
    parent = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="helper", task="sub")])],
        then=Finish(output="parent done"),
        name="lead",
    )
    with Runtime(store=store, agents={"helper": child_agent}) as rt:
        handle = rt.start("t", agent=parent)
        assert handle.result(WAIT).state is RunState.FINISHED
        stored = store.events(handle.run_id)
        child_ids = {e.run_id for e in stored} - {handle.run_id}
        assert len(child_ids) == 1
        (child_id,) = child_ids
        own = list(rt.events(child_id))
    assert own
    assert all(e.run_id == child_id for e in own)
    assert own[-1].kind is EventKind.RUN_ENDED
    assert [e.seq for e in own] == [e.seq for e in stored if e.run_id == child_id]


# ---------------------------------------------------------------------- message_id here


def test_a_message_id_sent_twice_to_a_run_that_lives_here_is_one_message(
    store: CheckpointStore,
) -> None:
    seen: list[str] = []

    def decide(view: Any) -> Finish | AskUser:
        seen.extend(m.content for m in view.delivered)
        return Finish(output=list(seen)) if len(seen) >= 2 else AskUser(question="more?")

    agent = ScriptedAgent([], then=decide)
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.CHECKPOINT, lambda e: handle.state is RunState.WAITING)
        first = handle.send("one", message_id="m-1")
        assert handle.send("one", message_id="m-1") == first
        assert rt.send(handle.run_id, "one", message_id="m-1") == first
        second = rt.send(handle.run_id, "two", message_id="m-2")
        assert second == first + 1
        assert handle.result(WAIT).output == ["one", "two"]
        assert handle.send("one", message_id="m-1") == first  # a retry after the end, too
        if isinstance(store, SqliteStore):
            assert store.message_seq(handle.run_id, "m-2") == second
