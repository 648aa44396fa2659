"""Run configuration: layered limits (R14), retries (R16), steering (R20), run trees."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from ._base import Record

MAX_INT = 2**63 - 1
"""The largest count a config field takes: the codec stores 64-bit integers."""

__all__ = ["RetryPolicy", "RunConfig", "SteeringMode"]


class SteeringMode(StrEnum):
    """How a user message sent to a running run is delivered (the steering contract, R20)."""

    QUEUE = "queue"
    """Appended to the inbox; delivered before the next model call. Running tools go on."""
    INTERRUPT = "interrupt"
    """The current plan's in-flight calls are cancelled; the message is delivered at once."""


class RetryPolicy(Record):
    """Exponential backoff for retryable failures (R16) and model-call timeouts.

    The delay before retry n (n = 1 for the first retry) is
    `min(max_backoff, backoff * multiplier ** (n - 1))`, scaled by a factor drawn uniformly
    from [0.5, 1.0] when `jitter` is on, and never past the run's deadline.

    Attributes:
        max_retries: Retries after the first attempt (0 = never retry). Default 2.
        backoff: Seconds before the first retry. Default 0.2.
        multiplier: Growth factor per retry. Default 2.0.
        max_backoff: Upper bound of one delay, in seconds. Default 10.0.
        jitter: Randomise delays to avoid retry storms. Default True.
    """

    max_retries: int = Field(default=2, ge=0, le=100)
    backoff: float = Field(default=0.2, ge=0)
    multiplier: float = Field(default=2.0, ge=1.0, le=100.0)
    max_backoff: float = Field(default=10.0, ge=0)
    jitter: bool = True

    @model_validator(mode="after")
    def _bounded(self) -> RetryPolicy:
        if self.max_backoff < self.backoff:
            raise ValueError("max_backoff must be >= backoff")
        return self

    def delay(self, retry: int, unit: float = 1.0) -> float:
        """Seconds before retry number `retry` (from 1); `unit` in [0, 1) is the jitter draw."""
        # Cap the exponent first: multiplier ** retry overflows a float long before retry 100.
        exponent = min(retry - 1, 64)
        base = min(self.max_backoff, self.backoff * self.multiplier**exponent)
        return base * (0.5 + 0.5 * unit) if self.jitter else base


class RunConfig(Record):
    """The limits and policies of one run. Immutable; every field has a unit and a default.

    Attributes:
        max_steps: Tool steps the run may execute (R27: validated, approved executions;
            retries are attempts within one step). Default 50.
        max_model_calls: Calls of the agent's `decide`. Default 50.
        step_timeout: Seconds a tool call may take when its tool sets no timeout. Default 60.
        model_timeout: Seconds one `decide` may take before `provider_timeout`. Default 120.
        total_timeout: Seconds the whole run may take (None: no limit). Default None.
        token_budget: Input plus output tokens the run may use (None: no limit). Default None.
        max_parallel_tools: Calls of one plan run at once, at most. Default 8.
        retry: Backoff for retryable tool failures and model timeouts.
        steering: Default delivery mode of `send()`. Default queue.
        max_depth: Deepest subagent nesting below this run (0: no subagents). Default 3.
        max_children: Subagents this run may start in all. Default 16.
        cancel_grace: Seconds a cancelled call gets to stop before it is abandoned. Default 1.0.

    Counts are at most `2**63 - 1` (what a checkpoint stores) and seconds are not NaN; anything
    else raises `pydantic.ValidationError` (a `ValueError`) here, not later in a store.
    """

    max_steps: int = Field(default=50, ge=0, le=MAX_INT)
    max_model_calls: int = Field(default=50, ge=1, le=MAX_INT)
    step_timeout: float = Field(default=60.0, gt=0)
    model_timeout: float = Field(default=120.0, gt=0)
    total_timeout: float | None = Field(default=None, gt=0)
    token_budget: int | None = Field(default=None, ge=0, le=MAX_INT)
    max_parallel_tools: int = Field(default=8, ge=1, le=10_000)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    steering: SteeringMode = SteeringMode.QUEUE
    max_depth: int = Field(default=3, ge=0, le=MAX_INT)
    max_children: int = Field(default=16, ge=0, le=MAX_INT)
    cancel_grace: float = Field(default=1.0, ge=0)
