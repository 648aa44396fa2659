"""Events a UI can render: each kind's payload (docs/states-and-errors.md, "Events"), bounded
previews of values, and no secret in clear."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from steerable.actors import Runtime, tool
from steerable.actors._machine.preview import PREVIEW_CHARS, PREVIEW_DEPTH, PREVIEW_ITEMS, preview
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import AskUser, EventKind, Finish, Plan, RunEvent, ToolCall

WAIT = 10.0


@tool(side_effect="none")
def echo(text: str, token: SecretStr | None = None) -> str:
    return text.upper()


@tool(side_effect="none")
def fail() -> str:
    raise ValueError("no luck")


def _events(agent: Any) -> list[RunEvent]:
    with Runtime(tools=[echo, fail]) as rt:
        handle = rt.start("the task", agent=agent)
        handle.result(timeout=WAIT)
        return list(handle.events())


def _of(events: list[RunEvent], kind: EventKind) -> list[dict[str, Any]]:
    return [e.data for e in events if e.kind is kind]


def test_tool_events_carry_arguments_values_and_errors() -> None:
    plan = Plan(
        steps=[
            ToolCall(name="echo", arguments={"text": "hi", "token": "s3cr3t-token-XYZ"}),
            ToolCall(name="fail"),
        ],
        thought="look it up",
    )
    events = _events(ScriptedAgent([plan, Finish(output={"answer": 42})]))
    started = _of(events, EventKind.TOOL_STARTED)
    assert started[0]["tool"] == "echo"
    assert started[0]["arguments"]["text"] == "hi"
    assert started[0]["arguments"]["token"].startswith("secret:sha256:")
    assert started[1]["arguments"] == {}
    finished = {d["tool"]: d for d in _of(events, EventKind.TOOL_FINISHED)}
    assert finished["echo"]["ok"] is True
    assert finished["echo"]["value"] == "HI"
    assert finished["fail"]["ok"] is False
    assert finished["fail"]["error"] == "handler_error"
    assert "no luck" in finished["fail"]["message"]
    assert finished["fail"]["duration"] >= 0
    reasoned = _of(events, EventKind.REASONING_FINISHED)
    assert reasoned[0]["decision"] == "plan"
    assert reasoned[0]["thought"] == "look it up"
    assert [s["tool"] for s in reasoned[0]["steps"]] == ["echo", "fail"]
    assert reasoned[0]["steps"][0]["arguments"]["token"].startswith("secret:sha256:")
    assert reasoned[1] == {
        "model_call": 2,
        "decision": "finish",
        "output": {"answer": 42},
        "input_tokens": 0,  # the decision's usage (docs/states-and-errors.md)
        "output_tokens": 0,
    }
    (ended,) = _of(events, EventKind.RUN_ENDED)
    assert ended["state"] == "finished"
    assert ended["output"] == {"answer": 42}
    assert ended["revision"] >= 1
    assert "s3cr3t-token-XYZ" not in repr(events)


def test_ask_user_shows_its_question_and_long_values_are_cut() -> None:
    long = "x" * (PREVIEW_CHARS + 100)
    agent = ScriptedAgent([Plan(steps=[ToolCall(name="echo", arguments={"text": long})]),
                           AskUser(question="which one?")])  # fmt: skip
    with Runtime(tools=[echo]) as rt:
        handle = rt.start("t", agent=agent)
        for event in handle.events(timeout=WAIT):
            if event.kind is EventKind.REASONING_FINISHED and event.data["decision"] == "ask_user":
                assert event.data["question"] == "which one?"
                break
        handle.cancel()
        handle.result(timeout=WAIT)
        everything = list(handle.events())
    (started,) = _of(everything, EventKind.TOOL_STARTED)
    assert started["arguments"]["text"] == "x" * PREVIEW_CHARS + "…(+100 chars)"
    (finished,) = _of(everything, EventKind.TOOL_FINISHED)
    assert finished["value"].endswith("…(+100 chars)")


def test_previews_are_bounded_in_items_and_depth() -> None:
    assert preview(list(range(PREVIEW_ITEMS + 5)))[-1] == "…(+5 items)"
    wide = preview({str(i): i for i in range(PREVIEW_ITEMS + 3)})
    assert len(wide) == PREVIEW_ITEMS + 1
    assert wide["…"] == "(+3 items)"
    deep: Any = "bottom"
    for _ in range(PREVIEW_DEPTH + 3):
        deep = [deep]
    cut = preview(deep)
    for _ in range(PREVIEW_DEPTH):
        cut = cut[0]
    assert cut == "<list of 1>"
    assert preview(b"\x00" * 10) == "<10 bytes>"
    assert preview({"k": SecretStr("pw")})["k"].startswith("secret:sha256:")
    assert preview(3) == 3
    assert preview(None) is None


def test_a_call_without_arguments_shows_one_unchangeable_empty_mapping() -> None:
    # Shared so an event allocates nothing more for it (docs/performance.md, "Wave 4: events
    # and loop, session 6"); unchangeable, since every event holds the same one.
    agent = ScriptedAgent([Plan(steps=(ToolCall(name="fail"),)), Finish(output="done")])
    events = _events(agent)
    started = _of(events, EventKind.TOOL_STARTED)[0]["arguments"]
    step = _of(events, EventKind.REASONING_FINISHED)[0]["steps"][0]["arguments"]
    assert started == {}
    assert isinstance(started, dict)
    assert step is started
    with pytest.raises(TypeError):
        started["x"] = 1
    event = next(e for e in events if e.kind is EventKind.TOOL_STARTED)
    assert RunEvent.model_validate_json(event.model_dump_json()).data == event.data


def test_the_benchs_thin_events_switch_reaches_every_payload_w1_emits() -> None:
    """tests/bench/w1_loop.py measures the richer payloads against thin ones by stubbing the
    machine's payload builders: if a builder moves, this fails instead of the bench measuring
    nothing."""
    from tests.bench.w1_loop import LoopAgent, config_for, noop, thin_events

    def w1_events() -> list[RunEvent]:
        with Runtime(tools=[noop]) as rt:
            handle = rt.start("w1", agent=LoopAgent(2), config=config_for(2))
            handle.result(timeout=WAIT)
            return list(handle.events())

    with thin_events():
        thin = w1_events()
    rich = w1_events()
    assert [e.kind for e in thin] == [e.kind for e in rich]
    for kind in (EventKind.TOOL_STARTED, EventKind.TOOL_FINISHED, EventKind.RUN_ENDED):
        assert _of(thin, kind)
        assert all(data == {} for data in _of(thin, kind))
        assert all(data != {} for data in _of(rich, kind))
    assert all("decision" not in d for d in _of(thin, EventKind.REASONING_FINISHED))
    assert all("decision" in d for d in _of(rich, EventKind.REASONING_FINISHED))
