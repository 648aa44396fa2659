"""What an agent decides: a closed set of next steps (Plan, Finish, AskUser)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import Record
from ._config import MAX_INT
from ._frozen import FrozenAny, FrozenDict, FrozenMap

__all__ = ["AskUser", "Decision", "Finish", "Plan", "PlanStep", "SubagentCall", "ToolCall", "Usage"]


class Usage(Record):
    """Tokens one model call used. The token budget counts `input_tokens + output_tokens`."""

    input_tokens: int = Field(default=0, ge=0, le=MAX_INT)
    output_tokens: int = Field(default=0, ge=0, le=MAX_INT)

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ToolCall(Record):
    """One step of a plan: call tool `name` with `arguments` (validated by the tool).

    Attributes:
        name: The tool to call.
        arguments: Argument name -> value.
        id: The call id: the model's own (a provider's tool-call id) or None to let the
            runtime assign one. The decision entry in the transcript always records the id
            the call ran under, which is also its results' `call_id`, so a transcript maps
            back to a provider's message list exactly (docs/models.md).
    """

    kind: Literal["tool"] = "tool"
    name: str
    arguments: FrozenMap = Field(default_factory=FrozenDict)
    id: str | None = Field(default=None, min_length=1, max_length=128)


class SubagentCall(Record):
    """One step of a plan: run the registered agent `agent` on `task` as a child run.

    Attributes:
        agent: The name of an agent registered with the Runtime.
        task: The child's task text.
        max_steps: Tool steps reserved for the child from the parent's budget (None: an
            equal share of what is left).
        max_model_calls: Model calls reserved for the child (None: an equal share).
        id: The call id, as for `ToolCall.id`.
    """

    kind: Literal["subagent"] = "subagent"
    agent: str
    task: str
    max_steps: int | None = Field(default=None, ge=0, le=MAX_INT)
    max_model_calls: int | None = Field(default=None, ge=1, le=MAX_INT)
    id: str | None = Field(default=None, min_length=1, max_length=128)


PlanStep = Annotated[ToolCall | SubagentCall, Field(discriminator="kind")]


class Plan(Record):
    """Run these steps (in parallel, bounded by `max_parallel_tools`); results come back in order.

    An empty plan ends the run in ERROR with `invalid_decision` (R11).
    """

    kind: Literal["plan"] = "plan"
    steps: tuple[PlanStep, ...] = ()
    usage: Usage = Field(default_factory=Usage)
    thought: str = ""


class Finish(Record):
    """A claim of completion, checked by the run's `accept` callable (R9)."""

    kind: Literal["finish"] = "finish"
    output: FrozenAny = None
    usage: Usage = Field(default_factory=Usage)


class AskUser(Record):
    """Park the run (WAITING) until the next user message answers `question`."""

    kind: Literal["ask_user"] = "ask_user"
    question: str
    usage: Usage = Field(default_factory=Usage)


Decision = Annotated[Plan | Finish | AskUser, Field(discriminator="kind")]
"""One decision of an agent: exactly one of Plan, Finish, AskUser."""
