"""Two parts of the run machine that own their invariants: the inbox and the meter.

`Inbox` holds the host messages accepted but not yet applied, and the delivery rules: a
message is applied once (by seq), user messages reach the agent at a safe boundary, and the
ones no decision has answered yet stay news to the agent. `Meter` holds the run's budgets in
use and its counters. Each attribute here is written only by its class's own methods
(tests/test_machine_parts.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from steerable.protocol import HostMessage, Phase, RunMetrics, Usage, UserMessage

__all__ = ["COUNTERS", "EXECUTE", "REASON", "Inbox", "Meter"]

COUNTERS = ("retries", "tool_errors", "messages_delivered", "checkpoints", "late_results_dropped")
"""The `RunMetrics` counters the meter keeps besides steps, model calls and tokens."""

_NO_USAGE = Usage()
REASON = Phase.REASON.value
EXECUTE = Phase.EXECUTE.value


class Inbox:
    """Host messages accepted into the run, in seq order, until they are applied.

    Attributes:
        last_seq: The seq of the last message accepted (-1: none).
        unseen: User messages delivered that no decision has answered yet.
    """

    __slots__ = ("_pending", "last_seq", "unseen")

    def __init__(self) -> None:
        self.last_seq = -1
        self._pending: list[HostMessage] = []
        self.unseen: tuple[UserMessage, ...] = ()

    def accept(self, msg: HostMessage) -> bool:
        """Take `msg`'s seq; False for a duplicate of a message already applied (exactly once)."""
        if msg.seq <= self.last_seq:
            return False
        self.last_seq = msg.seq
        return True

    def hold(self, msg: UserMessage) -> None:
        """Keep a user message until the next safe boundary delivers it."""
        self._pending.append(msg)

    @property
    def has_user_message(self) -> bool:
        """Whether a user message waits to be delivered."""
        return any(isinstance(m, UserMessage) for m in self._pending) if self._pending else False

    def deliver(self) -> list[UserMessage]:
        """Take every held message; returns the user messages among them, in order."""
        pending = self._pending
        if not pending:
            return []
        self._pending = []
        return [m for m in pending if isinstance(m, UserMessage)]

    def mark_unseen(self, messages: tuple[UserMessage, ...]) -> None:
        """These messages are news to the agent's next decision."""
        self.unseen = messages

    def seen(self) -> None:
        """A decision answered the messages delivered so far."""
        self.unseen = ()

    def add_fields(self, dynamic: dict[str, Any]) -> None:
        """Add to a revision's per-revision part the inbox's fields not at their default
        (`fields()` less what `SNAPSHOT_DEFAULTS`, protocol/_stored.py, leaves out)."""
        last = self.last_seq
        pending = self._pending
        if last != -1:
            dynamic["last_seq"] = last
        delivered = last - len(pending) if pending else last
        if delivered != -1:
            dynamic["delivered_seq"] = delivered
        if pending:
            dynamic["pending_messages"] = [m.model_dump(mode="json") for m in pending]

    def restore(self, last_seq: int, pending: Iterable[HostMessage]) -> None:
        """The inbox as a checkpoint stored it."""
        self.last_seq = last_seq
        self._pending = list(pending)

    def restore_unseen(self, messages: tuple[UserMessage, ...]) -> None:
        """Messages a restored transcript holds after its last decision."""
        self.unseen = messages


class Meter:
    """The run's use of its budgets, and its counters (`RunMetrics`).

    Attributes:
        model_calls: Model calls made (retries and subagents' included).
        steps: Tool steps executed (subagents' included).
        decisions: Decisions recorded.
        usage: Tokens used (subagents' included).
        input_tokens: `usage.input_tokens`, as a plain attribute (a pydantic field read costs
            several times a slot's, and checkpoints read these twice per step).
        output_tokens: `usage.output_tokens`, likewise.
        model_retries: Retries of the current model call.
        children_started: Subagent runs started.
    """

    __slots__ = (
        "_counters",
        "_nonzero",
        "_now",
        "_phases",
        "_started_at",
        "children_started",
        "decisions",
        "input_tokens",
        "model_calls",
        "model_retries",
        "output_tokens",
        "steps",
        "usage",
    )

    def __init__(self) -> None:
        self.model_calls = 0
        self.steps = 0
        self.decisions = 0
        self.usage = _NO_USAGE
        self.input_tokens = self.output_tokens = 0
        self.model_retries = 0
        self.children_started = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        # The counters that are not zero, in COUNTERS order (what a revision keeps of them):
        # kept by `count` and `restore`, so a checkpoint copies it instead of filtering.
        self._nonzero: dict[str, int] = {}
        self._phases: dict[str, float] = {}
        self._started_at = 0.0
        self._now = 0.0

    # The clock: time arrives with each message; the meter keeps the latest for durations.
    def start(self, now: float) -> None:
        """The run starts (or resumes) at `now`."""
        self._started_at = self._now = now

    def at(self, now: float) -> None:
        """A message arrived at `now`."""
        self._now = now

    @property
    def now(self) -> float:
        """The time of the latest message."""
        return self._now

    def count(self, counter: str) -> None:
        """One more of `counter` (one of `COUNTERS`)."""
        counters = self._counters
        value = counters[counter] + 1
        counters[counter] = value
        nonzero = self._nonzero
        if counter in nonzero:
            nonzero[counter] = value  # in place: its position stays
        else:
            self._nonzero = {key: n for key, n in counters.items() if n}

    def add_phase(self, phase: str, seconds: float) -> None:
        """Time spent in `phase` (a `Phase` value: `REASON`, `EXECUTE`)."""
        phases = self._phases
        phases[phase] = phases.get(phase, 0.0) + seconds

    def next_model_call(self) -> int:
        """A model call starts; returns its number (from 1)."""
        self.model_calls += 1
        return self.model_calls

    def add_usage(self, usage: Usage) -> None:
        """Tokens a decision reported."""
        if usage.input_tokens or usage.output_tokens:
            self._use(self.usage + usage)

    def _use(self, usage: Usage) -> None:
        """The one writer of `usage` and of the token counts that mirror it."""
        self.usage = usage
        self.input_tokens = usage.input_tokens
        self.output_tokens = usage.output_tokens

    def decided(self) -> None:
        """A decision was recorded: the model call's retries are over."""
        self.model_retries = 0
        self.decisions += 1

    def next_model_retry(self) -> int:
        """A model call is retried; returns the retry's number (from 1)."""
        self.model_retries += 1
        return self.model_retries

    def step(self) -> None:
        """A validated, approved execution: one tool step (R27)."""
        self.steps += 1

    def child_started(self) -> None:
        """A subagent run started."""
        self.children_started += 1

    def set_children(self, started: int) -> None:
        """Children started before a restart (they count toward `max_children`)."""
        self.children_started = started

    def charge(self, metrics: RunMetrics) -> None:
        """A child's use rolls up into this run (docs/contract.md, "Budgets at the edge")."""
        self.steps += metrics.steps
        self.model_calls += metrics.model_calls
        if metrics.input_tokens or metrics.output_tokens:
            self._use(
                self.usage
                + Usage(input_tokens=metrics.input_tokens, output_tokens=metrics.output_tokens)
            )

    def fields(self) -> dict[str, Any]:
        """The counters as a `RunMetrics` body (plain data: built at every checkpoint)."""
        return {
            "steps": self.steps,
            "model_calls": self.model_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "duration_seconds": max(0.0, self._now - self._started_at),
            "phase_seconds": dict(self._phases),
            **self._counters,
        }

    def snapshot_metrics(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """`fields()`, and what of it a revision keeps (`trimmed_metrics`, protocol/_stored.py:
        the non-zero values no top-level counter repeats), built together per checkpoint."""
        duration = max(self._now - self._started_at, 0.0)
        phases = dict(self._phases)
        full = {
            "steps": self.steps,
            "model_calls": self.model_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "duration_seconds": duration,
            "phase_seconds": phases,
            **self._counters,
        }
        trimmed: dict[str, Any] = {"duration_seconds": duration} if duration else {}
        if phases:
            trimmed["phase_seconds"] = phases
        trimmed.update(self._nonzero)
        return full, trimmed

    def restore(
        self, *, model_calls: int, model_retries: int, steps: int, decisions: int, usage: Usage,
        metrics: RunMetrics,
    ) -> None:  # fmt: skip
        """The meter as a checkpoint stored it."""
        self.model_calls = model_calls
        self.model_retries = model_retries
        self.steps = steps
        self.decisions = decisions
        self._use(usage)
        for key in COUNTERS:
            self._counters[key] = getattr(metrics, key)
        self._nonzero = {key: n for key, n in self._counters.items() if n}
        self._phases = dict(metrics.phase_seconds)
