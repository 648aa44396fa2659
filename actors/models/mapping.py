"""A `RunView` as a provider's message list: one pure, tested function per provider.

The transcript is the conversation. Each entry maps to provider messages at the place it
has in the transcript: the task and steering messages are user turns where they were
delivered; a plan is an assistant turn with tool calls under the ids its decision entry
recorded, which are also its results' `call_id`s (`ToolCall.id`), so the list is the same
after an interrupt, a retry, a resume or a fork; results and errors (approvals denied,
`side_effect_unknown`, cancelled calls) answer their calls; system notes are user turns
marked `[steerable]`. docs/models.md "Message mapping" is the reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steerable.protocol import (
    AskUser,
    DecisionEntry,
    Finish,
    Plan,
    RunView,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    UserMessage,
)

__all__ = [
    "FINAL_TOOL",
    "NOTE_PREFIX",
    "ToolNames",
    "anthropic_id",
    "result_text",
    "to_anthropic_messages",
    "to_openai_messages",
]

FINAL_TOOL = "final_answer"
"""The tool a model calls to give a structured final answer (`output_type`)."""
ASK_TOOL = "ask_user"
"""The tool a model calls to ask the person a question (`ask_user=True`)."""
NOTE_PREFIX = "[steerable] "
"""How a runtime note is marked in the user turn that carries it."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _safe(name: str, limit: int = 64) -> str:
    return _UNSAFE.sub("_", name)[:limit] or "_"


class ToolNames:
    """Provider-safe tool names (`[A-Za-z0-9_-]{1,64}`) <-> steerable tools and subagents.

    A steerable tool name may hold `.`; providers reject it. Subagents become tools named
    `subagent_<name>` taking `{"task": str}`.
    """

    def __init__(self, tools: Iterable[str], subagents: Iterable[str] = ()) -> None:
        self._to_provider: dict[tuple[str, str], str] = {}
        self._from_provider: dict[str, tuple[str, str]] = {}
        for kind, names in (("tool", tools), ("subagent", subagents)):
            for name in names:
                base = _safe(name if kind == "tool" else f"subagent_{name}")
                candidate, n = base, 1
                while candidate in self._from_provider or candidate in (FINAL_TOOL, ASK_TOOL):
                    n += 1
                    candidate = f"{base[:60]}_{n}"
                self._to_provider[(kind, name)] = candidate
                self._from_provider[candidate] = (kind, name)

    @classmethod
    def of(cls, view: RunView) -> ToolNames:
        """The names of the tools and subagents a view lists."""
        return cls((t.name for t in view.tools), view.subagents)

    def provider(self, kind: str, name: str) -> str:
        """The provider's name of a tool (`kind="tool"`) or subagent (`"subagent"`)."""
        found = self._to_provider.get((kind, name))
        return found if found is not None else _safe(name)

    def resolve(self, provider_name: str) -> tuple[str, str]:
        """(kind, steerable name) of a provider's tool name; unknown names stay tools."""
        return self._from_provider.get(provider_name, ("tool", provider_name))


def result_text(entry: ToolResult | SubagentResult) -> tuple[str, bool]:
    """The text a model reads for a result, and whether it is an error."""
    if entry.ok:
        value = entry.value if isinstance(entry, ToolResult) else entry.output
        if isinstance(value, str):
            return value, False
        return json.dumps(value, ensure_ascii=False, default=str), False
    error = entry.error
    if error is None:
        return "error: the call failed", True
    return f"error ({error.code.value}): {error.message}", True


@dataclass
class _Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class _Turn:
    role: str  # "user", "assistant" or "result"
    text: str = ""
    calls: list[_Call] = field(default_factory=list)
    call_id: str = ""
    is_error: bool = False


def _turns(view: RunView, names: ToolNames, structured: bool) -> list[_Turn]:
    """The transcript as neutral turns, with each call's results right after its turn."""
    walk = _Walk(view, names, structured)
    for entry in view.transcript:
        if isinstance(entry, UserMessage):
            walk.add(_Turn("user", entry.content))
        elif isinstance(entry, DecisionEntry):
            walk.decision(entry)
        elif isinstance(entry, ToolResult | SubagentResult):
            if entry.call_id in walk.pending:
                text, is_error = result_text(entry)
                walk.answer(entry.call_id, text, is_error)
        elif isinstance(entry, SystemNote):
            final = next((cid for cid in walk.pending if cid in walk.finals), None)
            if final is not None:
                walk.answer(final, entry.text, True)  # a rejected final answer
            else:
                walk.add(_Turn("user", NOTE_PREFIX + entry.text))
    walk.settle()
    return walk.out


class _Walk:
    """The state of one walk: calls awaiting results, and turns deferred until they come."""

    def __init__(self, view: RunView, names: ToolNames, structured: bool) -> None:
        self.view = view
        self.names = names
        self.structured = structured
        self.out: list[_Turn] = [_Turn("user", view.task)]
        self.pending: dict[str, None] = {}  # call ids awaiting a result, in order
        self.deferred: list[_Turn] = []
        self.finals: set[str] = set()

    def settle(self) -> None:
        # Calls with no result (a plan cut short) still need an answer before anything else.
        for cid in self.pending:
            self.out.append(
                _Turn("result", "error: the call did not run", call_id=cid, is_error=True)
            )
        self.pending.clear()
        self.out.extend(self.deferred)
        self.deferred.clear()

    def add(self, turn: _Turn) -> None:
        (self.deferred if self.pending else self.out).append(turn)

    def answer(self, cid: str, text: str, is_error: bool) -> None:
        del self.pending[cid]
        self.out.append(_Turn("result", text, call_id=cid, is_error=is_error))
        if not self.pending:
            self.settle()

    def decision(self, entry: DecisionEntry) -> None:
        self.settle()
        decision = entry.decision
        if isinstance(decision, Plan):
            calls = []
            for index, step in enumerate(decision.steps):
                cid = step.id or f"c{_decision_number(self.view, entry)}.{index}"
                calls.append(_step_call(step, cid, self.names))
                self.pending[cid] = None
            self.out.append(_Turn("assistant", decision.thought, calls))
        elif isinstance(decision, Finish):
            if self.structured and isinstance(decision.output, dict):
                cid = f"final_{entry.model_call}"
                self.out.append(_Turn("assistant", "", [_Call(cid, FINAL_TOOL, decision.output)]))
                self.pending[cid] = None
                self.finals.add(cid)
            else:
                self.out.append(_Turn("assistant", _text_of(decision.output)))
        elif isinstance(decision, AskUser):
            self.out.append(_Turn("assistant", decision.question))


def _decision_number(view: RunView, target: DecisionEntry) -> int:
    # Only for steps recorded without an id (format 2): runtime ids are c<decision>.<index>.
    n = 0
    for entry in view.transcript:
        if isinstance(entry, DecisionEntry):
            n += 1
            if entry is target:
                break
    return n


def _step_call(step: ToolCall | SubagentCall, cid: str, names: ToolNames) -> _Call:
    if isinstance(step, SubagentCall):
        return _Call(cid, names.provider("subagent", step.agent), {"task": step.task})
    return _Call(cid, names.provider("tool", step.name), dict(step.arguments))


def _text_of(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False, default=str)


def to_openai_messages(
    view: RunView,
    *,
    instructions: str | None = None,
    names: ToolNames | None = None,
    structured: bool = False,
) -> list[dict[str, Any]]:
    """The view as OpenAI chat-completions `messages`.

    Args:
        view: What the agent sees.
        instructions: The system message, if any.
        names: Provider tool names (default: from the view).
        structured: Whether Finish outputs that are objects came from the `final_answer` tool.
    """
    names = names or ToolNames.of(view)
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for turn in _turns(view, names, structured):
        if turn.role == "user":
            messages.append({"role": "user", "content": turn.text})
        elif turn.role == "result":
            messages.append({"role": "tool", "tool_call_id": turn.call_id, "content": turn.text})
        else:
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if turn.calls:
                message["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.arguments, ensure_ascii=False),
                        },
                    }
                    for call in turn.calls
                ]
            elif not turn.text:
                message["content"] = ""
            messages.append(message)
    return messages


def anthropic_id(call_id: str) -> str:
    """A call id as Anthropic accepts it (`[A-Za-z0-9_-]+`): runtime ids hold dots."""
    return _UNSAFE.sub("_", call_id)[:128] or "_"


def to_anthropic_messages(
    view: RunView, *, names: ToolNames | None = None, structured: bool = False
) -> list[dict[str, Any]]:
    """The view as Anthropic Messages `messages` (the system prompt goes apart, as `system`).

    Consecutive user-side turns (results, then messages) merge into one user message, as the
    API requires alternating roles; tool results come first in it.
    """
    names = names or ToolNames.of(view)
    messages: list[dict[str, Any]] = []
    for turn in _turns(view, names, structured):
        if turn.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if turn.text:
                blocks.append({"type": "text", "text": turn.text})
            blocks.extend(
                {"type": "tool_use", "id": anthropic_id(c.id), "name": c.name, "input": c.arguments}
                for c in turn.calls
            )
            if not blocks:
                blocks.append({"type": "text", "text": "(no answer)"})
            messages.append({"role": "assistant", "content": blocks})
            continue
        if turn.role == "result":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": anthropic_id(turn.call_id),
                "content": turn.text,
            }
            if turn.is_error:
                block["is_error"] = True
        else:
            block = {"type": "text", "text": turn.text or "(empty)"}
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": "user", "content": [block]})
    return messages
