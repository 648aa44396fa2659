"""OpenTelemetry traces of runs (docs/observability.md), checked with the SDK's in-memory exporter.

Covered: span names, parents, GenAI attributes and timing order of a run with a model, two
parallel tools and two model calls; a hand-written agent's reasoning step; a failing tool's
status; a cancelled run; an interrupted plan with its steering markers; a retried call (one
span per attempt); a three-level subagent tree; a resumed run continuing its trace; trace
context in (traceparent, trace id, the host's current span) and bad trace context refused;
content capture off by default and on when asked; no OpenTelemetry import without a provider.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from steerable.actors import RetryableToolError, Runtime, SqliteStore, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    SubagentCall,
    Usage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: found"


class ModelAgent:
    """Says which model it calls and reports token usage, like a model adapter."""

    name = "writer"
    model = "gpt-test"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        if self.calls == 1:
            return Plan(
                steps=(call("lookup", term="a"), call("lookup", term="b")),
                usage=Usage(input_tokens=12, output_tokens=5),
            )
        return Finish(output="done", usage=Usage(input_tokens=30, output_tokens=7))


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp
    tp.shutdown()


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def spans_of(rt: Runtime, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert rt.flush_observers(WAIT)
    return sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def event_names(span: ReadableSpan) -> list[str]:
    return [e.name for e in span.events]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_spans_have_genai_names_parents_attributes_and_real_order(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with Runtime(tools=[lookup], tracer_provider=provider) as rt:
        handle = rt.start("write it", agent=ModelAgent())
        assert handle.result(WAIT).state is RunState.FINISHED
        spans = spans_of(rt, exporter)
    run = one(spans, "invoke_agent writer")
    chats = by_name(spans, "chat gpt-test")
    tools = by_name(spans, "execute_tool lookup")
    assert len(chats) == 2
    assert len(tools) == 2
    assert len(spans) == 5
    assert {trace_hex(s) for s in spans} == {handle.trace_id}
    assert parent_of(run) is None
    assert {parent_of(s) for s in chats + tools} == {span_id(run)}
    a = attrs(run)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "writer"
    assert a["steerable.run_id"] == handle.run_id
    assert a["steerable.state"] == "finished"
    assert a["steerable.revision"] == handle.revision
    first, second = chats
    assert first.kind is SpanKind.CLIENT
    c = attrs(first)
    assert c["gen_ai.operation.name"] == "chat"
    assert c["gen_ai.request.model"] == "gpt-test"
    assert (c["gen_ai.usage.input_tokens"], c["gen_ai.usage.output_tokens"]) == (12, 5)
    assert attrs(second)["gen_ai.usage.input_tokens"] == 30
    assert sorted(attrs(t)["gen_ai.tool.call.id"] for t in tools) == ["c1.0", "c1.1"]
    for t in tools:
        ta = attrs(t)
        assert ta["gen_ai.operation.name"] == "execute_tool"
        assert ta["gen_ai.tool.name"] == "lookup"
        assert ta["steerable.attempt"] == 1
        assert t.status.status_code is StatusCode.UNSET
    # Real times, in the run's order: the model call, then both tools, then the second call.
    assert run.start_time is not None
    assert run.end_time is not None
    for s in spans:
        assert s.start_time is not None
        assert s.end_time is not None
        assert run.start_time <= s.start_time <= s.end_time <= run.end_time
    assert first.end_time is not None
    assert second.start_time is not None
    assert all(first.end_time <= (t.start_time or 0) for t in tools)
    assert all((t.end_time or 0) <= second.start_time for t in tools)
    assert "steerable.checkpoint" not in event_names(run)  # the revision attribute says it


def test_a_hand_written_agent_gets_a_reasoning_step_and_failures_an_error_status(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise ValueError("no")

    agent = ScriptedAgent([plan(call("broken"))], name="plain")
    with Runtime(tools=[broken], tracer_provider=provider) as rt:
        rt.start("t", agent=agent).result(WAIT)
        spans = spans_of(rt, exporter)
    reasons = by_name(spans, "reason plain")
    assert len(reasons) == 2
    assert "gen_ai.request.model" not in attrs(reasons[0])
    failed = one(spans, "execute_tool broken")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "handler_error"
    assert attrs(failed)["error.type"] == "handler_error"


def test_a_cancelled_run_ends_its_spans_with_the_cancel(
    provider: TracerProvider, exporter: InMemorySpanExporter, gate: Gate
) -> None:
    agent = ScriptedAgent([plan(call("gate"))], name="stoppable")
    with Runtime(tools=[gate.tool()], tracer_provider=provider) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)
        assert handle.cancel("user pressed stop")
        assert handle.result(WAIT).state is RunState.CANCELLED
        spans = spans_of(rt, exporter)
    run = one(spans, "invoke_agent stoppable")
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "cancelled"
    assert attrs(run)["steerable.state"] == "cancelled"
    (cancel,) = [e for e in run.events if e.name == "steerable.cancel"]
    assert dict(cancel.attributes or {})["steerable.reason"] == "user pressed stop"
    stopped = one(spans, "execute_tool gate")
    assert attrs(stopped)["error.type"] == "cancelled"
    assert (stopped.end_time or 0) <= (run.end_time or 0)


def test_an_interrupted_plan_shows_the_steering_message_and_the_cut(
    provider: TracerProvider, exporter: InMemorySpanExporter, gate: Gate
) -> None:
    agent = ScriptedAgent([plan(call("gate"))], then=Finish(output="ok"), name="steered")
    with Runtime(tools=[gate.tool()], tracer_provider=provider) as rt:
        handle = rt.start("t", agent=agent)
        gate.wait_started(1)
        handle.send("stop that, do this", mode="interrupt")
        assert handle.result(WAIT).state is RunState.FINISHED
        spans = spans_of(rt, exporter)
    run = one(spans, "invoke_agent steered")
    names = event_names(run)
    assert names.count("steerable.steering") == 1
    assert names.index("steerable.steering") < names.index("steerable.plan_interrupted")
    assert names.index("steerable.plan_interrupted") < names.index("steerable.message_delivered")
    steering = run.events[names.index("steerable.steering")]
    assert dict(steering.attributes or {}) == {"steerable.seq": 0, "steerable.mode": "interrupt"}
    cut = one(spans, "execute_tool gate")
    assert attrs(cut)["error.type"] == "cancelled"
    # The answer comes from a model call after the cut.
    reasons = by_name(spans, "reason steered")
    assert (cut.end_time or 0) <= (reasons[-1].start_time or 0)


def test_a_retried_call_has_one_span_per_attempt(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @tool
    def flaky(ctx: ToolContext) -> str:
        """Fails on its first attempt."""
        if ctx.attempt == 1:
            raise RetryableToolError("busy")
        return "ok"

    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False))
    agent = ScriptedAgent([plan(call("flaky"))], name="retrier")
    with Runtime(tools=[flaky], tracer_provider=provider, config=config) as rt:
        rt.start("t", agent=agent).result(WAIT)
        spans = spans_of(rt, exporter)
    first, second = by_name(spans, "execute_tool flaky")
    assert [attrs(s)["gen_ai.tool.call.id"] for s in (first, second)] == ["c1.0", "c1.0"]
    assert [attrs(s)["steerable.attempt"] for s in (first, second)] == [1, 2]
    assert first.status.status_code is StatusCode.ERROR
    assert "steerable.retry" in event_names(first)
    assert second.status.status_code is StatusCode.UNSET
    assert attrs(second)["steerable.attempts"] == 2
    assert (first.end_time or 0) <= (second.start_time or 0)


def test_a_timed_out_model_call_ends_in_error_and_the_retry_gets_its_own_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    hold = threading.Event()

    def stuck(view: RunView) -> Finish:
        hold.wait(WAIT)
        return Finish(output="stale")

    agent = ScriptedAgent([stuck, Finish(output="fresh")], name="slow")
    config = RunConfig(model_timeout=0.05, retry=RetryPolicy(backoff=0.01, jitter=False))
    try:
        with Runtime(tracer_provider=provider, config=config) as rt:
            assert rt.start("t", agent=agent).result(WAIT).output == "fresh"
            spans = spans_of(rt, exporter)
    finally:
        hold.set()
    first, second = by_name(spans, "reason slow")
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "provider_timeout"
    assert "steerable.retry" in event_names(first)
    assert attrs(first)["steerable.retry"] == 1
    assert second.status.status_code is StatusCode.UNSET
    assert (first.end_time or 0) <= (second.start_time or 0)


class Delegator:
    """Delegates its task to `child` once, then finishes with the child's output."""

    def __init__(self, name: str, child: str | None) -> None:
        self.name = name
        self.child = child

    def decide(self, view: RunView) -> Plan | Finish:
        if self.child is not None and not view.last_results:
            return Plan(steps=(SubagentCall(agent=self.child, task=view.task),))
        if self.child is None and not view.last_results:
            return plan(call("lookup", term=view.task))
        return Finish(output=f"{self.name} done")


def test_a_three_level_subagent_tree_nests_under_each_step(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agents = {"middle": Delegator("middle", "leaf"), "leaf": Delegator("leaf", None)}
    with Runtime(tools=[lookup], agents=agents, tracer_provider=provider) as rt:
        handle = rt.start("deep", agent=Delegator("top", "middle"))
        assert handle.result(WAIT).state is RunState.FINISHED
        spans = spans_of(rt, exporter)
    top = one(spans, "invoke_agent top")
    step_middle = one(spans, "execute_tool middle")
    middle = one(spans, "invoke_agent middle")
    step_leaf = one(spans, "execute_tool leaf")
    leaf = one(spans, "invoke_agent leaf")
    tool_span = one(spans, "execute_tool lookup")
    assert parent_of(step_middle) == span_id(top)
    assert parent_of(middle) == span_id(step_middle)
    assert parent_of(step_leaf) == span_id(middle)
    assert parent_of(leaf) == span_id(step_leaf)
    assert parent_of(tool_span) == span_id(leaf)
    assert {trace_hex(s) for s in spans} == {handle.trace_id}
    assert attrs(step_middle)["gen_ai.tool.type"] == "agent"
    assert attrs(step_middle)["steerable.child_run_id"] == attrs(middle)["steerable.run_id"]
    assert attrs(leaf)["steerable.depth"] == 2
    for outer, inner in ((step_middle, middle), (step_leaf, leaf)):
        assert (outer.start_time or 0) <= (inner.start_time or 0)
        assert (inner.end_time or 0) <= (outer.end_time or 0)


def test_a_resumed_run_continues_its_trace(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"

    @tool(side_effect="write", requires_approval=True)
    def pay(amount: int) -> str:
        """Pay (a person approves first)."""
        return f"paid {amount}"

    first_exporter, second_exporter = InMemorySpanExporter(), InMemorySpanExporter()
    first_tp, second_tp = TracerProvider(), TracerProvider()
    first_tp.add_span_processor(SimpleSpanProcessor(first_exporter))
    second_tp.add_span_processor(SimpleSpanProcessor(second_exporter))
    agent = ScriptedAgent([plan(call("pay", amount=3))], name="payer")
    rt = Runtime(store=SqliteStore(db), tools=[pay], tracer_provider=first_tp)
    try:
        handle = rt.start("pay the bill", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
    finally:
        rt.shutdown(cancel_runs=False)
    before = one(list(first_exporter.get_finished_spans()), "invoke_agent payer")
    assert attrs(before)["steerable.stopped"] == "runtime shutdown"
    with Runtime(store=SqliteStore(db), tools=[pay], tracer_provider=second_tp) as rt2:
        resumed = rt2.resume(handle.run_id, agent=ScriptedAgent([], name="payer"))
        wait_event(resumed, EventKind.APPROVAL_REQUESTED)
        assert resumed.approve("c1.0")
        assert resumed.result(WAIT).state is RunState.FINISHED
        spans = spans_of(rt2, second_exporter)
    after = one(spans, "invoke_agent payer")
    assert trace_hex(after) == trace_hex(before) == handle.trace_id
    assert attrs(after)["steerable.run_id"] == handle.run_id
    assert attrs(after)["steerable.resumed_from"] >= 0
    assert one(spans, "execute_tool pay").status.status_code is StatusCode.UNSET
    first_tp.shutdown()
    second_tp.shutdown()


def test_a_traceparent_a_trace_id_or_the_current_span_carry_the_trace_in(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with Runtime(tools=[lookup], tracer_provider=provider) as rt:
        by_header = rt.start("t", agent=ScriptedAgent([], name="h"), traceparent=header)
        by_id = rt.start(
            "t", agent=ScriptedAgent([], name="i"), trace_id="4BF92F3577B34DA6A3CE929D0E0E4737"
        )
        tracer = provider.get_tracer("host")
        with tracer.start_as_current_span("web request") as request:
            by_context = rt.start("t", agent=ScriptedAgent([], name="c"))
        for h in (by_header, by_id, by_context):
            h.result(WAIT)
        spans = spans_of(rt, exporter)
    assert by_header.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    header_run = one(spans, "invoke_agent h")
    assert trace_hex(header_run) == by_header.trace_id
    assert parent_of(header_run) == 0x00F067AA0BA902B7
    assert by_id.trace_id == "4bf92f3577b34da6a3ce929d0e0e4737"
    assert trace_hex(one(spans, "invoke_agent i")) == by_id.trace_id
    context_run = one(spans, "invoke_agent c")
    assert by_context.trace_id == f"{request.get_span_context().trace_id:032x}"
    assert parent_of(context_run) == request.get_span_context().span_id


@pytest.mark.parametrize(
    ("trace_id", "traceparent"),
    [
        ("xyz", None),
        ("0" * 32, None),
        (None, "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
        (None, "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        (None, "garbage"),
        ("1" * 32, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ],
)
def test_bad_trace_context_is_refused_and_starts_nothing(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    trace_id: str | None,
    traceparent: str | None,
) -> None:
    with Runtime(tracer_provider=provider) as rt:
        with pytest.raises(ValueError, match="trace"):
            rt.start("t", agent=ScriptedAgent([]), trace_id=trace_id, traceparent=traceparent)
        assert rt.statistics()["runs_started"] == 0
        assert spans_of(rt, exporter) == []


SECRET_TASK = "the task text is content"


@pytest.mark.parametrize("capture", [False, True])
def test_content_is_recorded_only_when_capture_is_on(
    provider: TracerProvider, exporter: InMemorySpanExporter, capture: bool
) -> None:
    @tool(requires_approval=True)
    def send_mail(body: str) -> str:
        """Send a mail."""
        return "sent"

    agent = ScriptedAgent([plan(call("send_mail", body="very private words"))], name="mailer")
    with Runtime(tools=[send_mail], tracer_provider=provider, capture_content=capture) as rt:
        handle = rt.start(SECRET_TASK, agent=agent)
        wait_state(handle, RunState.WAITING)
        assert handle.approve("c1.0")
        handle.send("a private steering message")
        handle.result(WAIT)
        spans = spans_of(rt, exporter)
    recorded = json.dumps(
        [
            [attrs(s), [dict(e.attributes or {}) for e in s.events]]
            for s in spans  # every attribute and event attribute of every span
        ],
        default=str,
    )
    assert (SECRET_TASK in recorded) is capture
    assert ("very private words" in recorded) is capture
    if capture:
        assert attrs(one(spans, "invoke_agent mailer"))["steerable.task"] == SECRET_TASK


@pytest.mark.parametrize("provider_kind", ["noop", "sampled_out"])
def test_a_trace_that_records_nothing_costs_no_feed_traffic(provider_kind: str) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.trace import NoOpTracerProvider
    from opentelemetry.trace import TracerProvider as ApiProvider

    exporter = InMemorySpanExporter()
    sdk = TracerProvider(sampler=ALWAYS_OFF)
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    chosen: ApiProvider = NoOpTracerProvider() if provider_kind == "noop" else sdk
    with Runtime(tools=[lookup], tracer_provider=chosen) as rt:
        handle = rt.start("t", agent=ModelAgent())
        assert handle.result(WAIT).state is RunState.FINISHED
        assert rt.flush_observers(WAIT)
        assert rt.statistics()["feed_events_total"] == 0  # not even queued
        assert len(handle.trace_id) == 32
    assert exporter.get_finished_spans() == ()
    sdk.shutdown()


def test_without_a_provider_no_opentelemetry_code_is_imported_or_run() -> None:
    script = (
        "import sys, threading\n"
        "from steerable.actors import Runtime\n"
        "from steerable.actors.testing import ScriptedAgent\n"
        "with Runtime() as rt:\n"
        "    rt.start('t', agent=ScriptedAgent([])).result(10)\n"
        "    names = [t.name for t in threading.enumerate()]\n"
        "assert 'steerable-feed' not in names, names\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "print('clean')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"
