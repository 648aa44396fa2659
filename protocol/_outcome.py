"""What a finished run reports: its state, output, every error (R6) and its metrics (R28)."""

from __future__ import annotations

from pydantic import Field

from ._base import Record
from ._errors import AgentError
from ._frozen import FrozenAny
from ._state import RunState

__all__ = ["RunMetrics", "RunOutcome"]


class RunMetrics(Record):
    """Counters of one run. Units are in the names; `*_seconds` are wall durations.

    Attributes:
        steps: Tool steps executed (R27).
        model_calls: Calls of the agent's `decide`, retries included.
        input_tokens: Tokens reported by the agent's decisions, subagents included.
        output_tokens: Likewise.
        retries: Tool call retries plus model call retries.
        tool_errors: Tool results that were errors.
        messages_delivered: User messages delivered to the agent.
        checkpoints: Checkpoints written.
        late_results_dropped: Results that arrived after their call had timed out or been
            cancelled.
        duration_seconds: From start (or resume) to the terminal state.
        phase_seconds: Time spent per phase (reason, execute, ...).
    """

    steps: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    retries: int = 0
    tool_errors: int = 0
    messages_delivered: int = 0
    checkpoints: int = 0
    late_results_dropped: int = 0
    duration_seconds: float = 0.0
    phase_seconds: dict[str, float] = Field(default_factory=dict)


class RunOutcome(Record):
    """The result of a run that reached a terminal state.

    Attributes:
        run_id: The run.
        state: FINISHED, EXHAUSTED, CANCELLED or ERROR.
        output: The accepted `Finish.output` (None unless FINISHED).
        errors: Every error recorded on the run, in order (R6).
        metrics: Counters.
        revision: The revision of the final checkpoint.
    """

    run_id: str
    state: RunState
    output: FrozenAny = None
    errors: tuple[AgentError, ...] = ()
    metrics: RunMetrics = Field(default_factory=RunMetrics)
    revision: int = 0

    @property
    def error(self) -> AgentError | None:
        """The error that ended the run (the last one recorded), if any."""
        return self.errors[-1] if self.errors else None
