"""The `Runtime` facade's lifecycle in a long-lived host: context manager, shutdown that leaves
the process as it found it (abandoned workers excepted and named), cancelling or stopping live
runs, many concurrent runs, coexistence with a host's own pykka actors (T9), run lookup, and
plain functions as tools.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from steerable.actors import Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_state
from steerable.protocol import (
    AskUser,
    ErrorCode,
    Finish,
    RetryPolicy,
    RunConfig,
    RunState,
    SteerableError,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


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


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


def test_context_manager_returns_the_runtime_and_shuts_it_down() -> None:
    with Runtime() as rt:
        assert isinstance(rt, Runtime)
        outcome = rt.start("t", agent=ScriptedAgent([Finish(output=1)])).result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
    with pytest.raises(SteerableError) as info:
        rt.start("again", agent=ScriptedAgent())
    assert info.value.code is ErrorCode.RUN_ENDED
    assert rt.shutdown() == []  # idempotent


def test_shutdown_leaves_the_process_with_the_threads_it_had() -> None:
    before = _threads()

    @tool
    async def async_echo(text: str) -> str:
        return text

    agent = ScriptedAgent(
        [plan(call("echo", text="a"), call("async_echo", text="b")), Finish(output="ok")]
    )
    rt = Runtime(tools=[echo, async_echo], prestart_workers=2, dispatcher_threads=2)
    try:
        # a run that uses workers, the asyncio loop and the hook worker
        handle = rt.start("t", agent=agent, hooks={"on_finish": lambda event: None})
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        assert len(_threads() - before) > 0
    finally:
        left = rt.shutdown()
    assert left == []
    after = _threads()
    assert sorted(t.name for t in after - before) == []
    assert sorted(t.name for t in before - after) == []


def test_shutdown_names_abandoned_workers_and_only_those_survive() -> None:
    before = _threads()
    stuck = Gate(cooperative=False)
    stuck_threads: list[threading.Thread] = []

    @tool(timeout=0.05)
    def hang(ctx: ToolContext) -> Any:
        stuck_threads.append(threading.current_thread())
        return stuck.enter(ctx)

    agent = ScriptedAgent([plan(call("hang")), Finish(output="moved on")])
    rt = Runtime(tools=[hang])
    try:
        config = RunConfig(retry=RetryPolicy(max_retries=0))
        assert rt.start("t", agent=agent, config=config).result(timeout=WAIT).state is (
            RunState.FINISHED
        )
        left = rt.shutdown()
        (thread,) = stuck_threads
        assert left == [thread.name]
        assert _threads() - before == {thread}
    finally:
        stuck.release()
        rt.shutdown()
    for t in stuck_threads:
        t.join(WAIT)
        assert not t.is_alive()


def test_shutdown_cancels_live_runs(gate: Gate) -> None:
    rt = Runtime(tools=[gate.tool("g")])
    try:
        busy = rt.start("busy", agent=ScriptedAgent([plan(call("g"))]))
        asking = rt.start("asking", agent=ScriptedAgent([AskUser(question="?")]))
        gate.wait_started(1)
        wait_state(asking, RunState.WAITING)
    finally:
        rt.shutdown()
    for handle in (busy, asking):
        outcome = handle.result(timeout=0)
        assert outcome.state is RunState.CANCELLED
        assert handle.state is RunState.CANCELLED
    assert gate.stopped.is_set()


def test_shutdown_without_cancelling_leaves_results_unavailable(gate: Gate) -> None:
    rt = Runtime(tools=[gate.tool("g")])
    try:
        handle = rt.start("t", agent=ScriptedAgent([plan(call("g"))]))
        gate.wait_started(1)
    finally:
        rt.shutdown(cancel_runs=False)
    with pytest.raises(SteerableError) as info:
        handle.result(timeout=0)
    assert info.value.code is ErrorCode.RUN_ENDED
    assert handle.state is not RunState.CANCELLED  # stopped where it stood, not cancelled


def test_start_after_shutdown_raises_run_ended() -> None:
    rt = Runtime()
    rt.shutdown()
    with pytest.raises(SteerableError) as info:
        rt.start("t", agent=ScriptedAgent())
    assert info.value.code is ErrorCode.RUN_ENDED


def test_two_hundred_concurrent_runs_all_finish(gate: Gate) -> None:
    count = 200
    with Runtime(tools=[gate.tool("g")]) as rt:
        handles = [
            rt.start(f"task {i}", agent=ScriptedAgent([plan(call("g", value=f"r{i}"))]))
            for i in range(count)
        ]
        gate.wait_started(count)  # every run is in flight at once
        assert rt.statistics()["runs_active"] == count
        gate.release()
        outcomes = [h.result(timeout=WAIT) for h in handles]
        stats = rt.statistics()
    assert [o.state for o in outcomes] == [RunState.FINISHED] * count
    assert len({o.run_id for o in outcomes}) == count
    assert stats["runs_started"] == count
    assert stats["runs_ended"] == count
    assert stats["runs_active"] == 0


class HostActor(pykka.ThreadingActor):
    """A host's own pykka actor, which the runtime must leave alone (T9)."""

    def on_receive(self, message: Any) -> Any:
        return ("pong", message)


def test_runtime_never_stops_the_hosts_pykka_actors(
    monkeypatch: pytest.MonkeyPatch, gate: Gate
) -> None:
    forbidden: list[str] = []

    def stop_all(*args: Any, **kwargs: Any) -> None:
        forbidden.append("stop_all")
        raise AssertionError("steerable called ActorRegistry.stop_all()")

    def broadcast(*args: Any, **kwargs: Any) -> None:
        forbidden.append("broadcast")
        raise AssertionError("steerable called ActorRegistry.broadcast()")

    monkeypatch.setattr(pykka.ActorRegistry, "stop_all", staticmethod(stop_all))
    monkeypatch.setattr(pykka.ActorRegistry, "broadcast", staticmethod(broadcast))

    @tool
    def exits() -> str:
        raise SystemExit(1)  # T7: a BaseException that would trigger stop_all in pykka

    host = HostActor.start()
    try:
        with Runtime(tools=[exits, gate.tool("g")]) as rt:
            finished = rt.start("t", agent=ScriptedAgent([plan(call("exits"))]))
            assert finished.result(timeout=WAIT).state is RunState.FINISHED
            live = rt.start("u", agent=ScriptedAgent([plan(call("g"))]))
            gate.wait_started(1)
            live.cancel()
            live.result(timeout=WAIT)
            left_live = rt.start("v", agent=ScriptedAgent([AskUser(question="?")]))
            wait_state(left_live, RunState.WAITING)
        # shut down with a live run: still only its own actors were stopped
        assert host.is_alive()
        assert host.ask("ping", timeout=WAIT) == ("pong", "ping")
    finally:
        host.stop()
    assert forbidden == []


def test_handle_finds_live_runs_and_not_found_otherwise() -> None:
    agent = ScriptedAgent([AskUser(question="?"), Finish(output="ok")])
    with Runtime() as rt:
        original = rt.start("t", agent=agent)
        wait_state(original, RunState.WAITING)
        found = rt.handle(original.run_id)
        assert found.run_id == original.run_id
        assert found.trace_id == original.trace_id
        assert found.state is RunState.WAITING
        found.send("answer")  # steering through the looked-up handle reaches the run
        outcome = original.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert found.result(timeout=WAIT) == outcome
        with pytest.raises(SteerableError) as ended:
            rt.handle(original.run_id)
        with pytest.raises(SteerableError) as unknown:
            rt.handle("run_does_not_exist")
    assert ended.value.code is ErrorCode.NOT_FOUND
    assert unknown.value.code is ErrorCode.NOT_FOUND
    assert [m.content for m in agent.views[1].delivered] == ["answer"]


def test_plain_functions_are_auto_wrapped_as_tools() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    def shout(text: str) -> str:
        return text.upper()

    agent = ScriptedAgent([plan(call("add", a=2, b="3"), call("shout", text="hi"))])
    with Runtime(tools=[add]) as rt:
        assert rt.tools["add"].spec.name == "add"
        outcome = rt.start("t", agent=agent, tools=[shout]).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    results = [r for r in agent.views[1].last_results if isinstance(r, ToolResult)]
    assert [(r.ok, r.value) for r in results] == [(True, 5), (True, "HI")]


def test_start_rejects_an_agent_without_decide() -> None:
    with Runtime() as rt, pytest.raises(TypeError):
        rt.start("t", agent=object())  # type: ignore[arg-type]
