"""Passivation (docs/requirements.md "Passivation"): a run that waits for a person (AskUser or an
approval) is checkpointed and its supervisor stopped, so it holds no actor and no thread; its
next message (a user message, an approval or denial, a cancel, or its own deadline) wakes it
from the checkpoint, and the host sees one uninterrupted run.

Passivation happens on the dispatcher thread right after the run's waiting checkpoint; tests
wait for it with `until()` (a bounded condition wait on the runtime's statistics).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import (
    CheckpointStore,
    ManualClock,
    MemoryStore,
    Runtime,
    SqliteStore,
    Tool,
    tool,
)
from steerable.actors.testing import ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    RunConfig,
    RunEvent,
    RunState,
    RunView,
    ToolResult,
    UserMessage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait until `predicate()` holds (checked every few ms); fail after `timeout` seconds."""
    tick = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        tick.wait(0.005)
    raise AssertionError(f"condition never held within {timeout}s")


def passivated(rt: Runtime, count: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        stats = rt.statistics()
        return stats["runs_passivated"] == count and stats["runs_active"] == 0

    return check


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """Passivation works on any store; the runtime closes it on shutdown."""
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "runs.db")


class Payments:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paid: list[str] = []
        payments = self

        @tool(side_effect="write", requires_approval=True)
        def pay(amount: int) -> str:
            with payments.lock:
                payments.paid.append(str(amount))
            return f"paid {amount}"

        self.tool: Tool[Any, Any] = pay


def test_a_run_waiting_on_ask_user_holds_no_supervisor_and_wakes_on_send(
    store: CheckpointStore,
) -> None:
    agent = ScriptedAgent([AskUser(question="which colour?")], then=Finish(output="ok"))
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        stats = rt.statistics()
        assert stats["actors_live"] == 0
        assert stats["runs_woken"] == 0
        assert handle.state is RunState.WAITING  # the host's view is unchanged
        assert rt.handle(handle.run_id).run_id == handle.run_id  # still a live run
        assert handle.send("blue") == 0
        outcome = handle.result(timeout=WAIT)
        stats = rt.statistics()
    assert outcome.state is RunState.FINISHED
    assert stats["runs_woken"] == 1
    assert stats["runs_passivated"] == 0
    assert agent.calls == 2
    assert [(m.seq, m.content) for m in agent.views[1].delivered] == [(0, "blue")]
    users = [m.content for m in agent.views[1].transcript if isinstance(m, UserMessage)]
    assert users == ["blue"]


def test_a_parked_run_sees_a_second_ask_and_parks_again(store: CheckpointStore) -> None:
    agent = ScriptedAgent(
        [AskUser(question="one?"), AskUser(question="two?")], then=Finish(output="ok")
    )
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        handle.send("first")
        until(lambda: agent.calls == 2)
        until(lambda: handle.state is RunState.WAITING and passivated(rt)())
        handle.send("second")
        outcome = handle.result(timeout=WAIT)
        woken = rt.statistics()["runs_woken"]
    assert outcome.state is RunState.FINISHED
    assert woken == 2
    users = [(m.seq, m.content) for m in agent.views[2].transcript if isinstance(m, UserMessage)]
    assert users == [(0, "first"), (1, "second")]


@pytest.mark.parametrize("approved", [True, False])
def test_a_run_parked_on_an_approval_wakes_on_approve_and_on_deny(
    store: CheckpointStore, approved: bool
) -> None:
    payments = Payments()
    agent = ScriptedAgent([plan(call("pay", amount=5))], then=Finish(output="ok"))
    with Runtime(store=store, tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        until(passivated(rt))
        (request,) = handle.pending_approvals()  # still pending while passivated
        settled = (
            handle.approve(request.call_id)
            if approved
            else handle.deny(request.call_id, reason="too much")
        )
        assert settled is True
        outcome = handle.result(timeout=WAIT)
        woken = rt.statistics()["runs_woken"]
    assert outcome.state is RunState.FINISHED
    assert woken == 1
    (result,) = [r for r in agent.views[1].transcript if isinstance(r, ToolResult)]
    if approved:
        assert payments.paid == ["5"]
        assert result.ok
    else:
        assert payments.paid == []
        assert result.error is not None
        assert result.error.code is ErrorCode.APPROVAL_DENIED


def test_cancel_wakes_a_parked_run_and_cancels_it(store: CheckpointStore) -> None:
    agent = ScriptedAgent([AskUser(question="?")])
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        assert handle.cancel("user left") is True
        outcome = handle.result(timeout=WAIT)
        assert handle.cancel("again") is False
        stats = rt.statistics()
    assert outcome.state is RunState.CANCELLED
    assert stats["runs_passivated"] == 0
    assert stats["runs_ended"] == 1
    assert agent.calls == 1


def _collect(handle: Any) -> tuple[threading.Thread, list[RunEvent]]:
    seen: list[RunEvent] = []

    def consume() -> None:
        seen.extend(handle.events(timeout=WAIT))

    consumer = threading.Thread(target=consume, name="event-consumer")
    consumer.start()
    return consumer, seen


def test_the_event_stream_continues_across_passivation(store: CheckpointStore) -> None:
    payments = Payments()
    agent = ScriptedAgent(
        [AskUser(question="?"), plan(call("pay", amount=1))], then=Finish(output="ok")
    )
    with Runtime(store=store, tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        consumer, seen = _collect(handle)
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        handle.send("go")
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        until(passivated(rt))
        handle.approve(handle.pending_approvals()[0].call_id)
        outcome = handle.result(timeout=WAIT)
        consumer.join(WAIT)
        assert not consumer.is_alive()  # the stream ended with the run
    assert outcome.state is RunState.FINISHED
    assert [e.seq for e in seen] == list(range(len(seen)))
    kinds = [e.kind for e in seen]
    for kind in (
        EventKind.MESSAGE_ACCEPTED,
        EventKind.MESSAGE_DELIVERED,
        EventKind.APPROVAL_SETTLED,
        EventKind.TOOL_FINISHED,
    ):
        assert kind in kinds
    assert kinds[-1] is EventKind.RUN_ENDED
    assert seen == list(handle.events())  # a late reader sees the same stream


def test_a_wake_announces_nothing_new(store: CheckpointStore) -> None:
    # Waking a passivated run is invisible to the host: no second run_started, no second
    # approval_requested for a call that was already announced (_persist.resume(wake=True)).
    payments = Payments()
    agent = ScriptedAgent(
        [AskUser(question="?"), plan(call("pay", amount=1))], then=Finish(output="ok")
    )
    with Runtime(store=store, tools=[payments.tool]) as rt:
        handle = rt.start("t", agent=agent)
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        handle.send("go")
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        until(passivated(rt))
        handle.approve(handle.pending_approvals()[0].call_id)
        handle.result(timeout=WAIT)
        kinds = [e.kind for e in handle.events()]
    assert kinds.count(EventKind.RUN_STARTED) == 1
    assert kinds.count(EventKind.APPROVAL_REQUESTED) == 1
    assert kinds.count(EventKind.RUN_ENDED) == 1


def _spy_reloads(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every `store.reload(run_id, held)` as (run_id, len(held)), passed on to the store."""
    calls: list[tuple[str, int]] = []
    reload = store.reload

    def spy(run_id: str, held: Any) -> Any:
        calls.append((run_id, len(held)))
        return reload(run_id, held)

    monkeypatch.setattr(store, "reload", spy)
    return calls


def test_a_wake_reloads_with_the_transcript_the_run_held_when_it_parked(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store need not read the entries the run held (Store.reload); the run sees the same
    # history as one that never left memory.
    reloads = _spy_reloads(store, monkeypatch)
    agent = ScriptedAgent(
        [AskUser(question="one?"), AskUser(question="two?")], then=Finish(output="ok")
    )
    parked = []
    with Runtime(store=store) as rt:
        handle = rt.start("t", agent=agent)
        run_id = handle.run_id
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        parked.append(store.load(run_id).snapshot.transcript_len)
        handle.send("first")
        until(lambda: agent.calls == 2)
        until(lambda: handle.state is RunState.WAITING and passivated(rt)())
        parked.append(store.load(run_id).snapshot.transcript_len)
        handle.send("second")
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
    assert reloads == [(run_id, parked[0]), (run_id, parked[1])]
    again = ScriptedAgent(
        [AskUser(question="one?"), AskUser(question="two?")], then=Finish(output="ok")
    )
    with Runtime(passivate=False) as rt:
        handle = rt.start("t", agent=again)
        wait_state(handle, RunState.WAITING)
        handle.send("first")
        until(lambda: again.calls == 2 and handle.state is RunState.WAITING)
        handle.send("second")
        handle.result(timeout=WAIT)

    def history(view: RunView) -> list[str]:
        return [
            e.content if isinstance(e, UserMessage) else type(e).__name__ for e in view.transcript
        ]

    assert [history(v) for v in agent.views] == [history(v) for v in again.views]
    assert history(agent.views[2])[-3:] == ["first", "DecisionEntry", "second"]


def test_only_the_most_recently_parked_runs_keep_their_transcript(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bound on what passivated runs hold: an older one wakes from the store alone.
    from steerable.actors._host import directory

    monkeypatch.setattr(directory, "WARM_RUNS", 1)
    reloads = _spy_reloads(store, monkeypatch)
    with Runtime(store=store) as rt:
        first = rt.start("a", agent=AskThenEcho())
        until(passivated(rt))
        second = rt.start("b", agent=AskThenEcho())
        until(passivated(rt, 2))
        first.send("one")
        second.send("two")
        assert first.result(timeout=WAIT).output == "one"
        assert second.result(timeout=WAIT).output == "two"
    assert [run_id for run_id, _ in reloads] == [second.run_id]


class AskThenEcho:
    """Asks once, then finishes with the answer it got (one agent for many runs)."""

    name = "echo"

    def decide(self, view: RunView) -> Any:
        answers = [m.content for m in view.transcript if isinstance(m, UserMessage)]
        if not answers:
            return AskUser(question="?")
        return Finish(output=answers[0])


def test_two_thousand_parked_runs_keep_the_thread_count_flat(tmp_path: Path) -> None:
    runs = 2_000
    with Runtime(store=SqliteStore(tmp_path / "runs.db"), max_workers=4, prestart_workers=4) as rt:
        warm = rt.start("warm-up", agent=AskThenEcho())
        wait_state(warm, RunState.WAITING)
        # Passivated once its waiting checkpoint is committed (not as soon as it waits).
        until(passivated(rt, 1))
        warm.send("w")
        assert warm.result(timeout=WAIT).output == "w"
        before = threading.active_count()
        handles = [rt.start(f"task {i}", agent=AskThenEcho()) for i in range(runs)]
        until(passivated(rt, runs), timeout=60.0)
        # The warm-up run's supervisor stops with a message queued after its last one (and
        # after its pending hooks): it may still count for a moment.
        until(lambda: rt.statistics()["actors_live"] == 0)
        assert threading.active_count() <= before  # 2,000 waiting runs, no thread among them
        for i, handle in enumerate(handles):
            handle.send(f"answer {i}")
        outcomes = [h.result(timeout=60.0) for h in handles]
        after = threading.active_count()
        stats = rt.statistics()
    assert after <= before
    assert [o.state for o in outcomes] == [RunState.FINISHED] * runs
    assert [o.output for o in outcomes] == [f"answer {i}" for i in range(runs)]
    assert stats["runs_woken"] == runs + 1
    assert stats["runs_passivated"] == 0


def test_a_parked_run_is_woken_by_its_deadline_and_ends_in_timeout() -> None:
    clock = ManualClock()
    agent = ScriptedAgent([AskUser(question="?")])
    with Runtime(clock=clock) as rt:
        handle = rt.start("t", agent=agent, config=RunConfig(total_timeout=30.0))
        wait_state(handle, RunState.WAITING)
        until(passivated(rt))
        clock.advance(10.0)
        assert rt.services.timer.wait_idle()
        assert not handle.done()  # not yet due
        clock.advance(25.0)
        assert rt.services.timer.wait_idle()
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.ERROR
    assert [e.code for e in outcome.errors] == [ErrorCode.TIMEOUT]
    assert agent.calls == 1


def test_a_call_approved_after_a_wake_gets_its_validated_arguments(
    store: CheckpointStore,
) -> None:
    # Arguments are validated from the annotations when the plan is made; the tool must get
    # the same validated values whether or not the run was passivated in between.
    received: list[object] = []

    @tool(side_effect="write", requires_approval=True)
    def book(when: datetime.date) -> str:
        received.append(when)
        return "booked"

    agent = ScriptedAgent([plan(call("book", when="2026-01-02"))], then=Finish(output="ok"))
    with Runtime(store=store, tools=[book]) as rt:
        handle = rt.start("t", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        until(passivated(rt))
        assert handle.approve(handle.pending_approvals()[0].call_id)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert received == [datetime.date(2026, 1, 2)]
