"""What every model adapter shares: request pieces from a view, a reply to a decision.

An adapter is an async agent: `decide(view)` maps the view to the provider's messages
(`mapping.py`), sends one request, and turns the reply into a `Plan`, `Finish` or `AskUser`.
The provider-specific parts are the request, the reply's parsing and the errors; the rest is
here, so writing an adapter for another provider is those three (docs/models.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from steerable.actors._tools.schema import strict_arguments
from steerable.protocol import (
    AskUser,
    Finish,
    ModelCall,
    Plan,
    RunView,
    SubagentCall,
    ToolCall,
    ToolSpec,
    Usage,
)

from .mapping import ASK_TOOL, FINAL_TOOL, ToolNames

__all__ = ["ModelAgent", "ModelReply", "ReplyToolCall", "missing_extra", "sdk_client"]

_MAX_INVALID_JSON = 2_000
_MAX_ERRORS_SHOWN = 5


def missing_extra(package: str, extra: str) -> ImportError:
    """The error of an adapter whose SDK is not installed."""
    return ImportError(
        f"this model adapter needs the {package!r} package: pip install 'steerable[{extra}]'"
    )


def sdk_client(
    make: Callable[..., Any],
    key_variable: str,
    *,
    client: Any,
    base_url: str | None,
    api_key: str | None,
    timeout: float | None,
) -> Any:
    """The SDK client an adapter calls: `client` as given, or one made with `make`.

    The SDK's own retries are off (`max_retries=0`) on both, because the run retries with
    its `RetryPolicy` (docs/models.md). A local server at `base_url` needs no key.
    """
    if client is not None:
        return client.with_options(max_retries=0) if hasattr(client, "with_options") else client
    options: dict[str, Any] = {"max_retries": 0}
    if timeout is not None:
        options["timeout"] = timeout
    key = api_key or os.environ.get(key_variable) or (base_url and "not-needed")
    return make(base_url=base_url, api_key=key or None, **options)


@dataclass
class ReplyToolCall:
    """One tool call of a model's reply, as the provider gave it."""

    id: str | None
    name: str
    arguments: str | dict[str, Any]
    """The arguments: a JSON text (OpenAI) or an object (Anthropic)."""


@dataclass
class ModelReply:
    """One model reply, provider-neutral: text, tool calls, usage."""

    text: str = ""
    tool_calls: list[ReplyToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None


class ModelAgent:
    """The provider-neutral half of a model adapter (subclassed by each provider's agent).

    Args:
        model: The provider's model name.
        instructions: The system prompt.
        output_type: A pydantic model: the final answer is asked for as a `final_answer`
            tool call, validated, and a validation failure goes back to the model as a
            correction (a rejected Finish, bounded by the model-call budget).
        stream: Stream the reply: text and tool-call pieces arrive as live `model_delta`
            events while the call is in flight.
        ask_user: Offer the model an `ask_user(question)` tool (the run waits for a reply).
        name: The agent's name in the capability snapshot (default: the class name).
    """

    provider = "model"

    def __init__(
        self,
        model: str,
        *,
        instructions: str | None = None,
        output_type: type[pydantic.BaseModel] | None = None,
        stream: bool = False,
        ask_user: bool = False,
        name: str | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if output_type is not None and not (
            isinstance(output_type, type) and issubclass(output_type, pydantic.BaseModel)
        ):
            raise TypeError(f"output_type must be a pydantic model class, got {output_type!r}")
        self.model = model
        self.instructions = instructions
        self.output_type = output_type
        self.stream = stream
        self.ask_user = ask_user
        self.name = name or type(self).__name__
        self._final_spec = (
            None
            if output_type is None
            else ToolSpec(
                name=FINAL_TOOL,
                description=(
                    "Give the final answer. Call this exactly once, when the task is done, "
                    f"with an object matching {output_type.__name__}."
                ),
                json_schema=output_type.model_json_schema(),
            )
        )

    # -- what a provider adapter implements ---------------------------------------------------

    async def complete(self, view: RunView, names: ToolNames) -> ModelReply:
        """Send one request for `view` and return the reply (raise `ProviderError`)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------

    async def decide(self, view: RunView) -> Plan | Finish | AskUser:
        """One model call: the view as messages, one request, the reply as a decision."""
        names = ToolNames.of(view)
        reply = await self.complete(view, names)
        return self.to_decision(reply, view, names)

    def extra_tools(self) -> list[ToolSpec]:
        """The adapter's own tools: `final_answer` (with `output_type`) and `ask_user`."""
        out: list[ToolSpec] = []
        if self._final_spec is not None:
            out.append(self._final_spec)
        if self.ask_user:
            out.append(
                ToolSpec(
                    name=ASK_TOOL,
                    description="Ask the person a question and wait for the answer.",
                    json_schema={
                        "type": "object",
                        "properties": {"question": {"type": "string"}},
                        "required": ["question"],
                    },
                )
            )
        return out

    @staticmethod
    def subagent_spec(name: str, provider_name: str) -> ToolSpec:
        """A subagent offered as a tool taking the child's task."""
        return ToolSpec(
            name=provider_name,
            description=f"Delegate a task to the {name!r} agent; returns its answer.",
            json_schema={
                "type": "object",
                "properties": {"task": {"type": "string", "description": "The task."}},
                "required": ["task"],
            },
        )

    def to_decision(
        self, reply: ModelReply, view: RunView, names: ToolNames
    ) -> Plan | Finish | AskUser:
        """A reply as a decision: tool calls -> Plan, `final_answer` -> Finish, text -> Finish."""
        usage = reply.usage
        specs = {spec.name: spec for spec in view.tools}
        steps: list[ToolCall | SubagentCall] = []
        for call in reply.tool_calls:
            arguments = _arguments(call.arguments)
            if call.name == FINAL_TOOL and self.output_type is not None:
                return Finish(output=self._final_output(arguments), usage=usage)
            if call.name == ASK_TOOL and self.ask_user:
                question = arguments.get("question")
                return AskUser(question=str(question or reply.text), usage=usage)
            kind, name = names.resolve(call.name)
            if kind == "subagent":
                task = arguments.get("task")
                steps.append(SubagentCall(agent=name, task=str(task or ""), id=call.id))
                continue
            spec = specs.get(name)
            if spec is not None:
                arguments = strict_arguments(spec, arguments)
            steps.append(ToolCall(name=name, arguments=arguments, id=call.id))
        if steps:
            return Plan(steps=tuple(steps), usage=usage, thought=reply.text)
        return Finish(output=reply.text, usage=usage)

    def _final_output(self, arguments: dict[str, Any]) -> Any:
        assert self.output_type is not None
        try:
            return self.output_type.model_validate(arguments).model_dump(mode="json")
        except pydantic.ValidationError:
            return arguments  # recorded as given; check_finish sends the errors back

    def check_finish(self, output: Any, view: RunView) -> str | None:
        """With `output_type`: None if `output` validates, else the correction for the model.

        The runtime calls it on every Finish before the run's `accept`; a verdict rejects the
        Finish (a system note the model sees) and the model is asked again.
        """
        del view
        if self.output_type is None:
            return None
        if not isinstance(output, dict):
            return (
                f"give the final answer by calling the {FINAL_TOOL} tool with an object "
                f"matching {self.output_type.__name__}, not as text"
            )
        try:
            self.output_type.model_validate(output)
        except pydantic.ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            shown = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
                for e in errors[:_MAX_ERRORS_SHOWN]
            )
            return (
                f"the {FINAL_TOOL} answer does not match {self.output_type.__name__}: {shown}; "
                f"call {FINAL_TOOL} again with a corrected answer"
            )
        return None


def _arguments(raw: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        # The tool's validation reports it to the model (invalid_arguments), which may retry.
        return {"_invalid_json": raw[:_MAX_INVALID_JSON]}
    return value if isinstance(value, dict) else {"_not_an_object": value}


def emitter(call: ModelCall | None) -> Callable[[dict[str, Any]], None]:
    """`call.emit`, or a no-op outside a run."""
    if call is None:
        return _drop
    return call.emit


def _drop(data: dict[str, Any]) -> None:
    del data
