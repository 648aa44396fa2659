"""A real model as an agent: a tool, a steering message and an approval (docs/models.md).

    python examples/chat_agent.py

By default the model is the test kit's loopback fake OpenAI server, scripted like a model
would answer, so this runs anywhere (CI runs it). Against a real endpoint:

    OPENAI_API_KEY=... [OPENAI_BASE_URL=http://localhost:8000/v1] [OPENAI_MODEL=...] python ...
    ANTHROPIC_API_KEY=... [ANTHROPIC_MODEL=...] python examples/chat_agent.py

(any OpenAI-compatible server works through `OPENAI_BASE_URL`: vLLM, Ollama, LiteLLM...).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from steerable.actors import Runtime, tool
from steerable.actors.models import AnthropicAgent, ModelAgent, OpenAIChatAgent
from steerable.actors.testing import FakeOpenAIServer, RecordedRequest, Reply
from steerable.protocol import EventKind, RunConfig, RunState

steered = threading.Event()


@tool
def get_weather(city: str) -> str:
    """The weather in a city today.

    Args:
        city: The city's name, in English.
    """
    steered.wait(5.0)  # the host steers the run while this call runs
    return f"{city}: 21 C, sunny"


@tool(side_effect="write", requires_approval=True)
def book_table(restaurant: str, time: str) -> str:
    """Book a table (a person approves each booking).

    Args:
        restaurant: Where.
        time: When, as HH:MM.
    """
    return f"booked {restaurant} at {time}"


def fake_model(request: RecordedRequest) -> Reply:
    """What a model would answer at each turn of this conversation."""
    turn = sum(1 for m in request.body["messages"] if m["role"] == "assistant")
    if turn == 0:
        return Reply.call("get_weather", {"city": "Lisbon"}, text="Checking the weather.")
    if turn == 1:
        return Reply.call("book_table", {"restaurant": "Taberna", "time": "20:00"})
    return Reply.say("Lisbon is sunny (21 C) and your table at Taberna is booked for 20:00.")


def make_agent(server: FakeOpenAIServer | None) -> ModelAgent:
    instructions = "You are a concise travel assistant. Use the tools."
    if server is not None:
        return OpenAIChatAgent("fake-model", base_url=server.base_url, instructions=instructions,
                               stream=True)  # fmt: skip
    if os.environ.get("ANTHROPIC_API_KEY") and not os.environ.get("OPENAI_API_KEY"):
        model = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        return AnthropicAgent(model, instructions=instructions, stream=True)
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    return OpenAIChatAgent(model, base_url=os.environ.get("OPENAI_BASE_URL"),
                           instructions=instructions, stream=True)  # fmt: skip


def main() -> None:
    real = any(
        os.environ.get(k) for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")
    )
    server = None if real else FakeOpenAIServer(fake_model)
    where = "a real endpoint" if server is None else f"the fake OpenAI server at {server.base_url}"
    print("model:", where)
    try:
        agent = make_agent(server)
        with Runtime(tools=[get_weather, book_table], config=RunConfig(max_model_calls=8)) as rt:
            handle = rt.start("What's the weather in Lisbon? Then find me dinner.", agent=agent)
            streamed: list[str] = []
            for event in handle.events(timeout=120):
                data: dict[str, Any] = event.data
                if event.kind is EventKind.MODEL_DELTA and data["type"] == "text":
                    streamed.append(data["text"])
                elif event.kind is EventKind.TOOL_STARTED:
                    print(f"tool {data['tool']} started ({data['call_id']})")
                    if data["tool"] == "get_weather" and not steered.is_set():
                        handle.send("Book a table for 20:00, please.")
                        print("host: steered the run while get_weather ran")
                        steered.set()
                elif event.kind is EventKind.APPROVAL_REQUESTED:
                    print(f"approval: {data['tool']} {data['arguments']} -> approved")
                    handle.approve(data["call_id"])
                elif event.kind is EventKind.TOOL_FINISHED:
                    print(f"tool {data['tool']} finished: {'ok' if data['ok'] else data['error']}")
            outcome = handle.result(timeout=120)
        print("streamed:", "".join(streamed)[:80])
        print(f"final: {outcome.state.value}: {outcome.output}")
        print(f"tokens: {outcome.metrics.input_tokens} in, {outcome.metrics.output_tokens} out")
        assert outcome.state is RunState.FINISHED, outcome.error
        if server is not None:
            # The steering message reached the model as a user turn, after the tool's result.
            roles = [(m["role"], m.get("content")) for m in server.requests[1].body["messages"]]
            assert roles[-1] == ("user", "Book a table for 20:00, please."), roles
            assert roles[-2][0] == "tool"
            print("the model saw the steering message as a user turn after the tool result")
    finally:
        if server is not None:
            server.close()
    print("chat_agent ok")


if __name__ == "__main__":
    main()
