"""The pure pieces of the model adapters: schemas, message mappings, ids, provider errors."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pydantic
import pytest

from steerable.actors import Runtime, tool
from steerable.actors.models import (
    ToolNames,
    anthropic_tool,
    classify_status,
    docstring_arguments,
    openai_tool,
    parse_retry_after,
    strict_arguments,
    strict_compatible,
    strict_schema,
    to_anthropic_messages,
    to_openai_messages,
)
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import (
    AgentError,
    AskUser,
    Budgets,
    CapabilitySnapshot,
    DecisionEntry,
    ErrorCode,
    Finish,
    Plan,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    Transcript,
    TranscriptEntry,
    Usage,
    UserMessage,
)

WAIT = 20.0


class Where(pydantic.BaseModel):
    city: str
    zip_code: str | None = None


@tool
def lookup(
    query: str, limit: int = 3, unit: str | None = None, where: Where | None = None
) -> list[str]:
    """Look things up.

    Searches the index.

    Args:
        query: What to look for,
            in plain words.
        limit (int): How many hits.

    Returns:
        The hits.
    """
    return [query] * limit


@tool(name="files.read")
def read(path: str, options: dict[str, Any] | None = None) -> str:
    """Read a file."""
    return path


# -- docstrings and schemas ----------------------------------------------------------------


def test_docstring_args_become_argument_descriptions() -> None:
    assert lookup.spec.argument_descriptions == {
        "query": "What to look for, in plain words.",
        "limit": "How many hits.",
    }
    assert lookup.spec.description == "Look things up."


def test_docstring_sections_end_the_args_section() -> None:
    def f(a: int, b: int) -> None:
        """Do.

        Arguments:
            a: first
            b: second

        Raises:
            c: not an argument
        """

    assert docstring_arguments(f) == {"a": "first", "b": "second"}
    assert docstring_arguments(lambda: None) == {}


def test_descriptions_do_not_change_the_capability_hash() -> None:
    @tool(name="lookup")
    def bare(
        query: str, limit: int = 3, unit: str | None = None, where: Where | None = None
    ) -> list[str]:
        return []

    assert bare.spec.argument_descriptions == {}
    assert bare.spec.schema_hash == lookup.spec.schema_hash
    assert CapabilitySnapshot.of([bare.spec], []) == CapabilitySnapshot.of([lookup.spec], [])


def _walk_objects(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for value in node.values():
            found += _walk_objects(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk_objects(value)
    return found


def test_the_strict_schema_passes_openai_strict_mode_rules() -> None:
    schema = strict_schema(lookup.spec)
    objects = _walk_objects(schema)
    assert len(objects) == 2  # the arguments and the nested Where
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    text = repr(schema)
    assert "'default'" not in text
    assert "'title'" not in text
    props = schema["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for, in plain words."}
    assert props["limit"]["type"] == ["integer", "null"]
    assert {"type": "null"} in props["unit"]["anyOf"]
    assert {"type": "null"} in props["where"]["anyOf"]
    tool_entry = openai_tool(lookup.spec)
    assert tool_entry["function"]["strict"] is True
    assert tool_entry["function"]["parameters"] == schema


def test_free_form_objects_fall_back_to_non_strict() -> None:
    assert not strict_compatible(read.spec)
    with pytest.raises(ValueError, match="free-form"):
        strict_schema(read.spec)
    entry = openai_tool(read.spec, name="files_read")
    assert "strict" not in entry["function"]
    assert entry["function"]["name"] == "files_read"


def test_the_anthropic_input_schema_keeps_defaults_and_adds_descriptions() -> None:
    entry = anthropic_tool(lookup.spec)
    assert entry["name"] == "lookup"
    assert entry["description"] == "Look things up."
    schema = entry["input_schema"]
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["properties"]["limit"] == {
        "default": 3,
        "type": "integer",
        "description": "How many hits.",
    }


def test_strict_nulls_for_optional_arguments_become_defaults() -> None:
    raw = {"query": "x", "limit": None, "unit": None, "where": None}
    cleaned = strict_arguments(lookup.spec, raw)
    assert cleaned == {"query": "x", "unit": None, "where": None}
    assert lookup.validate(cleaned)["limit"] == 3


# -- names ----------------------------------------------------------------------------------


def test_tool_names_are_provider_safe_and_map_back() -> None:
    names = ToolNames(["files.read", "files_read", "lookup"], ["researcher"])
    assert names.provider("tool", "files.read") == "files_read"
    assert names.provider("tool", "files_read") == "files_read_2"
    assert names.resolve("files_read") == ("tool", "files.read")
    assert names.resolve("files_read_2") == ("tool", "files_read")
    assert names.provider("subagent", "researcher") == "subagent_researcher"
    assert names.resolve("subagent_researcher") == ("subagent", "researcher")
    assert names.resolve("nope") == ("tool", "nope")


# -- message mapping ------------------------------------------------------------------------


def _view(entries: list[TranscriptEntry], *, task: str = "plan a trip") -> RunView:
    return RunView(
        run_id="run_x",
        task=task,
        transcript=Transcript(entries),
        delivered=(),
        usage=Usage(),
        model_calls=0,
        steps=0,
        budgets=Budgets(steps_left=10, model_calls_left=10),
        tools=(lookup.spec,),
        subagents=("researcher",),
    )


def _error(code: ErrorCode, message: str) -> AgentError:
    return AgentError.of(code, message)


ENTRIES: list[TranscriptEntry] = [
    UserMessage(seq=0, content="prefer trains"),
    DecisionEntry(
        model_call=1,
        decision=Plan(
            steps=(
                ToolCall(name="lookup", arguments={"query": "trains"}, id="call_1"),
                SubagentCall(agent="researcher", task="hotels", id="call_2"),
                ToolCall(name="lookup", arguments={"query": "buses"}, id="call_3"),
            ),
            thought="two things at once",
        ),
    ),
    ToolResult(call_id="call_1", tool="lookup", ok=True, value=["ICE"]),
    SubagentResult(
        call_id="call_2",
        agent="researcher",
        child_run_id="run_c",
        state=RunState.FINISHED,
        ok=True,
        output="Hotel A",
    ),
    ToolResult(
        call_id="call_3",
        tool="lookup",
        ok=False,
        error=_error(ErrorCode.APPROVAL_DENIED, "a person denied lookup: no"),
    ),
    UserMessage(seq=1, content="and cheap"),
    DecisionEntry(model_call=2, decision=AskUser(question="Which dates?")),
    UserMessage(seq=2, content="May"),
    DecisionEntry(model_call=3, decision=Finish(output="Take the ICE.")),
    SystemNote(text="finish rejected: mention the hotel"),
]


def test_the_openai_mapping_of_every_entry_kind() -> None:
    messages = to_openai_messages(_view(ENTRIES), instructions="You plan trips.")
    assert messages == [
        {"role": "system", "content": "You plan trips."},
        {"role": "user", "content": "plan a trip"},
        {"role": "user", "content": "prefer trains"},
        {
            "role": "assistant",
            "content": "two things at once",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"query": "trains"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "subagent_researcher", "arguments": '{"task": "hotels"}'},
                },
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"query": "buses"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '["ICE"]'},
        {"role": "tool", "tool_call_id": "call_2", "content": "Hotel A"},
        {
            "role": "tool",
            "tool_call_id": "call_3",
            "content": "error (approval_denied): a person denied lookup: no",
        },
        {"role": "user", "content": "and cheap"},
        {"role": "assistant", "content": "Which dates?"},
        {"role": "user", "content": "May"},
        {"role": "assistant", "content": "Take the ICE."},
        {"role": "user", "content": "[steerable] finish rejected: mention the hotel"},
    ]


def test_the_anthropic_mapping_merges_user_side_turns() -> None:
    messages = to_anthropic_messages(_view(ENTRIES))
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "plan a trip"},
        {"type": "text", "text": "prefer trains"},
    ]
    assert [b["type"] for b in messages[1]["content"]] == [
        "text",
        "tool_use",
        "tool_use",
        "tool_use",
    ]
    results = messages[2]["content"]
    assert [b.get("tool_use_id") for b in results] == ["call_1", "call_2", "call_3", None]
    assert results[2]["is_error"] is True
    assert "is_error" not in results[0]
    assert results[3] == {"type": "text", "text": "and cheap"}
    assert messages[-1]["content"] == [
        {"type": "text", "text": "[steerable] finish rejected: mention the hotel"}
    ]


def test_a_note_inside_a_plan_waits_until_its_results_are_answered() -> None:
    entries: list[TranscriptEntry] = [
        DecisionEntry(model_call=1, decision=Plan(steps=(ToolCall(name="lookup", id="a"),))),
        SystemNote(text="resumed"),
        ToolResult(
            call_id="a",
            tool="lookup",
            ok=False,
            error=_error(ErrorCode.SIDE_EFFECT_UNKNOWN, "lookup may have run"),
        ),
    ]
    messages = to_openai_messages(_view(entries))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[2]["content"] == "error (side_effect_unknown): lookup may have run"
    assert messages[3]["content"] == "[steerable] resumed"


def test_a_plan_cut_short_still_answers_every_call() -> None:
    entries: list[TranscriptEntry] = [
        DecisionEntry(model_call=1, decision=Plan(steps=(ToolCall(name="lookup", id="a"),))),
        DecisionEntry(model_call=2, decision=Finish(output="x")),
    ]
    messages = to_openai_messages(_view(entries))
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "a",
        "content": "error: the call did not run",
    }


def test_format_2_transcripts_without_ids_map_to_the_runtime_ids() -> None:
    entries: list[TranscriptEntry] = [
        DecisionEntry(model_call=1, decision=AskUser(question="?")),
        UserMessage(seq=0, content="go"),
        DecisionEntry(
            model_call=2,
            decision=Plan(steps=(ToolCall(name="lookup"), ToolCall(name="lookup"))),
        ),
        ToolResult(call_id="c2.0", tool="lookup", ok=True, value=1),
        ToolResult(call_id="c2.1", tool="lookup", ok=True, value=2),
    ]
    messages = to_anthropic_messages(_view(entries))
    uses = [b["id"] for b in messages[-2]["content"] if b["type"] == "tool_use"]
    assert uses == ["c2_0", "c2_1"]
    assert [b["tool_use_id"] for b in messages[-1]["content"]] == ["c2_0", "c2_1"]


# -- ids in the runtime ---------------------------------------------------------------------


def test_the_transcript_records_the_id_each_call_ran_under() -> None:
    @tool
    def echo(x: int) -> int:
        return x

    agent = ScriptedAgent(
        [
            Plan(
                steps=(
                    ToolCall(name="echo", arguments={"x": 1}, id="mine"),
                    ToolCall(name="echo", arguments={"x": 2}),
                    ToolCall(name="echo", arguments={"x": 3}, id="mine"),  # duplicate
                    ToolCall(name="echo", arguments={"x": 4}, id="model"),  # a reserved key
                )
            ),
        ],
        then=Finish(output="ok"),
    )
    with Runtime(tools=[echo]) as rt:
        assert rt.start("t", agent=agent).result(timeout=WAIT).state is RunState.FINISHED
    view = agent.views[-1]
    decision = next(e for e in view.transcript if isinstance(e, DecisionEntry))
    assert isinstance(decision.decision, Plan)
    ids = [step.id for step in decision.decision.steps]
    assert ids == ["mine", "c1.1", "c1.2", "c1.3"]
    results = [e.call_id for e in view.transcript if isinstance(e, ToolResult)]
    assert results == ids
    assert [s.name for s in view.tools] == ["echo"]


# -- provider errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "message", "reason"),
    [
        (429, None, "slow down", "rate_limit"),
        (529, "overloaded_error", "Overloaded", "overloaded"),
        (503, None, "unavailable", "server"),
        (504, None, "gateway", "timeout"),
        (400, "context_length_exceeded", "too long", "context_overflow"),
        (400, None, "prompt is too long: 210000 tokens", "context_overflow"),
        (403, None, "forbidden", "auth"),
        (404, None, "no model", "invalid_request"),
    ],
)
def test_status_classification(status: int, code: str | None, message: str, reason: str) -> None:
    assert classify_status(status, code, message) == reason


def test_retry_after_in_milliseconds_seconds_and_dates() -> None:
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_importing_the_models_module_needs_no_sdk() -> None:
    code = (
        "import sys\n"
        "sys.modules['openai'] = None\n"
        "sys.modules['anthropic'] = None\n"
        "import steerable.actors.models as m\n"
        "for cls in (m.OpenAIChatAgent, m.AnthropicAgent):\n"
        "    try:\n"
        "        cls('x', base_url='http://127.0.0.1:9')\n"
        "    except ImportError as exc:\n"
        "        sys.stderr.write(str(exc) + '\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "this model adapter needs the 'openai' package: pip install 'steerable[openai]'",
        "this model adapter needs the 'anthropic' package: pip install 'steerable[anthropic]'",
    ]
