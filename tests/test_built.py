"""The records `protocol/_built.py` builds without validation equal the validated ones."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from steerable.actors import ToolContext
from steerable.actors._engine.cancel import CancelScope
from steerable.actors._stores.lease import Lease, Owner, _lease
from steerable.actors._tools.context import tool_context
from steerable.protocol import (
    AgentError,
    AskUser,
    DecisionEntry,
    ErrorCode,
    Finish,
    Plan,
    SubagentCall,
    ToolCall,
    ToolResult,
    TranscriptEntry,
    Usage,
    UserMessage,
)
from steerable.protocol._base import slot_twin
from steerable.protocol._built import (
    built_budgets,
    built_decision_entry,
    built_plan,
    built_tool_call,
    built_tool_result,
    built_view,
)
from steerable.protocol._errors import DEFAULT_RETRYABLE
from steerable.protocol._frozen import freeze
from steerable.protocol._view import Budgets, RunView, Transcript

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


@given(
    st.integers(min_value=0, max_value=2**40),
    st.sampled_from(
        [
            Plan(steps=(ToolCall(name="t", arguments={"a": [1]}, id="c1"),), thought="x"),
            Finish(output={"k": [1, 2]}),
            AskUser(question="which?"),
        ]
    ),
)
def test_built_decision_entry_equals_validated(
    model_call: int, decision: Plan | Finish | AskUser
) -> None:
    validated = DecisionEntry(model_call=model_call, decision=decision)
    built = built_decision_entry(model_call, decision)
    assert built == validated
    assert built.decision is decision  # kept as it is, as validation keeps it
    assert built.model_dump() == validated.model_dump()
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set
    assert DecisionEntry.model_validate(built.model_dump()) == validated


def test_built_decision_entry_validates_what_is_not_exact() -> None:
    class MyFinish(Finish):
        pass

    entry = built_decision_entry(True, Finish(output=1))
    assert type(entry.model_call) is int  # validated: a bool is not kept as the number
    sub = built_decision_entry(1, MyFinish(output=1))
    assert sub == DecisionEntry(model_call=1, decision=MyFinish(output=1))
    with pytest.raises(ValidationError):
        built_decision_entry("x", Finish(output=1))  # type: ignore[arg-type]


def test_built_plan_with_subagent_step_round_trips() -> None:
    sub = SubagentCall(agent="child", task="t", id="c1")
    validated = Plan(steps=(sub,), thought="x")
    built = built_plan(validated.steps, validated.usage, validated.thought)
    assert Plan.model_validate(built.model_dump()) == validated


def test_built_records_are_frozen() -> None:
    call = built_tool_call("t", freeze({"a": 1}), "c1")
    with pytest.raises(ValidationError):
        call.name = "other"  # type: ignore[misc]
    entry = built_decision_entry(1, Finish(output=1))
    with pytest.raises(ValidationError):
        entry.model_call = 2  # type: ignore[misc]


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


tool_values = st.recursive(
    values | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    ids,
    names,
    tool_values,
    st.none() | st.builds(lambda m: AgentError(code=ErrorCode.HANDLER_ERROR, message=m), st.text()),
    st.integers(min_value=0, max_value=10),
    st.floats(min_value=0, max_value=1e6),
)
def test_built_tool_result_equals_validated(
    cid: str, tool: str, value: object, error: AgentError | None, attempts: int, duration: float
) -> None:
    ok = error is None
    validated = ToolResult(
        call_id=cid,
        tool=tool,
        ok=ok,
        value=value,
        error=error,
        attempts=attempts,
        duration=duration,
    )
    built = built_tool_result(cid, tool, ok, value, error, attempts, duration)
    assert built == validated
    assert list(built.__dict__) == list(validated.__dict__)
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump_json() == validated.model_dump_json()
    assert type(built.value) is type(validated.value)


def test_built_tool_result_freezes_the_tool_value() -> None:
    rows = [1, 2]
    raw = {"rows": rows, "meta": {"k": "v"}}
    result = built_tool_result("c1", "t", True, raw, None, 1, 0.5)
    with pytest.raises(TypeError):
        result.value["rows"].append(3)
    rows.append(3)  # the tool's own object stays the tool's
    assert result.value == {"rows": [1, 2], "meta": {"k": "v"}}


def test_built_tool_result_validates_what_is_not_the_machines_own() -> None:
    # An int duration (a test clock) takes the validated path and is coerced as before.
    assert built_tool_result("c1", "t", True, 1, None, 1, 2) == ToolResult(
        call_id="c1", tool="t", ok=True, value=1, attempts=1, duration=2.0
    )
    with pytest.raises(ValidationError):
        built_tool_result("c1", "t", True, 1, {"code": "nope"}, 1, 0.0)  # type: ignore[arg-type]


@given(
    st.integers(min_value=-5, max_value=10**6),
    st.integers(min_value=-5, max_value=10**6),
    st.none() | st.integers(min_value=0, max_value=10**9),
    st.none() | st.floats(min_value=0.0, max_value=1e6),
    st.integers(min_value=0, max_value=5),
    st.none() | st.text(max_size=8),
)
def test_built_view_equals_constructed(
    steps_left: int,
    calls_left: int,
    tokens_left: int | None,
    seconds_left: float | None,
    depth: int,
    parent: str | None,
) -> None:
    budgets = built_budgets(steps_left, calls_left, tokens_left, seconds_left)
    assert budgets == Budgets(steps_left, calls_left, tokens_left, seconds_left)
    entries: list[TranscriptEntry] = [UserMessage(seq=0, content="hi")]
    transcript = Transcript(entries)
    usage = Usage(input_tokens=1, output_tokens=2)
    args = ("r", "t", transcript, (), usage, 3, 4, budgets, depth, parent, "s", None, (), ("a",))
    built = built_view(*args)
    constructed = RunView(*args)
    assert built == constructed
    assert built.call is None
    assert repr(built) == repr(constructed)
    assert dataclasses.replace(built, depth=9) == dataclasses.replace(constructed, depth=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.depth = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        budgets.steps_left = 1  # type: ignore[misc]


detail_names = st.text(min_size=1, max_size=8).filter(str.isidentifier)


@given(
    st.sampled_from(list(ErrorCode)),
    st.text(max_size=30),
    st.none() | st.booleans(),
    st.dictionaries(detail_names, tool_values, max_size=4),
)
def test_agent_error_of_equals_validated(
    code: ErrorCode, message: str, retryable: bool | None, details: dict[str, object]
) -> None:
    built = AgentError.of(code, message, retryable=retryable, **details)
    validated = AgentError(
        code=code,
        message=message,
        retryable=DEFAULT_RETRYABLE[code] if retryable is None else retryable,
        details=details,
    )
    assert built == validated
    assert list(built.__dict__) == list(validated.__dict__)
    assert built.model_fields_set == validated.model_fields_set
    assert built.__pydantic_extra__ == validated.__pydantic_extra__
    assert built.__pydantic_private__ == validated.__pydantic_private__
    assert type(built.details) is type(validated.details)
    assert hash(built.details) == hash(validated.details)
    assert built.model_dump(mode="json") == validated.model_dump(mode="json")
    assert AgentError.model_validate_json(built.model_dump_json()) == validated


def test_agent_error_of_validates_what_is_not_exact() -> None:
    # A code given as its text, a message that is no str: the validated constructor decides.
    assert AgentError.of("cancelled", "x").code is ErrorCode.CANCELLED  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        AgentError.of("no_such_code", "x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        AgentError.of(ErrorCode.CANCELLED, 3)  # type: ignore[arg-type]

    class Sub(AgentError):
        pass

    assert type(Sub.of(ErrorCode.TIMEOUT, "late")) is Sub


def test_slot_twin_builds_the_class_it_twins_and_refuses_another_layout() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Pair:
        a: int
        b: str

    @dataclasses.dataclass(frozen=True, slots=True)
    class Other:
        x: int

    twin = slot_twin(Pair)
    pair: Any = object.__new__(twin)
    pair.a, pair.b = 1, "x"
    pair.__class__ = Pair
    assert type(pair) is Pair
    assert pair == Pair(1, "x")
    assert hash(pair) == hash(Pair(1, "x"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.a = 2  # type: ignore[misc]
    other: Any = object.__new__(twin)
    with pytest.raises(TypeError, match="layout differs"):
        other.__class__ = Other


def test_tool_context_is_the_public_constructors_context() -> None:
    scope = CancelScope(deadline=5.0)
    built = tool_context("r", "t", "c1.0", "noop", "idem_x", 2, 5.0, scope, time.monotonic, None)
    constructed = ToolContext(
        run_id="r",
        trace_id="t",
        call_id="c1.0",
        tool="noop",
        idempotency_key="idem_x",
        attempt=2,
        deadline=5.0,
        scope=scope,
        now=time.monotonic,
    )
    assert type(built) is ToolContext
    for name in ToolContext.__slots__:
        assert getattr(built, name) == getattr(constructed, name), name
    assert built.remaining() == constructed.remaining()
    with pytest.raises(AttributeError, match="immutable"):
        built.attempt = 3
    built.emit("progress", {"done": 1})  # no emitter: a no-op, as the constructed one's


def test_a_lease_table_builds_plain_leases() -> None:
    owner = Owner("i1", "host", 1)
    built = _lease("r", owner, 2, 9.5, "agent")
    assert type(built) is Lease
    assert built == Lease("r", owner, 2, 9.5, "agent")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.epoch = 3  # type: ignore[misc]
