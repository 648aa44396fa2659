"""The records `protocol/_built.py` builds without validation equal the validated ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from steerable.protocol import Plan, SubagentCall, ToolCall, Usage
from steerable.protocol._built import built_plan, built_tool_call
from steerable.protocol._frozen import freeze

names = st.text(min_size=1, max_size=20)
ids = st.text(min_size=1, max_size=128)
values = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
argument_maps = st.dictionaries(st.text(max_size=8), values, max_size=4)


@given(names, argument_maps, ids)
def test_built_tool_call_equals_validated(
    name: str, arguments: dict[str, object], cid: str
) -> None:
    validated = ToolCall(name=name, arguments=arguments, id=cid)
    built = built_tool_call(validated.name, validated.arguments, cid)
    assert built == validated
    assert built.model_dump() == validated.model_dump()
    assert built.model_fields_set == validated.model_fields_set


@given(st.lists(st.tuples(names, argument_maps, ids), max_size=3), st.text(max_size=20))
def test_built_plan_equals_validated(
    raw: list[tuple[str, dict[str, object], str]], thought: str
) -> None:
    steps = tuple(ToolCall(name=n, arguments=a, id=i) for n, a, i in raw)
    usage = Usage(input_tokens=3, output_tokens=4)
    validated = Plan(steps=steps, usage=usage, thought=thought)
    built = built_plan(validated.steps, validated.usage, validated.thought)
    assert built == validated
    assert built.model_dump() == validated.model_dump()
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set


def test_built_plan_with_subagent_step_round_trips() -> None:
    sub = SubagentCall(agent="child", task="t", id="c1")
    validated = Plan(steps=(sub,), thought="x")
    built = built_plan(validated.steps, validated.usage, validated.thought)
    assert Plan.model_validate(built.model_dump()) == validated


def test_built_records_are_frozen() -> None:
    call = built_tool_call("t", freeze({"a": 1}), "c1")
    with pytest.raises(ValidationError):
        call.name = "other"  # type: ignore[misc]


def test_bad_input_still_errors_where_it_enters() -> None:
    with pytest.raises(ValidationError):
        ToolCall(name="t", id="")
    with pytest.raises(ValidationError):
        ToolCall(name="t", id="x" * 129)
    with pytest.raises(ValidationError):
        Plan.model_validate({"steps": [{"kind": "bogus"}]})


def test_built_records_have_the_validated_state() -> None:
    arguments = freeze({"a": 1})
    validated = Plan(steps=(ToolCall(name="t", arguments=arguments, id="c1"),), thought="x")
    built = built_plan((built_tool_call("t", arguments, "c1"),), validated.usage, "x")
    for b, v in ((built, validated), (built.steps[0], validated.steps[0])):
        assert list(b.__dict__) == list(v.__dict__)
        assert b.__pydantic_extra__ == v.__pydantic_extra__
        assert b.__pydantic_private__ == v.__pydantic_private__
    step, validated_step = built.steps[0], validated.steps[0]
    assert isinstance(step, ToolCall)
    assert isinstance(validated_step, ToolCall)
    assert hash(step.arguments) == hash(validated_step.arguments)
    copied = built.model_copy(update={"thought": "y"})
    assert copied == validated.model_copy(update={"thought": "y"})
    assert built.model_fields_set == {"steps", "usage", "thought"}  # the copy left it alone
