"""Every protocol record survives the codec: `decode(encode(x)) == x` (R21, R24).

One hypothesis strategy per record exported by `steerable.protocol`; a guard test fails when a
new record is exported without one. `Any` fields get JSON-like values: None, bool, 64-bit ints,
finite floats, str, lists and str-keyed dicts.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from steerable import protocol
from steerable.protocol import (
    AgentError,
    AgentSpec,
    ApprovalDecision,
    ApprovalRequest,
    AskUser,
    CallStatus,
    CancelRequest,
    CapabilitySnapshot,
    Checkpoint,
    Compatibility,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    ForkOrigin,
    Phase,
    Plan,
    PlannedCall,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunMetrics,
    RunOutcome,
    RunSnapshot,
    RunState,
    SideEffect,
    SteeringMode,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._codec import _KIND_OF, _MEMBERS
from steerable.protocol.codec import (
    decode,
    decode_body,
    encode,
    encode_body,
)

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
U64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
NAT = st.integers(min_value=0, max_value=2**63 - 1)
# Typed float fields keep +-inf through JSON mode; `Any` values get finite floats only
# (see test_codec.py::test_infinity_inside_any_values_survives).
FLOATS = st.floats(allow_nan=False)
POSITIVE = st.floats(min_value=0.0, exclude_min=True, allow_nan=False)
NON_NEGATIVE = st.floats(min_value=0.0, allow_nan=False)
TEXT = st.text(max_size=12)
KEYS = st.text(max_size=6)
JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | U64 | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
JSON_DICT = st.dictionaries(KEYS, JSON, max_size=3)
STR_DICT = st.dictionaries(KEYS, TEXT, max_size=3)


def _tuples(strategy: st.SearchStrategy[Any], max_size: int = 3) -> st.SearchStrategy[Any]:
    return st.lists(strategy, max_size=max_size).map(tuple)


usage = st.builds(Usage, input_tokens=NAT, output_tokens=NAT)
agent_error = st.builds(
    AgentError,
    code=st.sampled_from(ErrorCode),
    message=TEXT,
    retryable=st.booleans(),
    details=JSON_DICT,
)
tool_call = st.builds(ToolCall, name=TEXT, arguments=JSON_DICT)
subagent_call = st.builds(
    SubagentCall,
    agent=TEXT,
    task=TEXT,
    max_steps=st.none() | NAT,
    max_model_calls=st.none() | st.integers(min_value=1, max_value=2**63 - 1),
)
plan = st.builds(Plan, steps=_tuples(tool_call | subagent_call), usage=usage, thought=TEXT)
finish = st.builds(Finish, output=JSON, usage=usage)
ask_user = st.builds(AskUser, question=TEXT, usage=usage)
user_message = st.builds(
    UserMessage, seq=NAT, content=TEXT, mode=st.sampled_from(SteeringMode), at=FLOATS
)
approval_decision = st.builds(
    ApprovalDecision, seq=NAT, call_id=TEXT, approved=st.booleans(), reason=TEXT, at=FLOATS
)
cancel_request = st.builds(CancelRequest, seq=NAT, reason=TEXT, at=FLOATS)
host_message = user_message | approval_decision | cancel_request
tool_result = st.builds(
    ToolResult,
    call_id=TEXT,
    tool=TEXT,
    ok=st.booleans(),
    value=JSON,
    error=st.none() | agent_error,
    attempts=I64,
    duration=FLOATS,
)
subagent_result = st.builds(
    SubagentResult,
    call_id=TEXT,
    agent=TEXT,
    child_run_id=TEXT,
    state=st.sampled_from(RunState),
    ok=st.booleans(),
    output=JSON,
    error=st.none() | agent_error,
)
decision_entry = st.builds(DecisionEntry, model_call=I64, decision=plan | finish | ask_user)
system_note = st.builds(SystemNote, text=TEXT, data=JSON_DICT)
entry = user_message | decision_entry | tool_result | subagent_result | system_note
approval_request = st.builds(
    ApprovalRequest, call_id=TEXT, tool=TEXT, arguments=JSON_DICT, run_id=TEXT
)
tool_spec = st.builds(
    ToolSpec,
    name=TEXT,
    description=TEXT,
    side_effect=st.sampled_from(SideEffect),
    timeout=st.none() | POSITIVE,
    requires_approval=st.booleans(),
    honors_idempotency_key=st.booleans(),
    version=TEXT,
    json_schema=JSON_DICT,
)
agent_spec = st.builds(AgentSpec, name=TEXT, version=TEXT)
capabilities = st.builds(CapabilitySnapshot, tools=STR_DICT, agents=STR_DICT)
compatibility = st.builds(
    Compatibility, task_version=TEXT, policy=TEXT, profile=TEXT, input_artifacts=STR_DICT
)


@st.composite
def retry_policies(draw: st.DrawFn) -> RetryPolicy:
    backoff = draw(NON_NEGATIVE)
    return RetryPolicy(
        max_retries=draw(st.integers(min_value=0, max_value=100)),
        backoff=backoff,
        multiplier=draw(st.floats(min_value=1.0, max_value=100.0)),
        max_backoff=draw(st.floats(min_value=backoff, allow_nan=False)),  # validated: >= backoff
        jitter=draw(st.booleans()),
    )


retry_policy = retry_policies()
run_config = st.builds(
    RunConfig,
    max_steps=NAT,
    max_model_calls=st.integers(min_value=1, max_value=2**63 - 1),
    step_timeout=POSITIVE,
    model_timeout=POSITIVE,
    total_timeout=st.none() | POSITIVE,
    token_budget=st.none() | NAT,
    max_parallel_tools=st.integers(min_value=1, max_value=10_000),
    retry=retry_policy,
    steering=st.sampled_from(SteeringMode),
    max_depth=NAT,
    max_children=NAT,
    cancel_grace=NON_NEGATIVE,
)
planned_call = st.builds(
    PlannedCall,
    call_id=TEXT,
    kind=st.sampled_from(["tool", "subagent"]) | TEXT,
    name=TEXT,
    arguments=JSON_DICT,
    idempotency_key=TEXT,
    status=st.sampled_from(CallStatus),
    attempts=I64,
    child_run_id=st.none() | TEXT,
)
fork_origin = st.builds(ForkOrigin, run_id=TEXT, revision=I64)
run_metrics = st.builds(
    RunMetrics,
    steps=I64,
    model_calls=I64,
    input_tokens=I64,
    output_tokens=I64,
    retries=I64,
    tool_errors=I64,
    messages_delivered=I64,
    checkpoints=I64,
    late_results_dropped=I64,
    duration_seconds=FLOATS,
    phase_seconds=st.dictionaries(KEYS, FLOATS, max_size=3),
)
run_snapshot = st.builds(
    RunSnapshot,
    run_id=TEXT,
    revision=NAT,
    trace_id=TEXT,
    session_id=st.none() | TEXT,
    task_id=st.none() | TEXT,
    parent_run_id=st.none() | TEXT,
    depth=I64,
    forked_from=st.none() | fork_origin,
    task=TEXT,
    agent=TEXT,
    state=st.sampled_from(RunState),
    waiting_for=st.none() | st.sampled_from(WaitingFor),
    config=run_config,
    capabilities=capabilities,
    compatibility=compatibility,
    model_calls=I64,
    steps=I64,
    usage=usage,
    decisions=I64,
    transcript_len=I64,
    last_seq=I64,
    delivered_seq=I64,
    pending_messages=_tuples(host_message),
    plan=_tuples(planned_call),
    errors=_tuples(agent_error, max_size=2),
    output=JSON,
    metrics=run_metrics,
    deadline_left=st.none() | FLOATS,
    created_at=FLOATS,
    updated_at=FLOATS,
)
checkpoint = st.builds(
    Checkpoint, snapshot=run_snapshot, entries_from=NAT, entries=_tuples(entry, max_size=4)
)
run_event = st.builds(
    RunEvent,
    run_id=TEXT,
    trace_id=TEXT,
    seq=I64,
    kind=st.sampled_from(EventKind),
    phase=st.none() | st.sampled_from(Phase),
    at=FLOATS,
    data=JSON_DICT,
    parent_run_id=st.none() | TEXT,
)
run_outcome = st.builds(
    RunOutcome,
    run_id=TEXT,
    state=st.sampled_from(RunState),
    output=JSON,
    errors=_tuples(agent_error, max_size=2),
    metrics=run_metrics,
    revision=I64,
)

STRATEGIES: dict[type[BaseModel], st.SearchStrategy[Any]] = {
    AgentError: agent_error,
    AgentSpec: agent_spec,
    ApprovalDecision: approval_decision,
    ApprovalRequest: approval_request,
    AskUser: ask_user,
    CancelRequest: cancel_request,
    CapabilitySnapshot: capabilities,
    Checkpoint: checkpoint,
    Compatibility: compatibility,
    DecisionEntry: decision_entry,
    Finish: finish,
    ForkOrigin: fork_origin,
    Plan: plan,
    PlannedCall: planned_call,
    RetryPolicy: retry_policy,
    RunConfig: run_config,
    RunEvent: run_event,
    RunMetrics: run_metrics,
    RunOutcome: run_outcome,
    RunSnapshot: run_snapshot,
    SubagentCall: subagent_call,
    SubagentResult: subagent_result,
    SystemNote: system_note,
    ToolCall: tool_call,
    ToolResult: tool_result,
    ToolSpec: tool_spec,
    Usage: usage,
    UserMessage: user_message,
}
MODELS = sorted(STRATEGIES, key=lambda model: model.__name__)
# (model, kind) for every kind a model belongs to (UserMessage: host_message and entry).
MODEL_KINDS = [(model, kind) for kind, members in _MEMBERS.items() for model in members]

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _exported_models() -> set[type[BaseModel]]:
    values = (getattr(protocol, name) for name in protocol.__all__)
    return {v for v in values if isinstance(v, type) and issubclass(v, BaseModel)}


def test_every_exported_record_has_a_strategy_and_a_kind() -> None:
    exported = _exported_models()
    assert exported, "steerable.protocol exports no records?"
    assert exported == set(STRATEGIES), "add a strategy for every exported record"
    assert exported <= set(_KIND_OF), "give every exported record a kind in protocol/_codec.py"


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
@SETTINGS
@given(data=st.data())
def test_encode_then_decode_gives_the_same_record(
    model: type[BaseModel], data: st.DataObject
) -> None:
    record = data.draw(STRATEGIES[model])
    encoded = encode(record)
    decoded = decode(encoded)
    assert type(decoded) is model
    assert decoded == record
    assert decode(encoded, kind=_KIND_OF[model]) == record


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
@SETTINGS
@given(data=st.data())
def test_encode_body_of_the_json_dump_is_the_same_record(
    model: type[BaseModel], data: st.DataObject
) -> None:
    record = data.draw(STRATEGIES[model])
    kind = _KIND_OF[model]
    body = record.model_dump(mode="json")
    encoded = encode_body(kind, body)
    assert decode(encoded) == record
    assert encoded == encode(record), "the fast path must write the same bytes"
    assert decode_body(encoded) == (kind, body)


@pytest.mark.parametrize(
    ("model", "kind"), MODEL_KINDS, ids=lambda v: v if isinstance(v, str) else v.__name__
)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_member_of_every_kind_round_trips_under_that_kind(
    model: type[BaseModel], kind: str, data: st.DataObject
) -> None:
    record = data.draw(STRATEGIES[model])
    assert decode(encode(record, kind=kind), kind=kind) == record
