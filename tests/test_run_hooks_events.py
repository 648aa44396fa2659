"""Lifecycle hooks (R13), the event stream (R12, R28), asyncio hosts (T10) and runtime metrics.

Hooks fire with the `RunEvent` of their moment, in order, off the supervisor's thread; a hook
that raises is recorded and never breaks the run; a slow hook never stalls cancellation. Events
are typed, ordered, and iterable sync and async without blocking an event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator

import pytest
import structlog

from steerable.actors import Runtime, tool
from steerable.actors.testing import Gate, HookRecorder, ScriptedAgent, call, plan, wait_state
from steerable.protocol import (
    HOOK_EVENTS,
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    HookName,
    Phase,
    RunEvent,
    RunOutcome,
    RunState,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def _hooks(recorder: HookRecorder) -> dict[HookName | str, Callable[[RunEvent], object]]:
    # HookRecorder.hooks() is typed dict[HookName, ...], which mypy refuses for start(hooks=)
    typed: dict[HookName | str, Callable[[RunEvent], object]] = {}
    for name, callback in recorder.hooks().items():
        typed[name] = callback
    return typed


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A cooperative Gate, released when the test ends whatever happened."""
    g = Gate()
    try:
        yield g
    finally:
        g.release()


class ThreadRecorder:
    """Records (hook, event, thread name) for every hook."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[HookName, RunEvent, str]] = []

    def hooks(self) -> dict[HookName | str, Callable[[RunEvent], object]]:
        return {name: self._callback(name) for name in HookName}

    def _callback(self, name: HookName) -> Callable[[RunEvent], None]:
        def record(event: RunEvent) -> None:
            with self.lock:
                self.calls.append((name, event, threading.current_thread().name))

        return record


EXPECTED_PHASES = {
    EventKind.RUN_STARTED: Phase.LOAD,
    EventKind.REASONING_STARTED: Phase.REASON,
    EventKind.REASONING_FINISHED: Phase.REASON,
    EventKind.PLANNING_STARTED: Phase.PLAN,
    EventKind.PLANNING_FINISHED: Phase.PLAN,
    EventKind.EXECUTE_STARTED: Phase.EXECUTE,
    EventKind.EXECUTE_FINISHED: Phase.EXECUTE,
    EventKind.TOOL_STARTED: Phase.EXECUTE,
    EventKind.TOOL_FINISHED: Phase.EXECUTE,
}


# ---------------------------------------------------------------------- hooks


def test_hooks_fire_in_order_with_the_event_of_their_moment_off_the_supervisor() -> None:
    recorder = ThreadRecorder()
    agent = ScriptedAgent([plan(call("echo", text="x")), Finish(output="ok")])
    with Runtime(tools=[echo]) as rt:
        handle = rt.start("t", agent=agent, hooks=recorder.hooks())
        outcome = handle.result(timeout=WAIT)
    # The outcome is published when the run ends; hooks still pending run after it, and
    # shutdown waits for them: on_finish is recorded now.
    calls = list(recorder.calls)
    assert outcome.state is RunState.FINISHED
    assert [name for name, _, _ in calls] == [
        HookName.ON_START,
        HookName.BEFORE_REASONING,
        HookName.AFTER_REASONING,
        HookName.BEFORE_PLANNING,
        HookName.AFTER_PLANNING,
        HookName.BEFORE_EXECUTE,
        HookName.AFTER_EXECUTE,
        HookName.BEFORE_REASONING,
        HookName.AFTER_REASONING,
        HookName.ON_FINISH,
    ]
    seqs = [event.seq for _, event, _ in calls]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    for name, event, thread in calls:
        assert event.hook is name
        assert HOOK_EVENTS[event.kind] is name
        assert event.run_id == handle.run_id
        assert event.trace_id == handle.trace_id
        if event.kind in EXPECTED_PHASES:
            assert event.phase is EXPECTED_PHASES[event.kind]
        assert not thread.startswith(("steerable-dispatch", "RunSupervisor"))
        assert thread != threading.main_thread().name
    on_finish = calls[-1][1]
    assert on_finish.data["state"] == "finished"


def test_a_run_that_waits_for_the_user_starts_once_and_finishes_once() -> None:
    recorder = HookRecorder()
    agent = ScriptedAgent([AskUser(question="?"), Finish(output="ok")])
    with Runtime() as rt:
        handle = rt.start("t", agent=agent, hooks=_hooks(recorder))
        wait_state(handle, RunState.WAITING)
        handle.send("answer")
        outcome = handle.result(timeout=WAIT)
        started = [e for e in handle.events() if e.kind is EventKind.RUN_STARTED]
    assert outcome.state is RunState.FINISHED
    assert recorder.names() == [
        HookName.ON_START,
        HookName.BEFORE_REASONING,
        HookName.AFTER_REASONING,
        HookName.BEFORE_REASONING,
        HookName.AFTER_REASONING,
        HookName.ON_FINISH,
    ]
    assert len(started) == 1


def test_every_hook_name_fires_across_a_finished_and_a_cancelled_run(gate: Gate) -> None:
    recorder = HookRecorder()
    with Runtime(tools=[echo, gate.tool("g")]) as rt:
        rt.start(
            "t",
            agent=ScriptedAgent([plan(call("echo", text="x")), Finish(output="ok")]),
            hooks=_hooks(recorder),
        ).result(timeout=WAIT)
        handle = rt.start("u", agent=ScriptedAgent([plan(call("g"))]), hooks=_hooks(recorder))
        gate.wait_started(1)
        handle.cancel("stop")
        handle.result(timeout=WAIT)
    assert set(recorder.names()) == set(HookName)
    assert recorder.names().count(HookName.ON_FINISH) == 2  # once per terminal run


def _after_end(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def test_a_hook_that_raises_is_recorded_and_the_run_finishes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    structlog.reset_defaults()  # steerable logs through `logging` unless structlog is set up
    caplog.set_level(logging.WARNING, logger="steerable")
    recorder = HookRecorder(raise_on=[HookName.BEFORE_REASONING, HookName.ON_FINISH])
    agent = ScriptedAgent([plan(call("echo", text="x")), Finish(output="ok")])
    with Runtime(tools=[echo]) as rt:
        handle = rt.start("t", agent=agent, hooks=_hooks(recorder))
        outcome = handle.result(timeout=WAIT)
    # shutdown waited for the hooks still pending at the end (on_finish always is)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "ok"
    hook_errors = [e for e in outcome.errors if e.code is ErrorCode.HOOK_ERROR]
    assert [e.code for e in outcome.errors] == [ErrorCode.HOOK_ERROR] * len(hook_errors)
    assert all("failed on purpose" in e.message for e in hook_errors)
    # Hooks run beside the loop: an error of a hook that ran before the end is in the
    # outcome; one that ran after it (on_finish's always) is logged. Each exactly once.
    late = _after_end(caplog, "hook_error_after_end")
    assert all(r.run_id == handle.run_id for r in late)  # type: ignore[attr-defined]
    assert sorted(
        [e.details["hook"] for e in hook_errors] + [r.hook for r in late]  # type: ignore[attr-defined]
    ) == ["before_reasoning", "before_reasoning", "on_finish"]
    assert "on_finish" in [r.hook for r in late]  # type: ignore[attr-defined]
    # every hook still fired: a raising hook does not stop the others
    assert recorder.names().count(HookName.AFTER_REASONING) == 2


def test_a_slow_hook_does_not_stall_cancellation(
    gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    structlog.reset_defaults()  # steerable logs through `logging` unless structlog is set up
    caplog.set_level(logging.WARNING, logger="steerable")
    hook_entered = threading.Event()
    hook_release = threading.Event()

    def slow_hook(event: RunEvent) -> None:
        hook_entered.set()
        hook_release.wait(WAIT)

    agent = ScriptedAgent([plan(call("g"))])
    try:
        with Runtime(tools=[gate.tool("g")], hook_timeout=0.2) as rt:
            handle = rt.start("t", agent=agent, hooks={"before_execute": slow_hook})
            assert hook_entered.wait(WAIT)
            gate.wait_started(1)  # the run went on while its hook is blocked
            assert handle.cancel("stop") is True
            wait_state(handle, RunState.CANCELLED)
            assert handle.state is RunState.CANCELLED
            # the outcome never waits for hooks: they run after it
            outcome = handle.result(timeout=WAIT)
            assert not hook_release.is_set()
        # shutdown waited for the run's hooks: the hung one was given up after hook_timeout
        (abandoned,) = _after_end(caplog, "hooks_abandoned_after_end")
        assert abandoned.run_id == handle.run_id  # type: ignore[attr-defined]
        assert not hook_release.is_set()
    finally:
        hook_release.set()
    assert outcome.state is RunState.CANCELLED
    assert [e for e in outcome.errors if e.code is ErrorCode.HOOK_ERROR] == []


def test_a_hung_hook_never_delays_the_outcome_and_pending_hooks_run_after_it(
    gate: Gate,
) -> None:
    # Issue 10, defect 6: the outcome is published when the run ends; hooks still pending
    # (the hung one, then on_finish behind it) run after it, in order, never in front of it.
    hook_entered = threading.Event()
    hook_release = threading.Event()
    finished = threading.Event()
    order: list[str] = []

    def hung(event: RunEvent) -> None:
        hook_entered.set()
        hook_release.wait(6 * WAIT)  # past result()'s bound: released by the test
        order.append("before_execute")

    def on_finish(event: RunEvent) -> None:
        order.append("on_finish")
        finished.set()

    agent = ScriptedAgent([plan(call("g"))])
    try:
        # hook_timeout far beyond WAIT: an outcome that waited for the hook could not arrive.
        with Runtime(tools=[gate.tool("g")], hook_timeout=60.0) as rt:
            handle = rt.start(
                "t", agent=agent, hooks={"before_execute": hung, "on_finish": on_finish}
            )
            assert hook_entered.wait(WAIT)
            gate.wait_started(1)
            assert handle.cancel("stop") is True
            outcome = handle.result(timeout=WAIT)
            order.append("outcome")
            assert not finished.is_set()  # on_finish waits behind the hung hook
            hook_release.set()
            assert finished.wait(WAIT)
    finally:
        hook_release.set()
    assert outcome.state is RunState.CANCELLED
    assert order == ["outcome", "before_execute", "on_finish"]
    assert [e.code for e in outcome.errors if e.code is ErrorCode.HOOK_ERROR] == []


def test_global_hooks_with_rt_on_and_unregister() -> None:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_finish(event: RunEvent) -> None:
        with lock:
            seen.append((event.run_id, event.data["state"]))

    with Runtime() as rt:
        unregister = rt.on("on_finish", on_finish)
        rt.on(HookName.ON_START, lambda event: seen.append((event.run_id, "started")))
        first = rt.start("a", agent=ScriptedAgent([Finish(output=1)]))
        second = rt.start("b", agent=ScriptedAgent([Finish(output=2)]))
        first.result(timeout=WAIT)
        second.result(timeout=WAIT)
        unregister()
        third = rt.start("c", agent=ScriptedAgent([Finish(output=3)]))
        third.result(timeout=WAIT)
    assert sorted(seen) == sorted(
        [
            (first.run_id, "started"),
            (first.run_id, "finished"),
            (second.run_id, "started"),
            (second.run_id, "finished"),
            (third.run_id, "started"),
        ]
    )


def test_global_and_per_run_hooks_both_fire() -> None:
    order: list[str] = []
    with Runtime() as rt:
        rt.on("on_finish", lambda event: order.append("global"))
        rt.start(
            "t",
            agent=ScriptedAgent([Finish(output=None)]),
            hooks={"on_finish": lambda event: order.append("run")},
        ).result(timeout=WAIT)
    assert order == ["global", "run"]


# ---------------------------------------------------------------------- events


def test_events_are_typed_ordered_and_carry_ids_and_phases() -> None:
    agent = ScriptedAgent([plan(call("echo", text="x")), Finish(output="ok")])
    with Runtime(tools=[echo]) as rt:
        handle = rt.start("t", agent=agent)
        handle.result(timeout=WAIT)
        events = list(handle.events())
        tail = list(handle.events(start=3))
    assert all(isinstance(e, RunEvent) for e in events)
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.run_id for e in events} == {handle.run_id}
    assert {e.trace_id for e in events} == {handle.trace_id}
    kinds = [e.kind for e in events]
    for kind in (
        EventKind.RUN_STARTED,
        EventKind.REASONING_STARTED,
        EventKind.PLANNING_FINISHED,
        EventKind.TOOL_STARTED,
        EventKind.TOOL_FINISHED,
        EventKind.EXECUTE_FINISHED,
        EventKind.CHECKPOINT,
    ):
        assert kind in kinds
    for event in events:
        if event.kind in EXPECTED_PHASES:
            assert event.phase is EXPECTED_PHASES[event.kind], event
    assert events[-1].kind is EventKind.RUN_ENDED
    assert kinds.index(EventKind.RUN_STARTED) < kinds.index(EventKind.REASONING_STARTED)
    assert kinds.index(EventKind.PLANNING_FINISHED) < kinds.index(EventKind.TOOL_STARTED)
    assert tail == events[3:]


def test_sync_iteration_ends_when_the_run_ends(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    collected: list[RunEvent] = []
    with Runtime(tools=[gate.tool("g")]) as rt:
        handle = rt.start("t", agent=agent)
        reader = threading.Thread(target=lambda: collected.extend(handle.events()))
        reader.start()
        gate.wait_started(1)
        assert reader.is_alive()  # the run is live: the iteration waits for more
        gate.release()
        handle.result(timeout=WAIT)
        reader.join(WAIT)
        assert not reader.is_alive()  # ended by itself with the run
    assert collected[-1].kind is EventKind.RUN_ENDED
    assert [e.seq for e in collected] == list(range(len(collected)))


def test_async_iteration_and_wait_do_not_block_the_event_loop(gate: Gate) -> None:
    agent = ScriptedAgent([plan(call("g")), Finish(output="ok")])
    released_by_ticker = threading.Event()
    finished = threading.Event()

    def guard() -> None:  # fail instead of hang if the loop were blocked
        if not finished.wait(WAIT):
            gate.release()

    async def main(rt: Runtime) -> tuple[RunOutcome, list[RunEvent], int]:
        handle = rt.start("t", agent=agent)
        ticks = 0
        stop = False

        async def ticker() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                if gate.contexts and ticks >= 20 and not released_by_ticker.is_set():
                    released_by_ticker.set()
                    gate.release()
                await asyncio.sleep(0.001)

        async def consume() -> list[RunEvent]:
            return [event async for event in handle.events()]

        ticking = asyncio.create_task(ticker())
        consuming = asyncio.create_task(consume())
        outcome = await asyncio.wait_for(handle.wait(), WAIT)
        events = await asyncio.wait_for(consuming, WAIT)
        stop = True
        await ticking
        return outcome, events, ticks

    watchdog = threading.Thread(target=guard)
    watchdog.start()
    try:
        with Runtime(tools=[gate.tool("g")]) as rt:
            outcome, events, ticks = asyncio.run(main(rt))
    finally:
        finished.set()
        watchdog.join(WAIT)
    assert released_by_ticker.is_set()  # the loop kept ticking while awaiting the run
    assert ticks >= 20
    assert outcome.state is RunState.FINISHED
    assert events[-1].kind is EventKind.RUN_ENDED
    assert [e.seq for e in events] == list(range(len(events)))


# ---------------------------------------------------------------------- runtime metrics


def test_statistics_keys_and_counts() -> None:
    keys = {
        "runs_active",
        "runs_started",
        "runs_ended",
        "threads_total",
        "workers_live",
        "workers_busy",
        "workers_abandoned",
        "abandoned_total",
        "jobs_queued",
        "dispatcher_queue_depth",
        "actors_live",
        "timers_pending",
    }
    with Runtime(tools=[echo]) as rt:
        before = rt.statistics()
        assert keys <= set(before)
        assert all(isinstance(v, int) for v in before.values())
        agent = ScriptedAgent([plan(call("echo", text="x")), Finish(output="ok")])
        rt.start("t", agent=agent).result(timeout=WAIT)
        after = rt.statistics()
    assert before["runs_started"] == 0
    assert after["runs_started"] == 1
    assert after["runs_ended"] == 1
    assert after["runs_active"] == 0
    assert after["workers_abandoned"] == 0
