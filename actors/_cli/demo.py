"""The `steerable demo` scenario: two real runs that show what the runtime does, event by event.

Run A shows parallel tools, a queued and an interrupting message, an approval, a tool timeout and a
retry; run B is cancelled mid-tool. Only the public API is used: the host reacts to each run's
event stream as a product would, and releases blocked tools one at a time, so every line is the
same on every run except time offsets and run ids.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from steerable.actors._host.handle import RunHandle
from steerable.actors._host.runtime import Runtime
from steerable.actors._observe.files import write_timeline
from steerable.actors._stores.store import CheckpointStore
from steerable.actors._tools.tool import RetryableToolError, Tool, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, plan
from steerable.protocol import (
    Decision,
    EventKind,
    Finish,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunOutcome,
    RunState,
    RunView,
    ToolResult,
)

__all__ = ["FEATURES", "demo_ok", "run_demo"]

Out = Callable[[str], None]

SOURCES = ("issues", "commits", "docs")
_WAIT = 5.0  # seconds: a fail-instead-of-hang guard on every wait; the demo takes well under 1 s

FEATURES = (
    "parallel tools",
    "queued message",
    "interrupt",
    "approval",
    "tool timeout",
    "retry",
    "cancel",
)
"""What the demo shows, in the order it shows it (the summary checks each one)."""


class _World:
    """What the demo's tools block on, so the host decides when each one ends."""

    def __init__(self) -> None:
        self.together = threading.Event()  # set when all three fetches are inside the tool
        self.barrier = threading.Barrier(len(SOURCES), action=self.together.set, timeout=_WAIT)
        self.turns = {source: threading.Event() for source in SOURCES}
        self.draft_running = threading.Event()
        self.reindex_running = threading.Event()
        self.mirror_release = threading.Event()
        self.mirror_threads: list[threading.Thread] = []

    def release_all(self) -> None:
        """Let every blocked tool return, and wait for the abandoned thread to end."""
        for turn in self.turns.values():
            turn.set()
        self.mirror_release.set()
        for thread in self.mirror_threads:
            thread.join(_WAIT)


def _slow(ctx: ToolContext, running: threading.Event) -> None:
    running.set()
    ctx.wait(_WAIT)  # wakes at once when the call is cancelled (cooperative, T5)
    ctx.raise_if_cancelled()


def _tools(world: _World) -> list[Tool[Any, Any]]:
    @tool
    def fetch(source: str) -> str:
        """Read release material from one source (waits for its two siblings, then its turn)."""
        world.barrier.wait()  # passes only if all three calls run at the same time
        world.turns[source].wait(_WAIT)
        return f"{len(source)} notes from {source}"

    @tool
    def draft(section: str, ctx: ToolContext) -> str:
        """Draft a section slowly; cooperative: wakes at once when cancelled."""
        _slow(ctx, world.draft_running)
        return f"draft of {section}"

    @tool(side_effect="write", requires_approval=True)
    def publish(channel: str, ctx: ToolContext) -> str:
        """Publish the notes: a write that a person must approve first."""
        return f"published to {channel} (idempotency key {ctx.idempotency_key[:9]}...)"

    @tool(side_effect="write", timeout=0.1)
    def notify_mirror(mirror: str) -> str:
        """Tell a mirror; hangs and ignores cancellation (a thread cannot be killed, R15)."""
        world.mirror_threads.append(threading.current_thread())
        world.mirror_release.wait(_WAIT)
        return f"mirror {mirror} notified"

    @tool
    def lookup(term: str, ctx: ToolContext) -> str:
        """Look something up; fails once with a retryable error, then succeeds."""
        if ctx.attempt == 1:
            raise RetryableToolError("search backend busy, try again")
        return f"{term}: 42 entries (attempt {ctx.attempt})"

    @tool
    def reindex(shard: str, ctx: ToolContext) -> str:
        """Rebuild an index slowly; cooperative."""
        _slow(ctx, world.reindex_running)
        return f"{shard} reindexed"

    return [fetch, draft, publish, notify_mirror, lookup, reindex]


class _ReleaseAgent:
    """A scripted agent that reads its view like a model would; `thoughts` explain each step."""

    name = "release-writer"

    def __init__(self) -> None:
        self.thoughts: dict[int, str] = {}

    def decide(self, view: RunView) -> Decision:
        model_call = view.model_calls + 1
        thought, decision = self._next(view, model_call)
        self.thoughts[model_call] = thought
        return decision

    def _next(self, view: RunView, model_call: int) -> tuple[str, Decision]:
        said = ", ".join(repr(m.content) for m in view.delivered) or "nothing"
        results = view.last_results
        error = results[-1].error if results else None
        code = error.code.value if error is not None else "none"
        ok = sum(r.ok for r in results)
        thoughts = [
            "gather material from three sources at once",
            f"{ok} sources read; the user said {said}: draft it",
            f"draft ended with {code}; the user said {said}: publish",
            "published; now tell the EU mirror",
            f"the mirror call ended with {code}; look up the changelog",
        ]
        plans = [
            [call("fetch", source=s) for s in SOURCES],
            [call("draft", section="cli")],
            [call("publish", channel="blog")],
            [call("notify_mirror", mirror="eu")],
            [call("lookup", term="changelog")],
        ]
        if model_call <= len(plans):
            return thoughts[model_call - 1], plan(*plans[model_call - 1])
        return "everything is in: finish", Finish(output={"done": True})


def _accept(output: Any, view: RunView) -> str | None:
    """The delivery check (R9): a finish is accepted only once the notes were published."""
    ok = any(isinstance(e, ToolResult) and e.tool == "publish" and e.ok for e in view.transcript)
    return None if ok else "the notes were never published"


# ---------------------------------------------------------------------------------- printing


_TEMPLATES = {
    EventKind.STATE_CHANGED: "{from} -> {to}{why}",
    EventKind.RUN_STARTED: "task={task!r} agent={agent}",
    EventKind.CHECKPOINT: "revision {revision}",
    EventKind.REASONING_STARTED: "model call {model_call}",
    EventKind.PLANNING_STARTED: "{steps} step(s)",
    EventKind.PLANNING_FINISHED: "calls {ids}{need}",
    EventKind.EXECUTE_STARTED: "{calls} call(s)",
    EventKind.EXECUTE_FINISHED: "{calls} call(s){cut}",
    EventKind.TOOL_STARTED: "{call_id} {tool}",
    EventKind.TOOL_FINISHED: "{call_id} {tool}: {how}{tries}",
    EventKind.TOOL_RETRY: "{call_id} {tool}: {error}, attempt {attempt} in {delay:.2f}s",
    EventKind.APPROVAL_REQUESTED: "{call_id} {tool}({args})",
    EventKind.APPROVAL_SETTLED: "{call_id} {verdict}",
    EventKind.MESSAGE_ACCEPTED: "seq {seq} ({mode})",
    EventKind.MESSAGE_DELIVERED: "seq {seq} -> the agent sees it now",
    EventKind.RUN_CANCELLED: "reason={reason!r}",
    EventKind.RUN_ENDED: "{state}{cause}",
    EventKind.ERROR: "{code}: {message}",
}


def _describe(kind: EventKind, d: Mapping[str, Any]) -> str:
    """The key data of one event, in a few words."""
    calls, error = d.get("calls"), d.get("error")
    derived = {
        "why": f" (waiting for {d['waiting_for']})" if d.get("waiting_for") else "",
        "ids": ", ".join(calls) if isinstance(calls, list) else "",
        "need": f"; {d['approvals']} need approval" if d.get("approvals") else "",
        "cut": " (interrupted)" if d.get("interrupted") else "",
        "how": "ok" if d.get("ok") else f"FAILED {error}",
        "tries": f" after {d['attempts']} attempts" if d.get("attempts", 1) > 1 else "",
        "args": ", ".join(f"{k}={v!r}" for k, v in d.get("arguments", {}).items()),
        "verdict": "approved" if d.get("approved") else f"denied: {d.get('reason')}",
        "cause": f" ({error})" if error and error != d.get("state") else "",
    }
    try:
        return _TEMPLATES[kind].format_map({**d, **derived})
    except (KeyError, ValueError):  # a kind (or shape) this demo does not know: show it all
        return " ".join(f"{k}={v}" for k, v in d.items())


class _Printer:
    def __init__(self, out: Out) -> None:
        self.out = out
        self.t0: float | None = None

    def event(self, event: RunEvent, thoughts: Mapping[int, str]) -> None:
        if self.t0 is None:
            self.t0 = event.at
        text = _describe(event.kind, event.data)
        if event.kind is EventKind.REASONING_FINISHED:
            n = event.data["model_call"]
            text = f"model call {n} -> {event.data.get('decision', event.data.get('error'))}"
            if n in thoughts:
                text += f': "{thoughts[n]}"'
        offset = event.at - self.t0
        self.out(f"{offset:7.3f}s  run..{event.run_id[-6:]}  {event.kind.value:<18} {text}")

    def host(self, text: str) -> None:
        self.out(f"{'':>8}  >> host: {text}")

    def header(self, text: str) -> None:
        self.out("")
        self.out(f"== {text}")


_LEGEND = (
    "steerable demo: two real runs on one Runtime, one line per event as it happens:",
    "  time since start | run id (last 6 characters) | event kind | details",
    "'>> host:' lines are what the host program does (steer, approve, cancel).",
    "A checkpoint is the run's state saved at a safe boundary (msgpack; in memory here).",
)

_CHAPTERS = {
    1: "1. Parallel tools: three fetches run at once; a queued message arrives meanwhile",
    2: "2. The queued message reached the agent at the boundary; now an interrupt",
    3: "3. Approval: a write waits for a person (the run is WAITING)",
    4: "4. Tool timeout: notify_mirror (a write) hangs past its 0.1 s timeout; never retried",
    5: "5. Retry: lookup fails with a retryable error, then succeeds",
    6: "6. Finish: the agent claims it is done; accept() checks the claim (R9)",
}


# ---------------------------------------------------------------------------------- the host


class _Host:
    """The host program: steers, approves and cancels in reaction to one run's events."""

    def __init__(
        self, rt: Runtime, world: _World, p: _Printer, handle: RunHandle, agent: object
    ) -> None:
        self.rt, self.world, self.p, self.handle = rt, world, p, handle
        self.thoughts: dict[int, str] = getattr(agent, "thoughts", {})
        self.chapters = _CHAPTERS if isinstance(agent, _ReleaseAgent) else {}
        self.fetch_started = 0
        self.fetch_finished = 0

    def watch(self) -> list[RunEvent]:
        """Print every event of the run as it happens, reacting to some; returns them."""
        seen: list[RunEvent] = []
        for event in self.handle.events(timeout=_WAIT):
            if event.kind is EventKind.REASONING_STARTED:
                chapter = self.chapters.get(event.data["model_call"])
                if chapter:
                    self.p.header(chapter)
            self.p.event(event, self.thoughts)
            seen.append(event)
            self.react(event)
        return seen

    def react(self, event: RunEvent) -> None:
        """What the host does on seeing `event` (most events need nothing)."""
        kind, d = event.kind, event.data
        if kind is EventKind.TOOL_STARTED:
            self._started(d["tool"])
        elif kind is EventKind.TOOL_FINISHED:
            self._finished(d["tool"])
        elif kind is EventKind.MESSAGE_ACCEPTED and d["seq"] == 0:
            self.world.turns[SOURCES[0]].set()  # let the fetches finish, one after the other
        elif kind is EventKind.STATE_CHANGED and d.get("waiting_for") == "approval":
            for request in self.handle.pending_approvals():  # a person looks, and approves
                done = self.handle.approve(request.call_id)
                self.p.host(
                    f"{request.call_id} {request.tool} waits for a person: "
                    f"approve({request.call_id!r}) -> {done}"
                )
        elif kind is EventKind.RUN_ENDED:
            self.world.mirror_release.set()  # let the abandoned thread end: none left behind

    def _started(self, tool: str) -> None:
        world, p = self.world, self.p
        if tool == "fetch":
            self.fetch_started += 1
            if self.fetch_started == len(SOURCES):
                if not world.together.wait(_WAIT):
                    raise TimeoutError("the three fetches never ran at the same time")
                p.host("all 3 fetch calls are inside their tool at once (a barrier of 3 passed)")
                seq = self.handle.send("also cover the new CLI", mode="queue")
                p.host(f"send('also cover the new CLI', mode='queue') -> seq {seq}; tools go on")
        elif tool == "draft":
            if not world.draft_running.wait(_WAIT):
                raise TimeoutError("draft never started")
            text = "skip the CLI draft, it is written; publish"
            seq = self.handle.send(text, mode="interrupt")
            p.host(f"draft is running; send({text!r}, mode='interrupt') -> seq {seq}")
        elif tool == "reindex":
            if not world.reindex_running.wait(_WAIT):
                raise TimeoutError("reindex never started")
            done = self.handle.cancel("user pressed stop")
            p.host(f"reindex is running; cancel('user pressed stop') -> {done}")

    def _finished(self, tool: str) -> None:
        if tool == "fetch":
            self.fetch_finished += 1
            if self.fetch_finished < len(SOURCES):
                self.world.turns[SOURCES[self.fetch_finished]].set()
        elif tool == "notify_mirror":
            stuck = self.rt.statistics()["workers_abandoned"]
            self.p.host(
                f"notify_mirror's thread is still stuck (abandoned workers: {stuck}); "
                "the run moved on without it"
            )


# ---------------------------------------------------------------------------------- summary


def _found(events: list[RunEvent], kind: EventKind, **match: Any) -> bool:
    return any(e.kind is kind and all(e.data.get(k) == v for k, v in match.items()) for e in events)


def _checks(a: list[RunEvent], b: list[RunEvent], world: _World) -> list[bool]:
    """One verdict per FEATURES entry, read from the runs' events (not from the script)."""
    finished = EventKind.TOOL_FINISHED
    return [
        world.together.is_set()
        and sum(_found([e], finished, tool="fetch", ok=True) for e in a) == 3,
        _found(a, EventKind.MESSAGE_ACCEPTED, seq=0, mode="queue")
        and _found(a, EventKind.MESSAGE_DELIVERED, seq=0),
        _found(a, finished, tool="draft", error="cancelled")
        and _found(a, EventKind.MESSAGE_DELIVERED, seq=1),
        _found(a, EventKind.APPROVAL_SETTLED, approved=True)
        and _found(a, finished, tool="publish", ok=True),
        _found(a, finished, tool="notify_mirror", error="side_effect_unknown"),
        _found(a, EventKind.TOOL_RETRY, tool="lookup")
        and _found(a, finished, tool="lookup", ok=True, attempts=2),
        _found(b, EventKind.RUN_ENDED, state="cancelled"),
    ]


def _summary(p: _Printer, outcomes: list[RunOutcome], checks: list[bool], left: list[str]) -> None:
    p.header("Summary")
    for label, outcome in zip("AB", outcomes, strict=True):
        m = outcome.metrics
        errors = ", ".join(e.code.value for e in outcome.errors) or "none"
        p.out(f"  run {label} ..{outcome.run_id[-6:]}  {outcome.state.value}")
        p.out(
            f"    model calls {m.model_calls}, tool steps {m.steps}, retries {m.retries}, "
            f"tool errors {m.tool_errors}, checkpoints {m.checkpoints}; errors: {errors}"
        )
    for feature, ok in zip(FEATURES, checks, strict=True):
        p.out(f"  [{'x' if ok else ' '}] {feature}")
    p.out(f"  threads left behind: {', '.join(left) if left else 'none'}")
    p.out("Next: examples/quickstart.py shows the API these runs used; docs/steering.md the rules.")


# ---------------------------------------------------------------------------------- the scenario


def run_demo(
    out: Out = print, *, store: CheckpointStore | None = None, timeline: Path | None = None
) -> list[RunOutcome]:
    """Run the demo, writing one line per event to `out`; returns the two runs' outcomes.

    Args:
        out: Where lines go (default `print`).
        store: Where checkpoints go (default: in memory). The runtime closes it at the end.
        timeline: Where the runs' HTML timeline goes (default: a file named after run A in
            the temp directory); its path is the last line.

    Returns:
        The outcomes of run A (FINISHED) and run B (CANCELLED), in that order.
    """
    threads_before = set(threading.enumerate())
    world = _World()
    p = _Printer(out)
    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.05, jitter=False))
    rt = Runtime(store=store, tools=_tools(world), config=config)
    try:
        for line in _LEGEND:
            out(line)
        agent = _ReleaseAgent()
        a = rt.start("prepare the 1.0 release notes", agent=agent, accept=_accept)
        events_a = _Host(rt, world, p, a, agent).watch()
        outcome_a = a.result(timeout=_WAIT)

        p.header("7. Cancel: a second run is cancelled while its tool runs")
        indexer = ScriptedAgent([plan(call("reindex", shard="archive"))], name="indexer")
        b = rt.start("rebuild the search index", agent=indexer)
        events_b = _Host(rt, world, p, b, indexer).watch()
        outcomes = [outcome_a, b.result(timeout=_WAIT)]
    finally:
        world.release_all()
        rt.shutdown(timeout=_WAIT)
    _summary(p, outcomes, _checks(events_a, events_b, world), _join_leftovers(threads_before))
    path = timeline or Path(tempfile.gettempdir()) / f"steerable-timeline-{outcome_a.run_id}.html"
    write_timeline(events_a + events_b, path)
    out(f"Timeline of both runs (open it in a browser): {path}")
    return outcomes


def _join_leftovers(before: set[threading.Thread]) -> list[str]:
    """Names of the demo's steerable threads still alive after a short join (none, normally)."""
    prefixes = ("steerable-", "ToolWorker-", "RunSupervisor-")
    alive = [t for t in set(threading.enumerate()) - before if t.name.startswith(prefixes)]
    for thread in alive:
        thread.join(_WAIT)
    return sorted(t.name for t in alive if t.is_alive())


def demo_ok(outcomes: list[RunOutcome]) -> bool:
    """Whether the runs ended as designed: A FINISHED after 2 messages, 2 tool errors and a
    retry; B CANCELLED."""
    if [o.state for o in outcomes] != [RunState.FINISHED, RunState.CANCELLED]:
        return False
    m = outcomes[0].metrics
    return (m.messages_delivered, m.tool_errors, m.retries) == (2, 2, 1)
