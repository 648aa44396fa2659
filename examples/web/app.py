"""A live web UI on steerable: start a run, watch its events, steer it, approve, stop it.

FastAPI serves a small page (static/index.html, plain HTML and JavaScript) and a JSON API; each
run's events stream to the page as Server-Sent Events. Everything the app does with a run goes
through steerable's async face, so no request ever blocks the event loop.

    pip install -e ".[dev]"          # or: pip install steerable fastapi uvicorn
    uvicorn --app-dir examples/web app:app --port 8000
    # open http://127.0.0.1:8000/

Runs are stored in `$STEERABLE_WEB_DB` (default `web-runs.db` in the working directory); a
restart of the app parks live runs and `POST /runs/{id}/resume` picks one up again.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel

from steerable.actors import RunHandle, Runtime, SqliteStore, ToolContext, tool
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunView,
    SteerableError,
    ToolCall,
    ToolResult,
    UserMessage,
)

STATIC = Path(__file__).with_name("static")


def make_tools(slice_seconds: float, slices: int) -> list[Any]:
    """The example's tools: a slow, cooperative search and a booking that needs approval."""

    @tool(side_effect="none")
    def research(topic: str, ctx: ToolContext) -> str:
        """Look a topic up (slowly, in slices that wake at once on cancellation)."""
        for _ in range(slices):
            if ctx.wait(slice_seconds):
                return "stopped early"
        return f"notes on {topic}"

    @tool(side_effect="write", requires_approval=True)
    def book(item: str, ctx: ToolContext) -> str:
        """Book something; a person approves it first."""
        return f"booked {item} (key {ctx.idempotency_key})"

    return [research, book]


class TripAgent:
    """A scripted 'model': researches the task, asks to book, follows steering, then finishes.

    Each user message delivered mid-run becomes one more research step; when nothing new
    arrived, it books once and finishes with what it learned.
    """

    name = "trip-agent"

    def decide(self, view: RunView) -> Plan | Finish | AskUser:
        notes = [
            str(e.value)
            for e in view.transcript
            if isinstance(e, ToolResult) and e.ok and e.tool == "research"
        ]
        if view.model_calls == 0:
            return Plan(steps=[ToolCall(name="research", arguments={"topic": view.task})])
        if view.delivered:
            topics = [m.content for m in view.delivered if isinstance(m, UserMessage)]
            return Plan(steps=[ToolCall(name="research", arguments={"topic": t}) for t in topics])
        booked = [e for e in view.transcript if isinstance(e, ToolResult) and e.tool == "book"]
        if not booked:
            return Plan(steps=[ToolCall(name="book", arguments={"item": f"trip: {view.task}"})])
        outcome = "booked" if booked[-1].ok else f"not booked ({booked[-1].error})"
        return Finish(output={"notes": notes, "booking": outcome})


class StartRequest(BaseModel):
    task: str


class MessageRequest(BaseModel):
    content: str
    mode: Literal["queue", "interrupt"] = "queue"


class ApprovalRequestBody(BaseModel):
    approved: bool
    reason: str = ""


router = APIRouter()
"""The app's endpoints; `create_app` mounts them next to the runtime's lifespan."""


def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def _handle(request: Request, run_id: str) -> RunHandle:
    # A handle keeps answering (state, outcome, events) after its run ended, when the runtime
    # no longer lists the run as live: the app keeps the handles of the runs it started.
    handles: dict[str, RunHandle] = request.app.state.handles
    if run_id in handles:
        return handles[run_id]
    try:
        return _runtime(request).handle(run_id)
    except SteerableError as exc:
        raise HTTPException(404, detail=exc.error.message) from None


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html")


@router.get("/event-kinds")
async def event_kinds() -> list[str]:
    # SSE frames are named by kind; the page listens for every kind there is.
    return [kind.value for kind in EventKind]


@router.post("/runs")
async def start(request: Request, body: StartRequest) -> dict[str, str]:
    config = RunConfig(max_steps=50, max_model_calls=20, total_timeout=600.0)
    handle = await _runtime(request).astart(body.task, agent=TripAgent(), config=config)
    request.app.state.handles[handle.run_id] = handle
    return {"run_id": handle.run_id, "trace_id": handle.trace_id}


@router.get("/runs/{run_id}")
async def state(request: Request, run_id: str) -> dict[str, Any]:
    handle = _handle(request, run_id)
    out: dict[str, Any] = {"run_id": run_id, "state": handle.state.value}
    out["pending_approvals"] = [a.model_dump(mode="json") for a in handle.pending_approvals()]
    if handle.done():
        out["outcome"] = (await handle.wait()).model_dump(mode="json")
    return out


@router.get("/runs/{run_id}/events")
async def events(request: Request, run_id: str, start: int = 0) -> StreamingResponse:
    handle = _handle(request, run_id)
    last = request.headers.get("last-event-id")
    if last is not None and last.isdigit():
        start = int(last) + 1  # a reconnecting EventSource resumes after what it saw
    frames = handle.events(start=start).sse(keepalive=request.app.state.keepalive)
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/runs/{run_id}/messages")
async def send(request: Request, run_id: str, body: MessageRequest) -> dict[str, int]:
    handle = _handle(request, run_id)
    try:
        return {"seq": await handle.asend(body.content, mode=body.mode)}
    except SteerableError as exc:
        if exc.error.code is ErrorCode.RUN_ENDED:
            raise HTTPException(409, detail=exc.error.message) from None
        raise


@router.post("/runs/{run_id}/approvals/{call_id}")
async def approval(
    request: Request, run_id: str, call_id: str, body: ApprovalRequestBody
) -> dict[str, bool]:
    handle = _handle(request, run_id)
    if body.approved:
        return {"settled": await handle.aapprove(call_id)}
    return {"settled": await handle.adeny(call_id, body.reason or "denied")}


@router.post("/runs/{run_id}/cancel")
async def cancel(request: Request, run_id: str) -> dict[str, bool]:
    return {"cancelled": await _handle(request, run_id).acancel("stopped from the page")}


def _default_runtime() -> Runtime:
    db = os.environ.get("STEERABLE_WEB_DB", "web-runs.db")
    slices = int(os.environ.get("STEERABLE_WEB_SLICES", "20"))  # research takes ~1 s
    return Runtime(store=SqliteStore(db), tools=make_tools(0.05, slices))


def create_app(
    runtime: Callable[[], Runtime] | None = None,
    *,
    keepalive: float = 15.0,
) -> FastAPI:
    """The app. `runtime` builds the Runtime at startup (default: SQLite at $STEERABLE_WEB_DB).

    The runtime is shut down with the app: with a durable store its live runs are parked
    (resumable), not cancelled. `keepalive` is the SSE keep-alive interval in seconds.
    """
    build = runtime or _default_runtime

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = build()
        app.state.runtime = rt
        app.state.handles = {}
        app.state.keepalive = keepalive
        try:
            yield
        finally:
            await rt.ashutdown()

    app = FastAPI(title="steerable live runs", lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()
