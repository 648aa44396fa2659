"""Persistence of the run machine: snapshots at safe boundaries, outcome and metrics, and the
restore/resume of a run from a stored checkpoint (R21, R3: same run id, revision + 1)."""

from __future__ import annotations

from typing import Any

from steerable.protocol import (
    RunMetrics,
    RunOutcome,
    RunState,
)

from ._machine_base import MachineBase

__all__ = ["PersistenceMixin"]


class PersistenceMixin(MachineBase):
    """The run machine's checkpoints and restore (see `RunMachine`)."""

    def outcome(self) -> RunOutcome:
        """The run's outcome so far (final once the run is terminal)."""
        return RunOutcome(
            run_id=self.run_id,
            state=self.state,
            output=self.output if self.state is RunState.FINISHED else None,
            errors=tuple(self.errors),
            metrics=self.metrics(),
            revision=self.revision,
        )

    def metrics(self) -> RunMetrics:
        """The run's counters."""
        return RunMetrics(**self._metrics())

    def _metrics(self) -> dict[str, Any]:
        # Plain data: the checkpoint path builds this twice per iteration (W4).
        return {
            "steps": self.steps,
            "model_calls": self.model_calls,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "duration_seconds": max(0.0, self._now - self._started_at),
            "phase_seconds": dict(self._phase_seconds),
            **self._m,
        }

    def _checkpoint(self) -> None:
        self.revision += 1
        self._m["checkpoints"] += 1
        start = self._checkpointed_len
        entries = self.transcript[start:]
        self._checkpointed_len = len(self.transcript)
        self.fx.checkpoint(self.revision, self.snapshot(), start, entries)

    def snapshot(self) -> dict[str, Any]:
        """The run's state as a `RunSnapshot` body (JSON shape), built without validation."""
        return {
            "run_id": self.run_id,
            "revision": self.revision,
            "trace_id": self.trace_id,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "parent_run_id": self.parent_run_id,
            "depth": self.depth,
            "forked_from": None,
            "task": self.task,
            "agent": self.agent,
            "state": self.state.value,
            "waiting_for": None if self.waiting_for is None else self.waiting_for.value,
            **self._static,
            "model_calls": self.model_calls,
            "steps": self.steps,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
            "decisions": self.decisions,
            "transcript_len": len(self.transcript),
            "last_seq": self.last_seq,
            "delivered_seq": self.last_seq - len(self._pending),
            "pending_messages": [m.model_dump(mode="json") for m in self._pending]
            if self._pending
            else [],
            "plan": [c.snapshot() for c in self.plan],
            "errors": [e.model_dump(mode="json") for e in self.errors] if self.errors else [],
            "output": self.output,
            "metrics": self._metrics(),
            "deadline_left": None if self.deadline is None else max(0.0, self.deadline - self._now),
            "created_at": self.created_at,
            "updated_at": self.created_at,
        }
