"""The protocol's data models: validation, derived values, ids, and the docs that describe them."""

from __future__ import annotations

import inspect
import re
import time
from collections import deque
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from steerable.protocol import (
    AgentError,
    AskUser,
    Budgets,
    CapabilitySnapshot,
    Compatibility,
    Decision,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    HookName,
    Phase,
    Plan,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
    SteeringMode,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    TranscriptEntry,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol import _ids as ids
from steerable.protocol._capabilities import AgentSpec, SideEffect
from steerable.protocol._errors import DEFAULT_RETRYABLE
from steerable.protocol._events import HOOK_EVENTS
from steerable.protocol._state import TRANSITIONS

DOCS = Path(__file__).resolve().parent.parent / "docs"
STATES_DOC = DOCS / "states-and-errors.md"


# --- RunConfig and RetryPolicy validation --------------------------------------------------


@pytest.mark.parametrize(
    "field", ["step_timeout", "model_timeout", "total_timeout", "cancel_grace"]
)
def test_run_config_rejects_negative_durations(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RunConfig.model_validate({field: -1.0})


@pytest.mark.parametrize("field", ["step_timeout", "model_timeout", "total_timeout"])
def test_run_config_rejects_zero_timeouts(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RunConfig.model_validate({field: 0})


@pytest.mark.parametrize(
    "field", ["max_steps", "max_model_calls", "token_budget", "max_depth", "max_children"]
)
def test_run_config_rejects_negative_counts(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RunConfig.model_validate({field: -1})


def test_run_config_needs_at_least_one_parallel_tool() -> None:
    with pytest.raises(ValidationError, match="max_parallel_tools"):
        RunConfig(max_parallel_tools=0)
    assert RunConfig(max_parallel_tools=1).max_parallel_tools == 1


def test_run_config_defaults() -> None:
    config = RunConfig()
    assert config.max_steps == 50
    assert config.max_model_calls == 50
    assert config.step_timeout == 60.0
    assert config.model_timeout == 120.0
    assert config.total_timeout is None
    assert config.token_budget is None
    assert config.max_parallel_tools == 8
    assert config.retry == RetryPolicy()
    assert config.steering is SteeringMode.QUEUE
    assert config.cancel_grace == 1.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_retries", -1), ("backoff", -0.1), ("multiplier", 0.5), ("max_backoff", -1.0)],
)
def test_retry_policy_rejects_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        RetryPolicy.model_validate({field: value})


def test_run_config_rejects_max_backoff_below_backoff() -> None:
    with pytest.raises(ValidationError, match="max_backoff"):
        RunConfig(retry=RetryPolicy(backoff=5.0, max_backoff=1.0))


@pytest.mark.parametrize("model", [RunConfig, RetryPolicy])
def test_config_is_frozen_and_forbids_extra_fields(model: type[BaseModel]) -> None:
    instance = model()
    with pytest.raises(ValidationError, match="frozen"):
        setattr(instance, next(iter(model.model_fields)), 1)
    with pytest.raises(ValidationError, match="extra"):
        model.model_validate({"max_step": 10})


def _documented_attributes(model: type[BaseModel]) -> set[str]:
    doc = inspect.getdoc(model) or ""
    _, found, section = doc.partition("Attributes:\n")
    assert found, f"{model.__name__} has no 'Attributes:' section"
    return set(re.findall(r"^\s{4}(\w+):", section, flags=re.MULTILINE))


@pytest.mark.parametrize("model", [RunConfig, RetryPolicy])
def test_every_config_field_is_documented(model: type[BaseModel]) -> None:
    # docs/style.md: every config field says its unit and default, in the class docstring.
    assert _documented_attributes(model) == set(model.model_fields)


# --- RetryPolicy.delay (docs/contract.md "Retry delay") ---


def _expected(policy: RetryPolicy, retry: int) -> float:
    return min(policy.max_backoff, policy.backoff * policy.multiplier ** (retry - 1))


def test_delay_without_jitter_follows_the_formula() -> None:
    policy = RetryPolicy(backoff=0.2, multiplier=2.0, max_backoff=10.0, jitter=False)
    assert [policy.delay(n) for n in range(1, 5)] == pytest.approx([0.2, 0.4, 0.8, 1.6])
    assert policy.delay(6) == pytest.approx(6.4)
    assert policy.delay(7) == 10.0  # 12.8, capped
    assert policy.delay(50) == 10.0


def test_delay_with_jitter_scales_by_half_to_one() -> None:
    policy = RetryPolicy(backoff=1.0, multiplier=3.0, max_backoff=100.0, jitter=True)
    assert policy.delay(2, unit=0.0) == pytest.approx(1.5)
    assert policy.delay(2, unit=0.5) == pytest.approx(2.25)
    assert policy.delay(2, unit=0.999) < 3.0
    assert policy.delay(10, unit=0.0) == pytest.approx(50.0)  # half of the cap


@given(
    backoff=st.floats(min_value=0.0, max_value=60.0),
    multiplier=st.floats(min_value=1.0, max_value=10.0),
    extra=st.floats(min_value=0.0, max_value=600.0),
    jitter=st.booleans(),
    unit=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_delay_is_monotone_capped_and_matches_the_formula(
    backoff: float, multiplier: float, extra: float, jitter: bool, unit: float
) -> None:
    policy = RetryPolicy(
        backoff=backoff, multiplier=multiplier, max_backoff=backoff + extra, jitter=jitter
    )
    delays = [policy.delay(n, unit) for n in range(1, policy.max_retries + 30)]
    assert all(0.0 <= d <= policy.max_backoff for d in delays)
    assert all(a <= b for a, b in pairwise(delays))
    for n, d in enumerate(delays, start=1):
        base = _expected(policy, n)
        assert d == pytest.approx(base * (0.5 + 0.5 * unit) if jitter else base)


# --- RunState and TRANSITIONS ----------------------------------------------------------------

TERMINAL = {RunState.FINISHED, RunState.EXHAUSTED, RunState.CANCELLED, RunState.ERROR}


def test_terminal_states() -> None:
    assert {s for s in RunState if s.is_terminal} == TERMINAL
    assert [s.value for s in RunState] == [s.name.lower() for s in RunState]


def test_transitions_cover_every_state_and_terminal_states_are_final() -> None:
    assert set(TRANSITIONS) == set(RunState)
    for state, targets in TRANSITIONS.items():
        assert state not in targets
        assert bool(targets) != state.is_terminal, state


def test_every_state_is_reachable_from_idle() -> None:
    seen = {RunState.IDLE}
    todo = deque([RunState.IDLE])
    while todo:
        for nxt in TRANSITIONS[todo.popleft()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert seen == set(RunState)


# --- ids (R3, R4) ------------------------------------------------------------------------------

RUN_ID = re.compile(r"^run_[0-9A-HJKMNP-TV-Z]{26}$")


def test_run_ids_are_unique_within_one_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    run_ids = [ids.new_run_id() for _ in range(1_000)]
    assert len(set(run_ids)) == 1_000
    assert all(RUN_ID.match(r) for r in run_ids)
    assert len({r[:14] for r in run_ids}) == 1  # same timestamp prefix


def test_run_ids_sort_by_creation_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_700_000_000_000, 1_700_000_001_000))  # one millisecond per id
    monkeypatch.setattr(time, "time_ns", lambda: next(clock) * 1_000_000)
    run_ids = [ids.new_run_id() for _ in range(1_000)]
    assert len(set(run_ids)) == 1_000
    assert sorted(run_ids) == run_ids


def _crockford(value: int, length: int) -> str:
    digits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    out = ""
    for _ in range(length):
        value, digit = divmod(value, 32)
        out = digits[digit] + out
    return out


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**80 - 1))
def test_run_id_digits_are_the_timestamp_then_the_entropy(millis: int, entropy: int) -> None:
    assert ids._ulid_digits(millis, entropy) == _crockford(millis, 10) + _crockford(entropy, 16)


def test_trace_ids() -> None:
    traces = {ids.new_trace_id() for _ in range(100)}
    assert len(traces) == 100
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in traces)


def test_idempotency_keys_are_stable_and_distinct_per_call() -> None:
    run = "run_01JH5ZZZZZZZZZZZZZZZZZZZZZ"
    first = ids.idempotency_key(run, ids.call_id(1, 0))
    assert first == ids.idempotency_key(run, ids.call_id(1, 0))  # same call, re-dispatched
    keys = {ids.idempotency_key(run, ids.call_id(d, i)) for d in range(1, 11) for i in range(10)}
    assert len(keys) == 100  # R4: distinct per call, even for the same tool
    assert ids.idempotency_key("run_other", ids.call_id(1, 0)) != first  # a fork gets new keys
    assert run not in first
    assert ids.call_id(3, 2) == "c3.2"


# --- decisions ---------------------------------------------------------------------------------

DECISION: TypeAdapter[Decision] = TypeAdapter(Decision)


def test_decision_union_parses_by_kind() -> None:
    plan = DECISION.validate_python(
        {
            "kind": "plan",
            "steps": [
                {"kind": "tool", "name": "search", "arguments": {"query": "x"}},
                {"kind": "subagent", "agent": "researcher", "task": "dig"},
            ],
            "usage": {"input_tokens": 3, "output_tokens": 4},
        }
    )
    assert isinstance(plan, Plan)
    assert plan.steps == (
        ToolCall(name="search", arguments={"query": "x"}),
        SubagentCall(agent="researcher", task="dig"),
    )
    assert plan.usage.total == 7
    assert DECISION.validate_python({"kind": "finish", "output": [1, 2]}) == Finish(output=[1, 2])
    assert DECISION.validate_python({"kind": "ask_user", "question": "which?"}) == AskUser(
        question="which?"
    )
    assert DECISION.validate_json(DECISION.dump_json(plan)) == plan


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "answer", "output": 1},
        {"output": 1},
        {"kind": "plan", "steps": [{"kind": "shell", "name": "rm"}]},
        {"kind": "finish", "output": 1, "confidence": 0.9},
    ],
)
def test_decision_union_rejects_bad_input(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DECISION.validate_python(data)


def test_plan_converts_list_steps_to_a_tuple() -> None:
    plan = Plan(steps=[ToolCall(name="a"), ToolCall(name="b")])
    assert isinstance(plan.steps, tuple)
    assert [s.kind for s in plan.steps] == ["tool", "tool"]
    assert Plan().steps == ()


def test_usage_addition() -> None:
    total = Usage(input_tokens=1, output_tokens=2) + Usage(input_tokens=10, output_tokens=20)
    assert total == Usage(input_tokens=11, output_tokens=22)
    assert total.total == 33
    assert Usage() + Usage() == Usage()
    with pytest.raises(ValidationError):
        Usage(input_tokens=-1)


# --- Transcript and RunView --------------------------------------------------------------------


def _user(seq: int) -> UserMessage:
    return UserMessage(seq=seq, content=f"m{seq}")


def test_transcript_is_a_fixed_length_view() -> None:
    entries: list[TranscriptEntry] = [_user(0), _user(1), _user(2)]
    view = Transcript(entries)
    assert len(view) == 3
    assert view[0] == _user(0)
    assert view[-1] == _user(2)
    assert view[-3] == _user(0)
    assert view[1:] == [_user(1), _user(2)]
    assert view[::-1] == [_user(2), _user(1), _user(0)]
    assert list(view) == entries

    entries.append(SystemNote(text="later"))  # the run goes on; this view must not change
    assert len(view) == 3
    assert view[-1] == _user(2)
    assert view[:] == [_user(0), _user(1), _user(2)]
    assert list(view) == [_user(0), _user(1), _user(2)]
    for index in (3, -4):
        with pytest.raises(IndexError):
            view[index]
    assert len(Transcript(entries)) == 4
    assert len(Transcript(entries, 2)) == 2


def _tool_result(call: str) -> ToolResult:
    return ToolResult(call_id=call, tool="search", ok=True, value=call)


def _run_view(entries: list[TranscriptEntry]) -> RunView:
    return RunView(
        run_id="run_x",
        task="t",
        transcript=Transcript(entries),
        delivered=(),
        usage=Usage(),
        model_calls=0,
        steps=0,
        budgets=Budgets(steps_left=1, model_calls_left=1),
    )


def test_last_results_are_the_results_after_the_last_decision() -> None:
    child = SubagentResult(
        call_id="c2.1",
        agent="researcher",
        child_run_id="run_child",
        state=RunState.FINISHED,
        ok=True,
        output="found",
    )
    entries: list[TranscriptEntry] = [
        _user(0),
        DecisionEntry(model_call=1, decision=Plan(steps=(ToolCall(name="search"),))),
        _tool_result("c1.0"),
        DecisionEntry(model_call=2, decision=Plan(steps=(ToolCall(name="search"),))),
        _tool_result("c2.0"),
        SystemNote(text="note"),
        child,
    ]
    assert _run_view(entries).last_results == [_tool_result("c2.0"), child]
    assert _run_view(entries[:3]).last_results == [_tool_result("c1.0")]
    assert _run_view(entries[:4]).last_results == []
    assert _run_view([_tool_result("c0.0")]).last_results == [_tool_result("c0.0")]
    assert _run_view([]).last_results == []


# --- capability and compatibility snapshots (R22) ------------------------------------------


def test_capability_snapshot_differences() -> None:
    search = ToolSpec(name="search", json_schema={"type": "object"})
    email = ToolSpec(name="email", side_effect=SideEffect.WRITE)
    before = CapabilitySnapshot.of([search, email], [AgentSpec(name="main")])
    assert before.differences(before) == []
    assert before == CapabilitySnapshot.of([search, email], [AgentSpec(name="main")])

    after = CapabilitySnapshot.of(
        [search.model_copy(update={"version": "2"}), ToolSpec(name="fetch")],
        [AgentSpec(name="main", version="2")],
    )
    diffs = after.differences(before)
    assert len(diffs) == 4
    assert any("tool 'email'" in d and "new" in d for d in diffs)
    assert any("tool 'fetch'" in d and "missing" in d for d in diffs)
    assert any("tool 'search' changed" in d for d in diffs)
    assert any("agent 'main' changed: 2 -> 1" in d for d in diffs)


def test_capability_snapshot_sees_schema_changes() -> None:
    old = CapabilitySnapshot.of([ToolSpec(name="s", json_schema={"a": 1})], [])
    new = CapabilitySnapshot.of([ToolSpec(name="s", json_schema={"a": 2})], [])
    assert old.differences(new) != []


def test_compatibility_differences() -> None:
    base = Compatibility(task_version="1", policy="p", profile="x", input_artifacts={"a": "h1"})
    assert base.differences(base.model_copy()) == []
    changed = base.model_copy(update={"task_version": "2", "input_artifacts": {"a": "h2"}})
    diffs = base.differences(changed)
    assert len(diffs) == 2
    assert diffs[0] == "task_version changed: '1' -> '2'"
    assert "input artifacts changed" in diffs[1]
    assert [d.split()[0] for d in base.differences(Compatibility())] == [
        "task_version",
        "policy",
        "profile",
        "input",
    ]


# --- docs/states-and-errors.md tables match the code ---------------------------------------


Table = list[list[str]]


def _doc_tables(heading: str) -> list[Table]:
    """The tables (body rows only) between `heading` and the next heading of the states doc."""
    lines = STATES_DOC.read_text(encoding="utf-8").splitlines()
    tables: list[Table] = []
    rows: Table = []
    for line in [*lines[lines.index(heading) + 1 :], "#"]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if rows:
            assert len(rows) > 2, f"a table under {heading!r} has no body"
            tables.append(rows[2:])  # skip the header and the |---| line
            rows = []
        if line.startswith("#"):
            break
    assert tables, f"no table under {heading!r}"
    return tables


def _doc_table(heading: str) -> Table:
    tables = _doc_tables(heading)
    assert len(tables) == 1, f"expected one table under {heading!r}"
    return tables[0]


def _code(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected a `code` cell, got {cell!r}"
    return match.group(1)


def test_doc_states_table() -> None:
    rows = _doc_table("## Run states (R8)")
    assert [_code(name) for name, *_ in rows] == [s.name for s in RunState]
    documented = {RunState(_code(value)): terminal for _, value, terminal, _ in rows}
    assert set(documented) == set(RunState)
    for state, terminal in documented.items():
        assert terminal == ("yes" if state.is_terminal else "no"), state


def test_doc_transitions_table() -> None:
    documented: dict[RunState, frozenset[RunState]] = {}
    for source, targets in _doc_table("### Transitions"):
        names = [] if targets == "none" else [_code(t.strip()) for t in targets.split(",")]
        documented[RunState(_code(source))] = frozenset(RunState(n) for n in names)
    assert documented == TRANSITIONS


def test_doc_waiting_for_table() -> None:
    rows = _doc_table("### What a waiting run waits for")
    assert [WaitingFor(_code(value)) for value, _ in rows] == list(WaitingFor)


def test_doc_error_codes_table() -> None:
    rows = _doc_table("### Error codes")
    documented = {ErrorCode(_code(code)): retryable for code, retryable, _ in rows}
    assert len(documented) == len(rows)
    assert set(documented) == set(ErrorCode) == set(DEFAULT_RETRYABLE)
    for code, retryable in documented.items():
        assert retryable == ("yes" if DEFAULT_RETRYABLE[code] else "no"), code


def test_doc_error_contract_fields() -> None:
    fields = [_code(name) for name, *_ in _doc_tables("### The error contract")[0]]
    assert fields == list(AgentError.model_fields)


def test_doc_phases_hooks_and_events_tables() -> None:
    phases, hooks, others = _doc_tables("## Phases and hooks")
    assert [_code(value) for _, value, _ in phases] == [p.value for p in Phase]

    documented = {HookName(_code(hook)): EventKind(_code(event)) for hook, event, _ in hooks}
    assert documented == {hook: event for event, hook in HOOK_EVENTS.items()}
    assert set(documented) == set(HookName)

    other_kinds = {EventKind(_code(event)) for event, _ in others}
    assert other_kinds == set(EventKind) - set(HOOK_EVENTS)


def _parse_default(cell: str) -> object:
    word = cell.split(maxsplit=1)[0]
    if word == "None":
        return None
    if word in ("true", "false"):
        return word == "true"
    try:
        return float(word)
    except ValueError:
        return word


def test_doc_budgets_table() -> None:
    rows = _doc_table("## Budgets and limits: which unit each counts")
    documented = {_code(field): _parse_default(default) for field, _, default, _ in rows}
    config, retry = RunConfig(), RetryPolicy()
    expected: dict[str, object] = {
        name: getattr(config, name) for name in RunConfig.model_fields if name != "retry"
    }
    expected |= {f"retry.{name}": getattr(retry, name) for name in RetryPolicy.model_fields}
    assert set(documented) == set(expected)
    for name, default in documented.items():
        assert default == expected[name], name
