"""The async face: every host operation awaitable off the loop; streams that suit SSE.

Real threads and real event loops; synchronised on run events and states, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import Agent, MemoryStore, Runtime, SqliteStore, ToolContext, tool
from steerable.actors._host.event_stream import SSE_KEEPALIVE, sse_frame
from steerable.actors.testing import ScriptedAgent, call, plan
from steerable.protocol import (
    AskUser,
    EventKind,
    Finish,
    HostMessage,
    RunState,
    RunView,
    SteerableError,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


class ThreadRecordingStore(MemoryStore):
    """A durable-looking store that records which thread stored each host message."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def append_message(
        self, run_id: str, message: HostMessage, *, message_id: str | None = None
    ) -> None:
        self.threads.append(threading.current_thread().name)
        super().append_message(run_id, message, message_id=message_id)


@tool(side_effect="write", requires_approval=True)
def pay(amount: int, ctx: ToolContext) -> str:
    return f"paid {amount}"


async def _until(stream: Any, kind: EventKind) -> Any:
    async for event in stream:
        if event.kind is kind:
            return event
    raise AssertionError(f"stream ended before {kind}")


async def _take_until_waiting_for_user(stream: Any) -> AsyncIterator[Any]:
    """Yield events up to and including the one that says the run waits for the user."""
    async for event in stream:
        yield event
        data = event.data
        if event.kind is EventKind.STATE_CHANGED and data.get("to") == "waiting":  # noqa: SIM102
            if data.get("waiting_for") == "user":
                return
    raise AssertionError("stream ended before the run waited for the user")


async def _until_waiting_for_user(stream: Any) -> None:
    """Read up to the event that says the run now waits for the user (the event, not the
    handle's state: that is published after the handler that appended the event)."""
    async for _ in _take_until_waiting_for_user(stream):
        pass


def test_every_operation_has_an_awaitable_form_that_stores_off_the_loop() -> None:
    store = ThreadRecordingStore()

    async def main() -> None:
        loop_thread = threading.current_thread().name
        async with Runtime(store=store, tools=[pay]) as rt:
            agent = ScriptedAgent(
                [
                    plan(call("pay", amount=3), call("pay", amount=4)),
                    AskUser(question="more?"),
                    AskUser(question="and now?"),
                ]
            )
            handle = await rt.astart("t", agent=agent)
            stream = handle.events(timeout=WAIT)
            requested = [await _until(stream, EventKind.APPROVAL_REQUESTED) for _ in range(2)]
            first, second = (e.data["call_id"] for e in requested)
            assert await handle.aapprove(first) is True
            assert await handle.adeny(second, "no") is True
            assert await handle.aapprove(first) is False  # already settled
            await _until_waiting_for_user(stream)
            seq = await handle.asend("go on", mode="queue")
            assert seq > 0
            assert await handle.acancel("user pressed stop") is True
            outcome = await handle.wait()
            assert outcome.state is RunState.CANCELLED
            assert await handle.acancel() is False
        assert store.threads, "nothing was stored"
        assert all(name.startswith("steerable-host") for name in store.threads), store.threads
        assert loop_thread not in store.threads

    asyncio.run(main())


def test_astart_raises_the_same_typed_errors_as_start() -> None:
    async def main() -> None:
        rt = Runtime()
        await rt.ashutdown()
        with pytest.raises(SteerableError) as caught:
            await rt.astart("t", agent=ScriptedAgent([Finish(output=1)]))
        assert caught.value.error.code.value == "run_ended"

    asyncio.run(main())


class WaitsForUser:
    """Asks once, then finishes with what the user said."""

    def decide(self, view: RunView) -> Any:
        if view.delivered:
            return Finish(output=view.delivered[-1].content)
        return AskUser(question="what now?")


def test_a_cancelled_anext_loses_no_event_and_does_not_end_the_stream() -> None:
    async def main() -> None:
        async with Runtime() as rt:
            handle = await rt.astart("t", agent=WaitsForUser())
            stream = handle.events(timeout=WAIT)
            seen = [e.seq async for e in _take_until_waiting_for_user(stream)]
            # An SSE keep-alive loop: waits cancelled while the run is quiet. Whatever arrives
            # in between is kept; no event may be lost or seen twice.
            cancelled = 0
            for _ in range(1000):
                try:
                    seen.append((await asyncio.wait_for(stream.__anext__(), 0.01)).seq)
                except TimeoutError:
                    cancelled += 1
                    if cancelled == 3:
                        break
            assert cancelled == 3
            await handle.asend("the answer")
            rest = [event async for event in stream]
            seen += [e.seq for e in rest]
            assert seen == list(range(len(seen)))
            assert EventKind.MESSAGE_DELIVERED in [e.kind for e in rest]
            assert rest[-1].kind is EventKind.RUN_ENDED
            assert (await handle.wait()).output == "the answer"

    asyncio.run(main())


def test_async_iteration_honours_the_stream_timeout_without_ending_it() -> None:
    async def main() -> None:
        async with Runtime() as rt:
            handle = await rt.astart("t", agent=WaitsForUser())
            stream = handle.events(timeout=0.01)
            while True:
                try:
                    await stream.__anext__()
                except TimeoutError:
                    # Quiet for 10 ms; under load a running run can be too, so look too.
                    if handle.state is RunState.WAITING:
                        break  # waiting for the user
            await handle.asend("hello")
            ended = await _until(stream, EventKind.RUN_ENDED)
            assert ended.data["state"] == "finished"

    asyncio.run(main())


def test_sync_iteration_resumes_where_a_timeout_left_it() -> None:
    with Runtime() as rt:
        handle = rt.start("t", agent=WaitsForUser())
        stream = handle.events(timeout=0.05)
        seen: list[int] = []
        with pytest.raises(TimeoutError):
            seen.extend(event.seq for event in stream)
        handle.send("hi")
        seen.extend(event.seq for event in stream)
        assert seen == list(range(len(seen)))  # nothing skipped, nothing twice
        assert handle.result(timeout=WAIT).output == "hi"


def test_sse_frames_carry_seq_kind_and_json_and_keepalives_while_quiet() -> None:
    async def main() -> list[str]:
        async with Runtime() as rt:
            handle = await rt.astart("t", agent=WaitsForUser())
            frames: list[str] = []
            sent = False
            async for frame in handle.events().sse(keepalive=0.01):
                frames.append(frame)
                if frame == SSE_KEEPALIVE and handle.state is RunState.WAITING and not sent:
                    sent = True
                    await handle.asend("sse works")
            return frames

    frames = asyncio.run(main())
    assert SSE_KEEPALIVE in frames
    events = [f for f in frames if f != SSE_KEEPALIVE]
    parsed = []
    for frame in events:
        assert frame.endswith("\n\n")
        id_line, event_line, data_line = frame.rstrip("\n").split("\n")
        body = json.loads(data_line.removeprefix("data: "))
        assert id_line == f"id: {body['seq']}"
        assert event_line == f"event: {body['kind']}"
        parsed.append(body)
    assert [b["seq"] for b in parsed] == list(range(len(parsed)))
    assert parsed[-1]["kind"] == "run_ended"


def test_reconnecting_at_last_event_id_plus_one_replays_the_rest() -> None:
    with Runtime() as rt:
        handle = rt.start("t", agent=ScriptedAgent([Finish(output="x")]))
        handle.result(timeout=WAIT)
        everything = list(handle.events())
        last_seen = everything[2].seq
        rest = list(handle.events(start=last_seen + 1))
        assert [e.seq for e in rest] == [e.seq for e in everything[3:]]
        assert sse_frame(rest[0]).startswith(f"id: {last_seen + 1}\n")


def test_shutdown_parks_runs_with_a_durable_store_and_cancels_them_in_memory(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    rt = Runtime(store=SqliteStore(db), tools=[pay])
    handle = rt.start("t", agent=ScriptedAgent([plan(call("pay", amount=1)), Finish(output=1)]))
    assert len(_wait_for_approvals(handle)) == 1
    rt.shutdown()
    with pytest.raises(SteerableError):
        handle.result(timeout=WAIT)
    with Runtime(store=SqliteStore(db), tools=[pay]) as again:
        assert again.store.load(handle.run_id).snapshot.state is RunState.WAITING
        resumed = again.resume(
            handle.run_id, agent=ScriptedAgent([plan(call("pay", amount=1)), Finish(output=1)])
        )
        assert resumed.state is not RunState.CANCELLED

    with Runtime(tools=[pay]) as mem:
        waiting = mem.start("t", agent=ScriptedAgent([plan(call("pay", amount=1))]))
        _wait_for_approvals(waiting)
    assert waiting.result(timeout=WAIT).state is RunState.CANCELLED


def test_explicit_cancel_runs_cancels_with_a_durable_store(tmp_path: Path) -> None:
    rt = Runtime(store=SqliteStore(tmp_path / "runs.db"), tools=[pay])
    handle = rt.start("t", agent=ScriptedAgent([plan(call("pay", amount=1))]))
    _wait_for_approvals(handle)
    rt.shutdown(cancel_runs=True)
    assert handle.result(timeout=WAIT).state is RunState.CANCELLED


def _wait_for_approvals(handle: Any) -> list[Any]:
    for event in handle.events(timeout=WAIT):
        if event.kind is EventKind.APPROVAL_REQUESTED:
            break
    return list(handle.pending_approvals())


def test_agent_is_a_protocol_every_decider_satisfies() -> None:
    class NoDecide:
        pass

    async_agent: Agent

    class AsyncAgent:
        async def decide(self, view: RunView) -> Finish:
            return Finish(output=view.task)

    async_agent = AsyncAgent()
    assert isinstance(ScriptedAgent([]), Agent)
    assert isinstance(async_agent, Agent)
    assert not isinstance(NoDecide(), Agent)
    with Runtime() as rt:
        assert rt.start("echo", agent=async_agent).result(timeout=WAIT).output == "echo"
