"""Tools: the decorator, argument validation, invocation, error and result conversion, context."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import functools
import json
import math
import threading
from typing import Annotated, Any

import msgpack
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, SecretBytes, SecretStr

from steerable.actors._engine.cancel import Cancelled, CancelScope
from steerable.actors._tools.tool import (
    RetryableToolError,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolResultError,
    error_from_exception,
    normalize_result,
    tool,
)
from steerable.protocol._capabilities import SideEffect
from steerable.protocol._errors import AgentError, ErrorCode, SteerableError

# --- tools under test (module level: their annotations are strings, resolved at decoration) --


class Point(BaseModel):
    x: int
    y: int


@tool
def search(query: str, limit: int = 5) -> list[str]:
    """Search the corpus for a query.

    Returns up to `limit` hits. This second paragraph is not part of the description.
    """
    return [f"{query}-{i}" for i in range(limit)]


@tool(side_effect="write", timeout=10, requires_approval=True, version="2")
def send_email(to: str, body: str, ctx: ToolContext) -> str:
    """Send an email
    to someone."""
    return f"{to}:{body}:{ctx.idempotency_key}"


@tool(name="geo.distance")
def distance(
    a: Point,
    b: Annotated[Point, Field(description="the other point")],
    context_of_call: ToolContext,
    unit: str = "m",
) -> float:
    return math.dist((a.x, a.y), (b.x, b.y))


@tool
async def fetch(url: str, ctx: ToolContext) -> dict[str, Any]:
    """Fetch a URL."""
    await asyncio.sleep(0)
    return {"url": url, "call": ctx.call_id}


def make_ctx(
    *,
    scope: CancelScope | None = None,
    deadline: float | None = None,
    now: float = 0.0,
    attempt: int = 1,
) -> ToolContext:
    return ToolContext(
        run_id="run-1",
        trace_id="trace-1",
        call_id="call-1",
        tool="search",
        idempotency_key="key-1",
        attempt=attempt,
        deadline=deadline,
        scope=scope if scope is not None else CancelScope(),
        now=lambda: now,
    )


def is_msgpackable(data: Any) -> bool:
    return bool(msgpack.unpackb(msgpack.packb(data)) == json.loads(json.dumps(data)))


# --- decorator and spec ----------------------------------------------------------------------


def test_bare_and_called_decorator_forms_give_tools() -> None:
    def plain(q: str) -> str:
        return q

    bare = tool(plain)
    called = tool()(plain)
    named = tool(name="other")(plain)
    for made in (bare, called, named, search, send_email, fetch):
        assert isinstance(made, Tool)
    assert bare.spec.name == called.spec.name == "plain"
    assert named.spec.name == "other"
    assert bare.fn is plain
    assert getattr(bare, "__name__", None) == "plain"
    assert getattr(bare, "__wrapped__", None) is plain
    assert repr(search) == "<Tool 'search' side_effect=none>"


def test_spec_carries_the_options() -> None:
    spec = send_email.spec
    assert spec.name == "send_email"
    assert spec.side_effect is SideEffect.WRITE
    assert spec.timeout == 10.0
    assert isinstance(spec.timeout, float)
    assert spec.requires_approval is True
    assert spec.honors_idempotency_key is False
    assert spec.version == "2"
    assert send_email.wants_context
    assert not search.wants_context
    assert fetch.is_async
    assert not search.is_async
    default = search.spec
    assert (default.side_effect, default.timeout, default.requires_approval) == (
        SideEffect.NONE,
        None,
        False,
    )


@pytest.mark.parametrize("side_effect", ["none", "idempotent", "write", SideEffect.IDEMPOTENT])
def test_every_side_effect_is_accepted(side_effect: str | SideEffect) -> None:
    made = tool(name="t", side_effect=side_effect, honors_idempotency_key=True)(lambda x: x)
    assert made.spec.side_effect == SideEffect(side_effect)
    assert made.spec.honors_idempotency_key is True


def test_description_is_the_first_docstring_paragraph_unless_given() -> None:
    assert search.spec.description == "Search the corpus for a query."
    assert send_email.spec.description == "Send an email to someone."
    assert distance.spec.description == ""
    assert tool(name="t", description="Custom.")(lambda: 1).spec.description == "Custom."


def test_schema_excludes_the_context_and_is_plain_json() -> None:
    schema = send_email.spec.json_schema
    assert schema["title"] == "send_email"
    assert set(schema["properties"]) == {"to", "body"}
    assert schema["required"] == ["to", "body"]
    assert schema["additionalProperties"] is False
    assert json.loads(json.dumps(schema)) == schema
    assert search.spec.json_schema["properties"]["limit"]["default"] == 5


def test_schema_passes_field_descriptions_and_nested_models() -> None:
    schema = distance.spec.json_schema
    assert schema["title"] == "geo.distance"
    assert set(schema["properties"]) == {"a", "b", "unit"}
    assert schema["properties"]["b"]["description"] == "the other point"
    assert "Point" in schema["$defs"]
    assert distance.spec.schema_hash == tool(name="geo.distance")(distance.fn).spec.schema_hash


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"side_effect": "sometimes"}, ValueError),
        ({"side_effect": "WRITE"}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"timeout": -1.5}, ValueError),
        ({"timeout": math.nan}, ValueError),
        ({"timeout": "10"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"version": ""}, ValueError),
        ({"name": ""}, ValueError),
        ({"name": "1st"}, ValueError),
        ({"name": "has space"}, ValueError),
        ({"name": "x" * 65}, ValueError),
    ],
)
def test_bad_options_fail_at_the_decorator(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        tool(**options)

    def fn() -> None: ...

    with pytest.raises(error):
        Tool(fn, **options)


def test_longest_valid_name_is_accepted_and_lambdas_need_a_name() -> None:
    longest = "a" + "b.-_9" * 12 + "xyz"
    assert len(longest) == 64
    assert tool(name=longest)(lambda: 1).spec.name == longest
    with pytest.raises(ValueError, match="<lambda>"):
        tool(lambda: 1)


def test_unnamed_callable_needs_a_name() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    partial = functools.partial(add, b=1)
    with pytest.raises(TypeError, match="name="):
        tool(partial)
    made = tool(name="add_one")(partial)
    assert made.validate({"a": "2"}) == {"a": 2, "b": 1}  # a partial's keyword is a default
    assert made.invoke({"a": 2}, make_ctx()) == 3


def test_star_args_kwargs_and_positional_only_are_rejected() -> None:
    def star(*items: int) -> None: ...
    def double_star(**options: int) -> None: ...
    def positional(a: int, /, b: int) -> None: ...

    with pytest.raises(TypeError, match=r"\*items"):
        tool(star)
    with pytest.raises(TypeError, match=r"\*\*options"):
        tool(double_star)
    with pytest.raises(TypeError, match="positional-only"):
        tool(positional)


def test_two_context_parameters_are_rejected() -> None:
    def twice(a: ToolContext, b: ToolContext) -> None: ...

    with pytest.raises(TypeError, match="more than one ToolContext"):
        tool(twice)


def test_generators_and_double_decoration_are_rejected() -> None:
    def gen() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    for fn in (gen, agen):
        with pytest.raises(TypeError, match="generators"):
            tool(fn)
    with pytest.raises(TypeError, match="already a tool"):
        tool(search)
    with pytest.raises(TypeError, match="needs a function"):
        tool(42)  # type: ignore[call-overload]


def test_unresolvable_or_unvalidatable_annotations_fail_at_decoration() -> None:
    def unknown(x: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    class Opaque:
        pass

    def opaque(x: Opaque) -> None: ...

    with pytest.raises(TypeError, match="cannot resolve"):
        tool(unknown)
    with pytest.raises(TypeError, match="cannot be validated"):
        tool(opaque)


def test_a_locally_defined_type_resolves_from_the_defining_function() -> None:
    class Local(BaseModel):
        n: int

    @tool
    def uses_local(item: Local) -> int:
        return item.n

    @tool(side_effect="idempotent")
    def uses_local_too(item: Local) -> int:
        return item.n

    assert uses_local.validate({"item": {"n": "3"}}) == {"item": Local(n=3)}
    assert uses_local_too.validate({"item": {"n": 4}}) == {"item": Local(n=4)}


# --- argument validation ---------------------------------------------------------------------


def test_valid_arguments_come_back_with_defaults() -> None:
    assert search.validate({"query": "cats"}) == {"query": "cats", "limit": 5}
    assert search.validate({"query": "cats", "limit": 2}) == {"query": "cats", "limit": 2}


def test_lax_coercion_as_pydantic_does() -> None:
    assert search.validate({"query": "cats", "limit": "7"}) == {"query": "cats", "limit": 7}
    assert search.validate({"query": "cats", "limit": 7.0}) == {"query": "cats", "limit": 7}
    args = distance.validate({"a": {"x": "1", "y": 2}, "b": Point(x=3, y=4)})
    assert args == {"a": Point(x=1, y=2), "b": Point(x=3, y=4), "unit": "m"}


def test_validate_returns_a_new_dict() -> None:
    arguments = {"query": "cats"}
    validated = search.validate(arguments)
    validated["limit"] = 1
    assert arguments == {"query": "cats"}


def _invalid(made: Tool[..., Any], arguments: Any) -> AgentError:
    with pytest.raises(ToolArgumentsError) as caught:
        made.validate(arguments)
    assert isinstance(caught.value, SteerableError)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    error = caught.value.error
    assert error.details["tool"] == made.spec.name
    assert is_msgpackable(error.details)
    return error


def test_missing_argument_is_invalid() -> None:
    error = _invalid(search, {"limit": 1})
    assert error.details["errors"] == [
        {"loc": ["query"], "msg": "Field required", "type": "missing"}
    ]
    assert "'search'" in error.message
    assert "query" in error.message
    assert error.retryable is False


def test_extra_argument_is_invalid() -> None:
    error = _invalid(search, {"query": "q", "bogus": 1})
    assert [e["type"] for e in error.details["errors"]] == ["extra_forbidden"]
    assert "bogus" in error.message


def test_wrong_type_is_invalid_and_names_every_bad_field() -> None:
    error = _invalid(search, {"query": ["not", "a", "string"], "limit": "many"})
    assert [e["loc"] for e in error.details["errors"]] == [["query"], ["limit"]]
    assert "query" in error.message
    assert "limit" in error.message
    nested = _invalid(distance, {"a": {"x": 1}, "b": {"x": 1, "y": 2}})
    assert nested.details["errors"][0]["loc"] == ["a", "y"]


def test_the_context_is_not_an_argument() -> None:
    error = _invalid(send_email, {"to": "a", "body": "b", "ctx": "forged"})
    assert error.details["errors"][0]["loc"] == ["ctx"]


def test_a_tool_without_parameters_takes_no_arguments() -> None:
    @tool
    def ping(ctx: ToolContext) -> str:
        return "pong"

    first, second = ping.validate({}), ping.validate({})
    assert first == {}
    assert first is not second  # a new dict each time, as with parameters
    assert [e["type"] for e in _invalid(ping, {"x": 1}).details["errors"]] == ["extra_forbidden"]
    assert _invalid(ping, []).details["errors"][0]["loc"] == []


def test_arguments_that_are_not_a_mapping_are_invalid() -> None:
    error = _invalid(search, ["query"])
    assert error.details["errors"][0]["loc"] == []
    assert "arguments:" in error.message


def test_many_errors_are_capped_in_the_message_and_details() -> None:
    error = _invalid(search, {f"extra{i}": i for i in range(40)} | {"query": "q"})
    assert error.details["error_count"] == 40
    assert len(error.details["errors"]) == 20
    assert "and 35 more" in error.message


def test_parameters_named_like_model_attributes_work() -> None:
    @tool
    def odd_names(json: str, schema: int, model_name: str = "m", copy: bool = False) -> str:
        return f"{json}{schema}{model_name}{copy}"

    assert set(odd_names.spec.json_schema["properties"]) == {"json", "schema", "model_name", "copy"}
    args = odd_names.validate({"json": "j", "schema": "1"})
    assert args == {"json": "j", "schema": 1, "model_name": "m", "copy": False}
    assert odd_names.invoke(args, make_ctx()) == "j1mFalse"
    _invalid(odd_names, {"json": "j", "schema": 1, "p0": "field names are not aliases"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
argument_names = st.sampled_from(["query", "limit", "a", "b", "unit", "ctx", "when", "x"])


@tool
def many_types(
    *,
    query: str,
    a: Point,
    when: dt.datetime | None = None,
    limit: int = 1,
    b: list[float] | None = None,
    unit: dict[str, int] | None = None,
) -> None:
    return None


@given(arguments=st.dictionaries(argument_names | st.text(max_size=6), json_values, max_size=7))
def test_validate_returns_a_dict_or_raises_tool_arguments_error(
    arguments: dict[str, Any],
) -> None:
    for made in (many_types, search, distance):
        outcome: dict[str, Any] | AgentError
        try:
            outcome = made.validate(arguments)
        except ToolArgumentsError as exc:
            outcome = exc.error
        if isinstance(outcome, AgentError):
            assert outcome.code is ErrorCode.INVALID_ARGUMENTS
            assert is_msgpackable(outcome.details)
        else:
            assert isinstance(outcome, dict)


# --- invoking --------------------------------------------------------------------------------


def test_invoke_injects_the_context_by_annotation() -> None:
    ctx = make_ctx()
    arguments = send_email.validate({"to": "ann", "body": "hi"})
    assert send_email.invoke(arguments, ctx) == "ann:hi:key-1"
    assert "ctx" not in arguments  # the caller's dict is left alone
    seen: list[ToolContext] = []

    @tool
    def any_name(whatever_name: ToolContext, n: int) -> int:
        seen.append(whatever_name)
        return n

    assert any_name.invoke(any_name.validate({"n": "4"}), ctx) == 4
    assert seen == [ctx]


def test_optional_context_parameter_is_recognised() -> None:
    @tool
    def maybe(n: int, ctx: ToolContext | None = None) -> bool:
        return ctx is not None

    assert maybe.wants_context
    assert set(maybe.spec.json_schema["properties"]) == {"n"}
    assert maybe.invoke(maybe.validate({"n": 1}), make_ctx()) is True
    assert maybe(1) is False


def test_invoke_without_context_and_direct_call() -> None:
    assert search.invoke(search.validate({"query": "q", "limit": 2}), make_ctx()) == ["q-0", "q-1"]
    assert search("q", limit=1) == ["q-0"]
    assert send_email("a", "b", make_ctx()) == "a:b:key-1"


def test_invoke_does_not_start_a_cancelled_call() -> None:
    calls: list[int] = []

    @tool
    def counted(n: int) -> int:
        calls.append(n)
        return n

    scope = CancelScope()
    scope.cancel("too late")
    with pytest.raises(Cancelled, match="too late"):
        counted.invoke({"n": 1}, make_ctx(scope=scope))
    assert calls == []


def test_invoke_and_invoke_async_refuse_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match="invoke_async"):
        fetch.invoke({"url": "u"}, make_ctx())
    with pytest.raises(TypeError, match=r"invoke\(\)"):
        asyncio.run(search.invoke_async({"query": "q"}, make_ctx()))


def test_invoke_async_runs_the_coroutine() -> None:
    result = asyncio.run(fetch.invoke_async(fetch.validate({"url": "u"}), make_ctx()))
    assert result == {"url": "u", "call": "call-1"}


def test_invoke_async_raises_cancelled_before_starting() -> None:
    scope = CancelScope()
    scope.cancel("early")
    with pytest.raises(Cancelled, match="early"):
        asyncio.run(fetch.invoke_async({"url": "u"}, make_ctx(scope=scope)))


@tool
async def hang(ctx: ToolContext) -> str:
    """Wait until cancelled through asyncio."""
    await asyncio.Event().wait()
    return "never"


def test_scope_cancel_from_another_thread_cancels_the_coroutine() -> None:
    scope = CancelScope()
    started = threading.Event()

    def canceller() -> None:
        assert started.wait(10.0), "the tool never started"
        scope.cancel("host cancel")

    @tool
    async def hanging(ctx: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    async def main() -> tuple[bool, int]:
        task = asyncio.ensure_future(hanging.invoke_async({}, make_ctx(scope=scope)))
        with pytest.raises(Cancelled, match="host cancel"):
            await task
        return task.cancelled(), task.cancelling()

    thread = threading.Thread(target=canceller, name="test-canceller")
    thread.start()
    try:
        assert asyncio.run(main()) == (False, 0)
    finally:
        thread.join(10.0)
    assert not thread.is_alive()


def test_a_foreign_task_cancel_still_propagates() -> None:
    async def main() -> bool:
        task = asyncio.ensure_future(hang.invoke_async({}, make_ctx()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert asyncio.run(main()) is True


def test_a_swallowed_or_late_cancel_leaves_the_task_clean() -> None:
    @tool
    async def swallows(ctx: ToolContext) -> str:
        ctx.scope.cancel("stop")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "swallowed"
        return "never"

    @tool
    async def returns_at_once(ctx: ToolContext) -> str:
        ctx.scope.cancel("stop")  # the asyncio cancel is only scheduled: it lands too late
        return "done"

    async def main(made: Tool[..., Any]) -> tuple[Any, int]:
        result = await made.invoke_async({}, make_ctx())
        for _ in range(3):
            await asyncio.sleep(0)  # a stray cancel would land here
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert asyncio.run(main(swallows)) == ("swallowed", 0)
    assert asyncio.run(main(returns_at_once)) == ("done", 0)


# --- errors ----------------------------------------------------------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # raised for real, so that it has a traceback
        return caught


def _check_error(error: AgentError, code: ErrorCode, retryable: bool) -> None:
    assert error.code is code
    assert error.retryable is retryable
    assert error.details["tool"] == "search"
    assert error.details["call_id"] == "call-9"
    assert is_msgpackable(error.details)


def test_retryable_tool_error_is_a_retryable_handler_error() -> None:
    details = {"status": 429, "odd": object(), "code": "E1", "message": "m", "tool": "forged"}
    exc = _raised(RetryableToolError("rate limited", details=details))
    error = error_from_exception(exc, tool="search", call_id="call-9")
    _check_error(error, ErrorCode.HANDLER_ERROR, retryable=True)
    assert error.message == "tool 'search' failed (retryable): rate limited"
    assert (error.details["status"], error.details["code"], error.details["message"]) == (
        429,
        "E1",
        "m",
    )
    assert error.details["odd"].startswith("<object")
    assert "RetryableToolError" in error.details["exception"]


def test_plain_exception_is_a_handler_error_with_a_short_traceback() -> None:
    exc = _raised(ValueError("bad value"))
    error = error_from_exception(exc, tool="search", call_id="call-9")
    _check_error(error, ErrorCode.HANDLER_ERROR, retryable=False)
    assert error.message == "tool 'search' raised ValueError: bad value"
    assert error.details["exception"] == "ValueError"
    assert "ValueError: bad value" in error.details["traceback"]
    assert "_raised" in error.details["traceback"]


def test_an_exception_never_raised_has_no_traceback() -> None:
    error = error_from_exception(KeyError("k"), tool="search", call_id="call-9")
    _check_error(error, ErrorCode.HANDLER_ERROR, retryable=False)
    assert "traceback" not in error.details
    assert "KeyError" in error.message


@pytest.mark.parametrize(
    "exc", [Cancelled("deadline"), asyncio.CancelledError("deadline")], ids=["scope", "asyncio"]
)
def test_cancellation_is_cancelled(exc: BaseException) -> None:
    error = error_from_exception(_raised(exc), tool="search", call_id="call-9")
    _check_error(error, ErrorCode.CANCELLED, retryable=False)
    assert error.details["reason"] == "deadline"
    assert "cancelled" in error.message


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_base_exceptions_are_contained_handler_errors(exc: BaseException) -> None:
    error = error_from_exception(_raised(exc), tool="search", call_id="call-9")
    _check_error(error, ErrorCode.HANDLER_ERROR, retryable=False)
    assert type(exc).__name__ in error.message
    assert "contained" in error.message


def test_a_steerable_error_keeps_its_code() -> None:
    with pytest.raises(ToolResultError) as caught:
        normalize_result(object(), tool="search")
    error = error_from_exception(caught.value, tool="search", call_id="call-9")
    _check_error(error, ErrorCode.HANDLER_ERROR, retryable=False)
    assert error.message == caught.value.error.message


def test_an_unprintable_exception_still_converts() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    error = error_from_exception(Unprintable(), tool="search", call_id="call-9")
    assert error.message == "tool 'search' raised Unprintable: <unprintable>"
    assert error.details["exception"].endswith("Unprintable")


# --- results ---------------------------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Hit:
    title: str
    score: float
    tags: tuple[str, ...]


class Account(BaseModel):
    user: str
    password: SecretStr


def test_results_become_json_like_data() -> None:
    assert normalize_result(Point(x=1, y=2)) == {"x": 1, "y": 2}
    assert normalize_result(Hit("t", 0.5, ("a", "b"))) == {
        "title": "t",
        "score": 0.5,
        "tags": ["a", "b"],
    }
    assert normalize_result((1, "a")) == [1, "a"]
    assert normalize_result({3}) == [3]
    assert normalize_result(b"\x00\xff") == "AP8="
    assert normalize_result(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05"
    assert normalize_result({"colour": Colour.RED}) == {"colour": "red"}
    assert normalize_result(None) is None
    assert normalize_result("plain") == "plain"


def test_secrets_stay_masked() -> None:
    masked = "**********"
    assert normalize_result(SecretStr("hunter2")) == masked
    assert normalize_result(SecretBytes(b"hunter2")) == masked
    result = normalize_result({"account": Account(user="ann", password=SecretStr("hunter2"))})
    assert result == {"account": {"user": "ann", "password": masked}}
    assert "hunter2" not in json.dumps(result)


def test_an_unserializable_result_is_a_tool_result_error() -> None:
    circular: list[Any] = []
    circular.append(circular)
    for value in (object(), threading.Lock(), circular, 2**70):
        with pytest.raises(ToolResultError) as caught:
            normalize_result(value, tool="search")
        assert caught.value.code is ErrorCode.HANDLER_ERROR
        assert caught.value.error.message.startswith(
            "result of tool 'search' is not serializable: "
        )
        assert is_msgpackable(caught.value.error.details)


def test_a_too_large_result_is_a_tool_result_error() -> None:
    assert normalize_result("x" * 90, max_bytes=100) == "x" * 90
    with pytest.raises(ToolResultError) as caught:
        normalize_result("x" * 200, max_bytes=100)
    assert caught.value.code is ErrorCode.HANDLER_ERROR
    assert caught.value.error.details == {"size": 202, "limit": 100}
    with pytest.raises(ValueError, match="max_bytes"):
        normalize_result(1, max_bytes=0)


# --- context ---------------------------------------------------------------------------------


def test_context_fields_and_immutability() -> None:
    ctx = make_ctx(attempt=2)
    assert (ctx.run_id, ctx.trace_id, ctx.call_id, ctx.tool) == (
        "run-1",
        "trace-1",
        "call-1",
        "search",
    )
    assert (ctx.idempotency_key, ctx.attempt) == ("key-1", 2)
    with pytest.raises(AttributeError, match="immutable"):
        ctx.attempt = 3
    with pytest.raises(AttributeError, match="immutable"):
        del ctx.run_id
    with pytest.raises(ValueError, match="attempt"):
        make_ctx(attempt=0)
    assert "call-1" in repr(ctx)


def test_context_cancellation() -> None:
    scope = CancelScope()
    ctx = make_ctx(scope=scope)
    reasons: list[str] = []
    ctx.on_cancel(reasons.append)
    unregister = ctx.on_cancel(lambda reason: reasons.append("unregistered " + reason))
    unregister()
    assert not ctx.cancel_event.is_set()
    assert ctx.cancel_event is scope.event
    assert ctx.wait(0) is False
    ctx.raise_if_cancelled()
    scope.cancel("stop")
    assert ctx.cancelled
    assert ctx.cancel_event.is_set()
    assert reasons == ["stop"]
    assert ctx.wait(0) is True
    with pytest.raises(Cancelled, match="stop"):
        ctx.raise_if_cancelled()


def test_wait_returns_true_when_cancelled_from_another_thread() -> None:
    scope = CancelScope()
    ctx = make_ctx(scope=scope)
    waiting = threading.Event()
    outcome: list[bool] = []

    def waiter() -> None:
        waiting.set()
        outcome.append(ctx.wait(30.0))  # the bound is a hang guard only

    thread = threading.Thread(target=waiter, name="test-waiter")
    thread.start()
    try:
        assert waiting.wait(10.0)
        scope.cancel("stop")
    finally:
        thread.join(10.0)
    assert not thread.is_alive()
    assert outcome == [True]


def test_remaining_reads_the_injected_clock() -> None:
    assert make_ctx(deadline=None).remaining() is None
    assert make_ctx(deadline=105.0, now=100.0).remaining() == 5.0
    assert make_ctx(deadline=100.0, now=130.0).remaining() == 0.0
    readings = iter([10.0, 12.5])
    ctx = ToolContext(
        run_id="r",
        trace_id="t",
        call_id="c",
        tool="x",
        idempotency_key="k",
        attempt=1,
        deadline=20.0,
        scope=CancelScope(),
        now=lambda: next(readings),
    )
    assert ctx.remaining() == 10.0
    assert ctx.remaining() == 7.5


def test_log_is_bound_with_the_call() -> None:
    with structlog.testing.capture_logs() as logs:
        ctx = make_ctx()
        ctx.log.info("working", step=1)
        assert ctx.log is ctx.log
    assert logs == [
        {
            "event": "working",
            "step": 1,
            "run_id": "run-1",
            "trace_id": "trace-1",
            "call_id": "call-1",
            "tool": "search",
            "log_level": "info",
        }
    ]
