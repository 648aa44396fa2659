"""Model adapters end to end (issue 13): real SDKs against loopback fake servers.

Every scenario runs for both providers (OpenAI chat completions, Anthropic messages) unless it
is about one wire format. No network beyond 127.0.0.1; waits are on events and server records.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from steerable.actors import Runtime, SqliteStore, tool
from steerable.actors.models import AnthropicAgent, ModelAgent, OpenAIChatAgent
from steerable.actors.testing import (
    FakeAnthropicServer,
    FakeOpenAIServer,
    RecordedRequest,
    Reply,
    wait_event,
)
from steerable.protocol import (
    DecisionEntry,
    ErrorCode,
    EventKind,
    RetryPolicy,
    RunConfig,
    RunState,
    SteeringMode,
)

WAIT = 20.0
FAST_RETRY = RetryPolicy(max_retries=2, backoff=0.01, jitter=False)

Server = FakeOpenAIServer | FakeAnthropicServer


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool(side_effect="write", requires_approval=True)
def transfer(amount: int) -> str:
    """Move money.

    Args:
        amount: Cents to move.
    """
    return f"moved {amount}"


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def serve(provider: str, script: Any = (), **kw: Any) -> Server:
    if provider == "openai":
        return FakeOpenAIServer(script, **kw)
    return FakeAnthropicServer(script, **kw)


def agent_for(provider: str, server: Server, **kw: Any) -> ModelAgent:
    cls = OpenAIChatAgent if provider == "openai" else AnthropicAgent
    return cls("fake-model", base_url=server.base_url, name="chat", **kw)


def conversation(provider: str, request: RecordedRequest) -> list[tuple[str, str]]:
    """(role, what) pairs of a request's messages, provider-neutral, for assertions."""
    out: list[tuple[str, str]] = []
    for message in request.body["messages"]:
        role = message["role"]
        content = message.get("content")
        if provider == "openai":
            if role == "tool":
                out.append(("result", f"{message['tool_call_id']}={message['content']}"))
            elif message.get("tool_calls"):
                for tc in message["tool_calls"]:
                    out.append(("call", f"{tc['id']}:{tc['function']['name']}"))
            else:
                out.append((role, content or ""))
            continue
        for block in content:
            if block["type"] == "text":
                out.append((role, block["text"]))
            elif block["type"] == "tool_use":
                out.append(("call", f"{block['id']}:{block['name']}"))
            elif block["type"] == "tool_result":
                out.append(("result", f"{block['tool_use_id']}={block['content']}"))
    return [(r, w) for r, w in out if r != "system"]


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    with Runtime(tools=[add, transfer], config=RunConfig(retry=FAST_RETRY)) as rt:
        yield rt


# -- conversations -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_using_conversation_reaches_a_final_answer(
    provider: str, stream: bool, runtime: Runtime
) -> None:
    script = [Reply.call("add", {"a": 2, "b": 3}, id="call_a", usage=(30, 7)), Reply.say("5")]
    with serve(provider, script) as server:
        agent = agent_for(provider, server, instructions="Be exact.", stream=stream)
        outcome = runtime.start("what is 2+3?", agent=agent).result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == "5"
        assert outcome.metrics.input_tokens == 40
        assert outcome.metrics.output_tokens == 12
        first, second = server.requests
    assert conversation(provider, first) == [("user", "what is 2+3?")]
    assert conversation(provider, second) == [
        ("user", "what is 2+3?"),
        ("call", "call_a:add"),
        ("result", "call_a=5"),
    ]
    if provider == "openai":
        assert first.body["messages"][0] == {"role": "system", "content": "Be exact."}
        spec = next(t for t in first.body["tools"] if t["function"]["name"] == "add")
        assert spec["function"]["strict"] is True
        assert spec["function"]["parameters"]["properties"]["a"]["description"] == (
            "The first addend."
        )
    else:
        assert first.body["system"] == "Be exact."
        spec = next(t for t in first.body["tools"] if t["name"] == "add")
        assert spec["input_schema"]["required"] == ["a", "b"]
        assert spec["input_schema"]["properties"]["b"]["description"] == "The second addend."
    assert first.stream is stream


def test_parallel_tool_calls_run_and_answer_each_call(provider: str, runtime: Runtime) -> None:
    script = [
        Reply.calls(("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2}), ids=["p1", "p2"]),
        Reply.say("2 and 4"),
    ]
    with serve(provider, script) as server:
        handle = runtime.start("sums", agent=agent_for(provider, server))
        assert handle.result(timeout=WAIT).output == "2 and 4"
        second = server.requests[1]
    assert conversation(provider, second)[1:] == [
        ("call", "p1:add"),
        ("call", "p2:add"),
        ("result", "p1=2"),
        ("result", "p2=4"),
    ]
    results = [e for e in handle.events() if e.kind is EventKind.TOOL_FINISHED]
    assert sorted(e.data["call_id"] for e in results) == ["p1", "p2"]


def test_a_queued_steering_message_is_a_user_turn_after_the_results(
    provider: str, runtime: Runtime
) -> None:
    gate_open = threading.Event()
    seen: list[int] = []

    @tool
    def slow(x: int) -> int:
        seen.append(x)
        assert gate_open.wait(WAIT)
        return x

    script = [Reply.call("slow", {"x": 1}, id="s1"), Reply.say("done")]
    with serve(provider, script) as server:
        handle = runtime.start("t", agent=agent_for(provider, server), tools=[slow])
        wait_event(handle, EventKind.TOOL_STARTED)
        handle.send("also check the weather")  # queued: delivered after the plan
        wait_event(handle, EventKind.MESSAGE_ACCEPTED)
        gate_open.set()
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        second = server.requests[1]
    assert conversation(provider, second) == [
        ("user", "t"),
        ("call", "s1:slow"),
        ("result", "s1=1"),
        ("user", "also check the weather"),
    ]


def test_a_denied_approval_is_reported_to_the_model(provider: str, runtime: Runtime) -> None:
    script = [Reply.call("transfer", {"amount": 500}, id="t1"), Reply.say("ok, I will not")]
    with serve(provider, script) as server:
        handle = runtime.start("pay", agent=agent_for(provider, server))
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        assert handle.deny("t1", reason="too much")
        assert handle.result(timeout=WAIT).output == "ok, I will not"
        second = server.requests[1]
    (result,) = [w for r, w in conversation(provider, second) if r == "result"]
    assert result.startswith("t1=error (approval_denied): a person denied transfer: too much")
    if provider == "anthropic":
        assert second.body["messages"][-1]["content"][0]["is_error"] is True


# -- cancellation ---------------------------------------------------------------------------


def test_an_interrupt_during_a_streaming_call_closes_it_at_once_and_asks_again(
    provider: str, runtime: Runtime
) -> None:
    script = [Reply.never_ending("Let me think"), Reply.say("Paris")]
    with serve(provider, script) as server:
        agent = agent_for(provider, server, stream=True)
        handle = runtime.start("capital of France?", agent=agent)
        delta = wait_event(handle, EventKind.MODEL_DELTA)
        assert delta.data["model_call"] == 1
        assert delta.data["live"] is True
        sent = time.monotonic()
        handle.send("answer in one word", mode=SteeringMode.INTERRUPT)
        closed = server.wait_closed(0, timeout=WAIT)
        assert closed - sent < WAIT / 10, f"closed {closed - sent:.3f}s after the interrupt"
        outcome = handle.result(timeout=WAIT)
        assert outcome.output == "Paris"
        first, second = server.requests
    assert not first.completed
    turns = conversation(provider, second)
    assert turns[0] == ("user", "capital of France?")
    assert ("user", "answer in one word") in turns
    assert ("user", "[steerable] model call 1 was interrupted by a user message") in turns


def test_cancel_during_a_model_call_closes_the_request(provider: str, runtime: Runtime) -> None:
    with serve(provider, [Reply.never_ending()]) as server:
        handle = runtime.start("t", agent=agent_for(provider, server, stream=True))
        wait_event(handle, EventKind.MODEL_DELTA)
        sent = time.monotonic()
        handle.cancel("stop")
        closed = server.wait_closed(0, timeout=WAIT)
        outcome = handle.result(timeout=WAIT)
    # The cancel closed it, not a timeout: far sooner than WAIT. (A latency bound belongs in
    # the benchmarks; on a loaded machine a tight one here only measures the load.)
    assert closed - sent < WAIT / 10
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert outcome.error.details["abandoned"] == []


def test_the_model_calls_cancel_signal_reaches_a_sync_decide(runtime: Runtime) -> None:
    signalled: list[str | None] = []

    class Waiting:
        def decide(self, view: Any) -> Any:
            assert view.call is not None
            assert view.call.number == 1
            view.call.emit({"type": "text", "text": "hmm"})
            assert view.call.wait(WAIT)  # woken by the cancel, not by the timeout
            signalled.append(view.call.reason)
            raise RuntimeError("stopped")

    handle = runtime.start("t", agent=Waiting())
    wait_event(handle, EventKind.MODEL_DELTA)
    handle.cancel("enough")
    assert handle.result(timeout=WAIT).state is RunState.CANCELLED
    assert signalled == ["enough"]


# -- errors and retries ----------------------------------------------------------------------


def test_a_rate_limit_is_retried_after_retry_after(provider: str) -> None:
    script = [
        Reply.fail(429, "slow down", code="rate_limit_exceeded", retry_after=0.3),
        Reply.say("ok"),
    ]
    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.001, jitter=False))
    with serve(provider, script) as server, Runtime(config=config) as rt:
        handle = rt.start("t", agent=agent_for(provider, server))
        outcome = handle.result(timeout=WAIT)
        first, second = server.requests
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "ok"
    assert second.at - first.at >= 0.3
    (retry,) = [e for e in handle.events() if e.kind is EventKind.ERROR]
    assert retry.data["code"] == "provider_error"
    assert retry.data["delay"] >= 0.3 - 1e-9


def test_server_errors_are_retried_then_end_the_run_with_provider_error(
    provider: str, runtime: Runtime
) -> None:
    with serve(provider, default=Reply.fail(500, "boom", code="server_error")) as server:
        outcome = runtime.start("t", agent=agent_for(provider, server)).result(timeout=WAIT)
        assert len(server.requests) == 1 + FAST_RETRY.max_retries
    assert outcome.state is RunState.ERROR
    error = outcome.error
    assert error is not None
    assert error.code is ErrorCode.PROVIDER_ERROR
    assert error.retryable is True
    assert error.details["status"] == 500
    assert error.details["reason"] == "server"
    assert error.details["request_id"] == "req_fake"


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (400, "bad request", "invalid_request"),
        (401, "no key", "auth"),
        (400, "prompt is too long: 300000 tokens > 200000 maximum", "context_overflow"),
    ],
)
def test_client_errors_and_context_overflow_are_final(
    provider: str, runtime: Runtime, status: int, message: str, reason: str
) -> None:
    with serve(provider, [Reply.fail(status, message, code="invalid_request_error")]) as server:
        outcome = runtime.start("t", agent=agent_for(provider, server)).result(timeout=WAIT)
        assert len(server.requests) == 1
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.PROVIDER_ERROR
    assert outcome.error.retryable is False
    assert outcome.error.details["reason"] == reason
    assert outcome.error.details["status"] == status


def test_a_malformed_body_is_a_retryable_provider_error(provider: str, runtime: Runtime) -> None:
    with serve(provider, [Reply.garbage(), Reply.say("fine")]) as server:
        outcome = runtime.start("t", agent=agent_for(provider, server)).result(timeout=WAIT)
        assert len(server.requests) == 2
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "fine"


def test_a_hand_written_decide_raising_retryable_tool_error_is_retried(runtime: Runtime) -> None:
    from steerable.actors import RetryableToolError
    from steerable.protocol import Finish

    calls: list[int] = []

    class Flaky:
        def decide(self, view: Any) -> Any:
            calls.append(view.model_calls)
            if len(calls) == 1:
                raise RetryableToolError("upstream busy", details={"retry_after": 0.05})
            return Finish(output="second time")

    outcome = runtime.start("t", agent=Flaky()).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "second time"
    assert len(calls) == 2


# -- structured output ----------------------------------------------------------------------


class Answer(pydantic.BaseModel):
    city: str
    population: int


def test_structured_output_is_corrected_once_then_accepted(provider: str, runtime: Runtime) -> None:
    script = [
        Reply.call("final_answer", {"city": "Lisbon", "population": "many"}, id="f1"),
        Reply.call("final_answer", {"city": "Lisbon", "population": 545000}, id="f2"),
    ]
    with serve(provider, script) as server:
        agent = agent_for(provider, server, output_type=Answer)
        outcome = runtime.start("biggest city?", agent=agent).result(timeout=WAIT)
        first, second = server.requests
    assert outcome.state is RunState.FINISHED
    assert outcome.output == {"city": "Lisbon", "population": 545000}
    names = [
        t["function"]["name"] if provider == "openai" else t["name"] for t in first.body["tools"]
    ]
    assert "final_answer" in names
    turns = conversation(provider, second)
    assert turns[1] == ("call", "final_1:final_answer")
    role, text = turns[2]
    assert role == "result"
    assert text.startswith("final_1=finish rejected: the final_answer answer")
    assert "population" in text


# -- resume ---------------------------------------------------------------------------------


def test_resume_continues_the_same_conversation_with_matching_call_ids(
    provider: str, tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    script = [Reply.call("transfer", {"amount": 7}, id="call_xyz"), Reply.say("paid")]
    with serve(provider, script) as server:
        rt = Runtime(store=SqliteStore(db), tools=[add, transfer])
        try:
            handle = rt.start("pay 7", agent=agent_for(provider, server))
            wait_event(handle, EventKind.APPROVAL_REQUESTED)
        finally:
            rt.shutdown(cancel_runs=False)
        with Runtime(store=SqliteStore(db), tools=[add, transfer]) as rt2:
            resumed = rt2.resume(handle.run_id, agent=agent_for(provider, server))
            wait_event(resumed, EventKind.APPROVAL_REQUESTED)
            assert resumed.approve("call_xyz")
            outcome = resumed.result(timeout=WAIT)
            second = server.requests[1]
    assert outcome.output == "paid"
    assert conversation(provider, second) == [
        ("user", "pay 7"),
        ("call", "call_xyz:transfer"),
        ("result", "call_xyz=moved 7"),
    ]


# -- streaming ------------------------------------------------------------------------------


def test_streamed_deltas_are_live_events_and_the_final_text_is_stored(
    provider: str, tmp_path: Path
) -> None:
    text = "The answer is forty-two."
    with (
        serve(provider, [Reply.say(text, usage=(11, 9))]) as server,
        Runtime(store=SqliteStore(tmp_path / "r.db")) as rt,
    ):
        handle = rt.start("t", agent=agent_for(provider, server, stream=True))
        outcome = handle.result(timeout=WAIT)
        replay = rt.replay(handle.run_id)
    deltas = [e for e in handle.events() if e.kind is EventKind.MODEL_DELTA]
    assert "".join(e.data["text"] for e in deltas if e.data["type"] == "text") == text
    assert all(e.data["model_call"] == 1 and e.data["live"] for e in deltas)
    assert outcome.output == text
    assert outcome.metrics.input_tokens == 11
    assert outcome.metrics.output_tokens == 9
    assert all(e.kind is not EventKind.MODEL_DELTA for e in replay.events)
    entries = [e for e in replay.transcript if isinstance(e, DecisionEntry)]
    assert entries[-1].decision.output == text  # type: ignore[union-attr]


def test_streamed_tool_call_deltas_rebuild_the_call(provider: str, runtime: Runtime) -> None:
    script = [Reply.call("add", {"a": 20, "b": 22}, id="sc1"), Reply.say("42")]
    with serve(provider, script) as server:
        handle = runtime.start("t", agent=agent_for(provider, server, stream=True))
        assert handle.result(timeout=WAIT).output == "42"
    deltas = [
        e.data
        for e in handle.events()
        if e.kind is EventKind.MODEL_DELTA and e.data["model_call"] == 1
    ]
    pieces = "".join(d["arguments"] for d in deltas if d["type"] == "tool_call")
    assert json.loads(pieces) == {"a": 20, "b": 22}
    results = [e for e in handle.events() if e.kind is EventKind.TOOL_FINISHED]
    assert [e.data["call_id"] for e in results] == ["sc1"]


# -- ids ------------------------------------------------------------------------------------


def test_a_model_that_reuses_call_ids_gets_unique_ones(runtime: Runtime) -> None:
    script = [
        Reply.call("add", {"a": 1, "b": 2}, id="call_0"),
        Reply.call("add", {"a": 3, "b": 4}, id="call_0"),  # reused across turns
        Reply.say("done"),
    ]
    with serve("openai", script) as server:
        handle = runtime.start("t", agent=agent_for("openai", server))
        assert handle.result(timeout=WAIT).output == "done"
        third = server.requests[2]
    turns = conversation("openai", third)
    assert turns[1:] == [
        ("call", "call_0:add"),
        ("result", "call_0=3"),
        ("call", "c2.0:add"),
        ("result", "c2.0=7"),
    ]


def test_requests_never_leave_the_loopback(provider: str) -> None:
    with serve(provider, [Reply.say("x")]) as server:
        assert server.base_url.startswith("http://127.0.0.1:")


def test_a_fork_continues_the_conversation_with_the_same_call_ids(
    provider: str, runtime: Runtime
) -> None:
    script = [
        Reply.call("add", {"a": 1, "b": 1}, id="k1"),
        Reply.say("first ending"),
        Reply.call("add", {"a": 2, "b": 2}, id="k1"),  # the fork's model reuses an id
        Reply.say("second ending"),
    ]
    with serve(provider, script) as server:
        handle = runtime.start("t", agent=agent_for(provider, server))
        assert handle.result(timeout=WAIT).output == "first ending"
        # The revision after the first plan's results: the boundary before model call 2.
        revisions = runtime.revisions(handle.run_id)
        boundary = next(r.revision for r in revisions if r.transcript_len == 2)
        fork = runtime.fork(handle.run_id, boundary, agent=agent_for(provider, server))
        assert fork.result(timeout=WAIT).output == "second ending"
        fork_request = server.requests[3]
    assigned = "c2.0" if provider == "openai" else "c2_0"  # Anthropic ids take no dots
    assert conversation(provider, fork_request)[1:] == [
        ("call", "k1:add"),
        ("result", "k1=2"),
        ("call", f"{assigned}:add"),
        ("result", f"{assigned}=4"),
    ]


def test_provider_usage_feeds_the_token_budget(provider: str) -> None:
    script = [Reply.call("add", {"a": 1, "b": 2}, usage=(30, 7)), Reply.say("never asked")]
    config = RunConfig(token_budget=20)
    with serve(provider, script) as server, Runtime(tools=[add], config=config) as rt:
        outcome = rt.start("t", agent=agent_for(provider, server)).result(timeout=WAIT)
        assert len(server.requests) == 1
    assert outcome.state is RunState.EXHAUSTED
    assert outcome.error is not None
    assert outcome.error.details["budget"] == "token_budget"
    assert outcome.metrics.input_tokens == 30


def test_a_model_delegates_to_a_subagent_through_its_tool() -> None:
    from steerable.actors.testing import ScriptedAgent
    from steerable.protocol import Finish

    child = ScriptedAgent([], then=Finish(output="Hotel Avenida"), name="researcher")
    script = [
        Reply.call("subagent_researcher", {"task": "find a hotel"}, id="d1"),
        Reply.say("Stay at Hotel Avenida."),
    ]
    with serve("openai", script) as server, Runtime(agents={"researcher": child}) as rt:
        outcome = rt.start("plan", agent=agent_for("openai", server)).result(timeout=WAIT)
        first, second = server.requests
    assert outcome.output == "Stay at Hotel Avenida."
    names = [t["function"]["name"] for t in first.body["tools"]]
    assert names == ["subagent_researcher"]
    assert child.views[0].task == "find a hotel"
    assert conversation("openai", second)[1:] == [
        ("call", "d1:subagent_researcher"),
        ("result", "d1=Hotel Avenida"),
    ]
