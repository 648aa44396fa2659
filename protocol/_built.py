"""Per-step records built from values that are already validated, without a second pass.

`recorded_plan` (actors/_machine/planning.py) rebuilds the agent's plan with the call ids the
steps ran under once per decision; every input is a field of a validated `Plan` / `ToolCall`
or a runtime-made call id, so pydantic's validation would only re-check what was checked where
the values entered (the agent's decision). `model_construct` is no cheaper than validating
these small records (it walks the fields in Python), so the instance is filled in directly
with exactly the state a validated construction leaves (`__dict__` in field order, the fields
set, no extra or private values); tests/test_built.py proves a built record equals the
validated one. Bad input is still rejected where it enters: these builders are only for values
that have already crossed that boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._decisions import Plan, PlanStep, ToolCall, Usage

__all__ = ["built_plan", "built_tool_call"]

_new = object.__new__
_set = object.__setattr__  # the records are frozen: their own __setattr__ refuses


def built_tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> ToolCall:
    """`ToolCall(name=..., arguments=..., id=...)` from a validated call's name, frozen arguments
    and a call id of 1-128 characters (the caller's guarantee)."""
    record = _new(ToolCall)
    _set(record, "__dict__", {"kind": "tool", "name": name, "arguments": arguments, "id": call_id})
    _set(record, "__pydantic_fields_set__", {"name", "arguments", "id"})
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


def built_plan(steps: tuple[PlanStep, ...], usage: Usage, thought: str) -> Plan:
    """`Plan(steps=..., usage=..., thought=...)` from validated steps, usage and thought."""
    record = _new(Plan)
    _set(record, "__dict__", {"kind": "plan", "steps": steps, "usage": usage, "thought": thought})
    _set(record, "__pydantic_fields_set__", {"steps", "usage", "thought"})
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record
