"""OpenTelemetry metrics (docs/observability.md), read with the SDK's in-memory metric reader.

Covered: runs counted by final state, model-call and tool-call duration histograms (one point
per call), token usage, retries, abandoned calls, and the observable gauges read from the
runtime's statistics (live and parked runs, inbox depth, abandoned workers).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from steerable.actors import RetryableToolError, Runtime, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, plan, wait_state
from steerable.protocol import AskUser, Finish, Plan, RetryPolicy, RunConfig, RunState, Usage

WAIT = 10.0


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_runs_calls_retries_and_abandonment_are_measured() -> None:
    release = threading.Event()

    @tool
    def flaky(ctx: ToolContext) -> str:
        """Fails once."""
        if ctx.attempt == 1:
            raise RetryableToolError("busy")
        return "ok"

    @tool(timeout=0.05)
    def hangs() -> str:
        """Ignores its timeout."""
        release.wait(WAIT)
        return "late"

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    config = RunConfig(retry=RetryPolicy(max_retries=0, backoff=0.01, jitter=False))
    retry_config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False))
    ok_agent = ScriptedAgent(
        [Plan(steps=(call("flaky"),), usage=Usage(input_tokens=9, output_tokens=4))], name="ok"
    )
    try:
        with Runtime(tools=[flaky, hangs], meter_provider=meters, config=config) as rt:
            rt.start("a", agent=ok_agent, config=retry_config).result(WAIT)
            rt.start("b", agent=ScriptedAgent([plan(call("hangs"))], name="hung")).result(WAIT)
            bad = ScriptedAgent([ValueError("model broke")], name="bad")
            assert rt.start("c", agent=bad).result(WAIT).state is RunState.ERROR
            assert rt.flush_observers(WAIT)
            points = _points(reader)
            release.set()
    finally:
        release.set()
        meters.shutdown()
    runs = {
        (p.attributes["gen_ai.agent.name"], p.attributes["steerable.state"]): p.value
        for p in points["steerable.runs"]
    }
    assert runs == {("ok", "finished"): 1, ("hung", "finished"): 1, ("bad", "error"): 1}
    tools = {
        (p.attributes["gen_ai.tool.name"], p.attributes.get("error.type")): p.count
        for p in points["steerable.tool_call.duration"]
    }
    assert tools == {("flaky", "handler_error"): 1, ("flaky", None): 1, ("hangs", "timeout"): 1}
    assert sum(p.count for p in points["steerable.model_call.duration"]) == 5
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert tokens == {"input": 9, "output": 4}
    assert [p.value for p in points["steerable.retries"]] == [1]
    assert [p.value for p in points["steerable.calls.abandoned"]] == [1]
    gauges = {name: [p.value for p in points[name]] for name in points if ".runs.l" in name}
    assert gauges == {"steerable.runs.live": [0]}


def test_gauges_show_parked_runs() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    agent = ScriptedAgent([AskUser(question="which one?")], then=Finish(output=1), name="asker")
    try:
        with Runtime(meter_provider=meters) as rt:
            handle = rt.start("t", agent=agent)
            wait_state(handle, RunState.WAITING)
            # Passivation follows the wait on the supervisor's thread: wait for the directory
            # to show it (as tests/test_passivation.py does), then read the gauges once.
            tick = threading.Event()
            for _ in range(int(WAIT / 0.005)):
                if rt.statistics()["runs_passivated"] == 1:
                    break
                tick.wait(0.005)
            points = _points(reader)
            assert points["steerable.runs.parked"][0].value == 1
            assert points["steerable.runs.live"][0].value == 0
            handle.send("the first")
            assert handle.result(WAIT).state is RunState.FINISHED
    finally:
        meters.shutdown()
