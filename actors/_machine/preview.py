"""Bounded previews of values for event payloads: what a live UI renders, never the record.

Events carry previews of arguments, results, decisions and outputs so a page can show a run
without loading its transcript; the transcript keeps the values themselves. A preview is
JSON-like, holds no secret in clear (secrets become their references, as in the transcript),
and is bounded whatever the value: strings past `PREVIEW_CHARS` characters are cut, containers
past `PREVIEW_ITEMS` items are cut, nesting past `PREVIEW_DEPTH` levels is summarised. A cut is
marked in place (`"…(+N chars)"`, a trailing `"…(+N items)"`), so a reader knows it is partial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import BaseModel

from steerable.protocol import AskUser, Finish, FrozenDict, Plan, SubagentCall, ToolCall
from steerable.protocol.codec import redact

from .base import ToolLike
from .recording import checked_arguments, recorded_arguments

__all__ = [
    "NO_ARGUMENTS",
    "PREVIEW_CHARS",
    "PREVIEW_DEPTH",
    "PREVIEW_ITEMS",
    "decision_preview",
    "preview",
]

PREVIEW_CHARS = 500
"""Characters of a string kept in a preview."""
PREVIEW_ITEMS = 20
"""Items of a list or keys of a dict kept in a preview."""
PREVIEW_DEPTH = 4
"""Nesting levels kept in a preview; deeper containers become a short summary."""

_SCALARS = (bool, int, float, type(None))

NO_ARGUMENTS: Mapping[str, Any] = FrozenDict()
"""The preview of a call without arguments: one shared, unchangeable empty mapping (equal to
`{}`, and a `dict`), so an event does not allocate one more object the collector counts and
the run's history keeps (docs/performance.md "Wave 4: events and loop, session 6")."""


def preview(value: Any) -> Any:
    """A bounded, JSON-like, secret-free preview of `value` (see the module docstring)."""
    # Exact-type tests first: most previewed values are short strings and scalars, built once
    # per event on the supervisor's thread (issue 14's budget for rich events).
    if type(value) is str:
        if len(value) <= PREVIEW_CHARS:
            return value
    elif isinstance(value, _SCALARS) or (isinstance(value, str) and len(value) <= PREVIEW_CHARS):
        return value
    return _cut(redact(value), 0)


def _cut(value: Any, depth: int) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, str):
        if len(value) <= PREVIEW_CHARS:
            return value
        return f"{value[:PREVIEW_CHARS]}…(+{len(value) - PREVIEW_CHARS} chars)"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        if depth >= PREVIEW_DEPTH:
            return f"<dict of {len(value)}>"
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if i == PREVIEW_ITEMS:
                out["…"] = f"(+{len(value) - PREVIEW_ITEMS} items)"
                break
            out[key if isinstance(key, str) else str(key)] = _cut(item, depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        if depth >= PREVIEW_DEPTH:
            return f"<list of {len(items)}>"
        kept = [_cut(item, depth + 1) for item in items[:PREVIEW_ITEMS]]
        if len(items) > PREVIEW_ITEMS:
            kept.append(f"…(+{len(items) - PREVIEW_ITEMS} items)")
        return kept
    text = f"<{len(value)} bytes>" if isinstance(value, bytes) else repr(value)
    return text if len(text) <= PREVIEW_CHARS else f"{text[:PREVIEW_CHARS]}…"


def decision_preview(
    decision: Plan | Finish | AskUser, tools: Mapping[str, ToolLike]
) -> dict[str, Any]:
    """What `reasoning_finished` shows of a decision: its kind, thought and content.

    A plan step's arguments are shown as the transcript records them (`recorded_arguments`):
    a parameter the tool declares secret is only its reference, whatever the agent sent.
    """
    # Dispatched on the `kind` discriminator (one string compare, not an isinstance chain):
    # this runs once per decision on the supervisor's thread (issue 14's budget).
    kind = decision.kind
    # Only a Plan has a thought; `getattr` with a default would cost a Finish pydantic's
    # `__getattr__` and an AttributeError.
    thought = decision.thought if kind == "plan" else None  # type: ignore[union-attr]
    out: dict[str, Any] = (
        {"decision": kind, "thought": preview(thought)} if thought else {"decision": kind}
    )
    if kind == "plan":
        all_steps = decision.steps  # type: ignore[union-attr]
        steps: list[dict[str, Any]] = []
        for step in all_steps[:PREVIEW_ITEMS] if len(all_steps) > PREVIEW_ITEMS else all_steps:
            # The discriminator, not isinstance: pydantic's metaclass makes that one slow.
            if step.kind == "subagent":
                sub = cast(SubagentCall, step)
                steps.append({"agent": sub.agent, "task": preview(sub.task)})
                continue
            call = cast(ToolCall, step)
            steps.append(
                {
                    "tool": call.name,
                    "arguments": _step_arguments(call, tools) if call.arguments else NO_ARGUMENTS,
                }
            )
        out["steps"] = steps
        if len(all_steps) > PREVIEW_ITEMS:
            out["more_steps"] = len(all_steps) - PREVIEW_ITEMS
    elif kind == "finish":
        out["output"] = preview(decision.output)  # type: ignore[union-attr]
    else:
        out["question"] = preview(decision.question)  # type: ignore[union-attr]
    return out


def _step_arguments(step: ToolCall, tools: Mapping[str, ToolLike]) -> Any:
    problem = checked_arguments(step.name, step.arguments, validated=False)
    if problem is not None:
        return "<arguments that cannot be stored>"
    tool = tools.get(step.name)
    return preview(recorded_arguments(None if tool is None else tool.spec, step.arguments, None))
