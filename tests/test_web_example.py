"""examples/web: the FastAPI + SSE app, in process (httpx's ASGI transport) and as a real
uvicorn process on a loopback port with 20 concurrent runs.

Synchronised on the runtime's own events (in process) and on the SSE streams (uvicorn);
never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from steerable.actors import Runtime, SqliteStore
from steerable.protocol import EventKind

if TYPE_CHECKING:  # mypy resolves the kit as tests.web_kit (explicit package bases)
    from tests.web_kit import load_app_module, parse_sse, uvicorn_app
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from web_kit import load_app_module, parse_sse, uvicorn_app

WAIT = 30.0  # generous fail-instead-of-hang bound

web = load_app_module()


async def _first(rt: Runtime, run_id: str, kind: EventKind) -> dict[str, Any]:
    async for event in rt.handle(run_id).events():
        if event.kind is kind:
            return event.data
    raise AssertionError(f"run ended before {kind}")


class InProcess:
    """The app with its lifespan running, and a client on httpx's ASGI transport."""

    def __init__(self, tmp_path: Path, slices: int = 2) -> None:
        self.db = tmp_path / "web.db"
        self.slices = slices
        self.runtime: Runtime | None = None

    def build(self) -> Runtime:
        self.runtime = Runtime(store=SqliteStore(self.db), tools=web.make_tools(0.01, self.slices))
        return self.runtime

    async def __aenter__(self) -> tuple[httpx.AsyncClient, Runtime]:
        self.app = web.create_app(self.build, keepalive=0.05)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://app"
        )
        assert self.runtime is not None
        return self.client, self.runtime

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self._lifespan.__aexit__(None, None, None)


def test_start_steer_approve_and_stream_in_process(tmp_path: Path) -> None:
    async def main() -> None:
        async with InProcess(tmp_path) as (client, rt):
            started = (await client.post("/runs", json={"task": "Lisbon"})).json()
            run_id = started["run_id"]
            approval = await _first(rt, run_id, EventKind.APPROVAL_REQUESTED)
            sent = await client.post(f"/runs/{run_id}/messages", json={"content": "museums"})
            assert sent.status_code == 200
            assert sent.json()["seq"] >= 0
            settled = await client.post(
                f"/runs/{run_id}/approvals/{approval['call_id']}", json={"approved": True}
            )
            assert settled.json() == {"settled": True}
            again = await client.post(
                f"/runs/{run_id}/approvals/{approval['call_id']}", json={"approved": False}
            )
            assert again.json() == {"settled": False}
            stream = await client.get(f"/runs/{run_id}/events")  # buffered: ends with the run
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = parse_sse(stream.text)
            kinds = [e["kind"] for e in events]
            assert kinds[-1] == "run_ended"
            assert "message_delivered" in kinds
            assert "approval_settled" in kinds
            assert [e["seq"] for e in events] == list(range(len(events)))
            state = (await client.get(f"/runs/{run_id}")).json()
            assert state["state"] == "finished"
            assert state["outcome"]["output"]["notes"] == ["notes on Lisbon", "notes on museums"]
            assert state["outcome"]["output"]["booking"] == "booked"
            late = await client.post(f"/runs/{run_id}/messages", json={"content": "too late"})
            assert late.status_code == 409
            resumed = await client.get(
                f"/runs/{run_id}/events", headers={"Last-Event-ID": str(events[4]["seq"])}
            )
            assert [e["seq"] for e in parse_sse(resumed.text)] == [e["seq"] for e in events[5:]]

    asyncio.run(main())


def test_deny_cancel_and_interrupt_in_process(tmp_path: Path) -> None:
    async def main() -> None:
        async with InProcess(tmp_path, slices=100_000) as (client, rt):
            # interrupt: the long research is cancelled and the message is delivered at once
            run_id = (await client.post("/runs", json={"task": "Porto"})).json()["run_id"]
            await _first(rt, run_id, EventKind.TOOL_STARTED)
            sent = await client.post(
                f"/runs/{run_id}/messages", json={"content": "stop, go", "mode": "interrupt"}
            )
            assert sent.status_code == 200
            await _first(rt, run_id, EventKind.MESSAGE_DELIVERED)
            handle = rt.handle(run_id)  # while it lives: an ended run has no live handle
            assert (await client.post(f"/runs/{run_id}/cancel")).json() == {"cancelled": True}
            # cancel() returns once the cancellation is claimed; the run ends on its
            # supervisor's thread right after (docs/steering.md): wait for that, then look.
            await handle.wait()
            state = (await client.get(f"/runs/{run_id}")).json()
            assert state["state"] == "cancelled"
            assert (await client.post(f"/runs/{run_id}/cancel")).json() == {"cancelled": False}
            assert (await client.get("/runs/nope")).status_code == 404

    asyncio.run(main())


def test_app_shutdown_parks_waiting_runs_and_leaves_no_thread(tmp_path: Path) -> None:
    async def main() -> str:
        async with InProcess(tmp_path) as (client, rt):
            run_id = (await client.post("/runs", json={"task": "Faro"})).json()["run_id"]
            await _first(rt, run_id, EventKind.APPROVAL_REQUESTED)
            return str(run_id)

    run_id = asyncio.run(main())
    # The autouse fixture checks that no steerable thread is left; the run is parked.
    with Runtime(store=SqliteStore(tmp_path / "web.db")) as rt:
        assert run_id in rt.unfinished()


async def _drive_one(client: httpx.AsyncClient, index: int) -> tuple[str, str]:
    """One run through the real server: steer it, then approve, deny or cancel it."""
    run_id = (await client.post("/runs", json={"task": f"city {index}"})).json()["run_id"]
    choice = ("approve", "deny", "cancel")[index % 3]
    steered = False
    async with client.stream("GET", f"/runs/{run_id}/events") as response:
        async for event in _events(response.aiter_lines()):
            kind, data = event["kind"], event["data"]
            if kind == "tool_started" and not steered:
                steered = True
                reply = await client.post(
                    f"/runs/{run_id}/messages", json={"content": f"extra {index}"}
                )
                assert reply.status_code == 200
            elif kind == "approval_requested":
                if choice == "cancel":
                    await client.post(f"/runs/{run_id}/cancel")
                else:
                    body = {"approved": choice == "approve", "reason": "no"}
                    await client.post(f"/runs/{run_id}/approvals/{data['call_id']}", json=body)
            elif kind == "run_ended" and event["run_id"] == run_id:
                return choice, data["state"]
    raise AssertionError(f"stream of {run_id} ended without run_ended")


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data: "):
            yield json.loads(line.removeprefix("data: "))


@pytest.mark.slow
def test_twenty_concurrent_runs_through_a_real_uvicorn(tmp_path: Path) -> None:
    with uvicorn_app(tmp_path, STEERABLE_WEB_SLICES="4") as base:

        async def main() -> list[tuple[str, str]]:
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(base_url=base, timeout=WAIT, limits=limits) as client:
                return await asyncio.wait_for(
                    asyncio.gather(*(_drive_one(client, i) for i in range(20))), WAIT * 2
                )

        results = asyncio.run(main())
    expected = {"approve": "finished", "deny": "finished", "cancel": "cancelled"}
    assert [state for _, state in results] == [expected[choice] for choice, _ in results]
