"""A run's budgets and metrics: what it has used, counted where it happens (R10, R27, R28).

`Meter` owns the counters the budgets are checked against (tool steps, model calls, tokens),
the decision count that numbers call ids, the model-retry count, the telemetry counters and
phase seconds, and the run's clock (the `now` of the latest message). Its methods are the only
writers; the machine reads the counters to enforce the budgets.
"""

from __future__ import annotations

from typing import Any

from steerable.protocol import Phase, RunMetrics, RunSnapshot, Usage

__all__ = ["COUNTERS", "Meter"]

COUNTERS = ("retries", "tool_errors", "messages_delivered", "checkpoints", "late_results_dropped")
"""The telemetry counters of `RunMetrics`, kept as plain ints (`Meter.count`)."""


class Meter:
    """Counters of one run (written only by these methods)."""

    __slots__ = (
        "counters",
        "decisions",
        "model_calls",
        "model_retries",
        "now",
        "phase_seconds",
        "started_at",
        "steps",
        "usage",
    )

    def __init__(self) -> None:
        self.steps = 0
        """Tool steps (R27): a validated call's first dispatch, or a child's steps rolled up."""
        self.model_calls = 0
        """Model calls started (a retry is one more), children's rolled up."""
        self.decisions = 0
        """Decisions recorded: the number in the next plan's call ids."""
        self.usage = Usage()
        """Tokens, children's rolled up."""
        self.model_retries = 0
        """provider_timeout retries since the last decision."""
        self.counters: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        self.phase_seconds: dict[str, float] = {}
        self.started_at = 0.0
        """When this process started (or resumed) the run: `duration_seconds` counts from it."""
        self.now = 0.0
        """The monotonic time of the latest message."""

    def start(self, now: float) -> None:
        """The run starts (or resumes) in this process at `now`."""
        self.started_at = now
        self.now = now

    def tick(self, now: float) -> None:
        """A message arrived at `now`."""
        self.now = now

    def step(self) -> None:
        """A tool call ran for the first time (R27)."""
        self.steps += 1

    def model_call(self) -> int:
        """A model call starts; returns its number."""
        self.model_calls += 1
        return self.model_calls

    def decided(self) -> int:
        """A decision was recorded; returns the decision count (the model retries restart)."""
        self.model_retries = 0
        self.decisions += 1
        return self.decisions

    def model_retry(self) -> int:
        """A provider_timeout is retried; returns the retry's number."""
        self.model_retries += 1
        return self.model_retries

    def add_usage(self, usage: Usage) -> None:
        """Tokens a decision reported."""
        self.usage = self.usage + usage

    def roll_up(self, metrics: RunMetrics) -> None:
        """What a child used counts toward this run's budgets."""
        self.steps += metrics.steps
        self.model_calls += metrics.model_calls
        self.usage = self.usage + Usage(
            input_tokens=metrics.input_tokens, output_tokens=metrics.output_tokens
        )

    def count(self, counter: str) -> None:
        """One more of a telemetry counter (`COUNTERS`)."""
        self.counters[counter] += 1

    def add_phase(self, phase: Phase, seconds: float) -> None:
        """Seconds spent in `phase`."""
        self.phase_seconds[phase.value] = self.phase_seconds.get(phase.value, 0.0) + seconds

    def restore(self, snap: RunSnapshot) -> None:
        """The counters of a restored checkpoint."""
        self.model_calls = snap.model_calls
        self.model_retries = snap.model_retries
        self.steps = snap.steps
        self.decisions = snap.decisions
        self.usage = snap.usage
        metrics = snap.metrics
        for key in self.counters:
            self.counters[key] = getattr(metrics, key)
        self.phase_seconds = dict(metrics.phase_seconds)

    def fields(self) -> dict[str, Any]:
        """The `RunMetrics` fields as plain data (the checkpoint path builds this often, W4)."""
        return {
            "steps": self.steps,
            "model_calls": self.model_calls,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "duration_seconds": max(0.0, self.now - self.started_at),
            "phase_seconds": dict(self.phase_seconds),
            **self.counters,
        }
