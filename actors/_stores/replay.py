"""Replay (R23): a run's history rebuilt from its checkpoints, read-only, executing nothing.

The checkpoint keeps the transcript (what the agent saw and decided, and every result); the
events of a replay are derived from it. Nothing here calls a tool, an agent or a hook:
re-executing side effects is a fork, an explicit new run (`Runtime.fork`).
"""

from __future__ import annotations

from dataclasses import dataclass

from steerable.protocol import (
    DecisionEntry,
    EventKind,
    Phase,
    RunEvent,
    RunOutcome,
    RunSnapshot,
    StoredRun,
    SubagentResult,
    SystemNote,
    ToolResult,
    TranscriptEntry,
    UserMessage,
)

__all__ = ["Replay", "replay_of"]


@dataclass(frozen=True, slots=True)
class Replay:
    """A run as it stood at one revision.

    Attributes:
        run_id: The run.
        revision: The revision replayed.
        snapshot: The run's state at that revision.
        transcript: Every transcript entry up to that revision.
        events: Events derived from the transcript, in order.
        outcome: The outcome, if the run was terminal at that revision.
    """

    run_id: str
    revision: int
    snapshot: RunSnapshot
    transcript: tuple[TranscriptEntry, ...]
    events: tuple[RunEvent, ...]
    outcome: RunOutcome | None


def _event(
    snap: RunSnapshot, seq: int, kind: EventKind, phase: Phase | None, data: dict[str, object]
) -> RunEvent:
    return RunEvent(
        run_id=snap.run_id,
        trace_id=snap.trace_id,
        seq=seq,
        kind=kind,
        phase=phase,
        at=snap.updated_at,
        data=dict(data),
        parent_run_id=snap.parent_run_id,
    )


def _entry_event(entry: TranscriptEntry) -> tuple[EventKind, Phase | None, dict[str, object]]:
    if isinstance(entry, UserMessage):
        return (
            EventKind.MESSAGE_DELIVERED,
            Phase.OBSERVE,
            {"seq": entry.seq, "content": entry.content},
        )
    if isinstance(entry, DecisionEntry):
        return (
            EventKind.REASONING_FINISHED,
            Phase.REASON,
            {"model_call": entry.model_call, "decision": entry.decision.kind},
        )
    if isinstance(entry, ToolResult):
        return (
            EventKind.TOOL_FINISHED,
            Phase.EXECUTE,
            {
                "call_id": entry.call_id,
                "tool": entry.tool,
                "ok": entry.ok,
                "error": None if entry.error is None else entry.error.code.value,
                "attempts": entry.attempts,
            },
        )
    if isinstance(entry, SubagentResult):
        return (
            EventKind.SUBAGENT_FINISHED,
            Phase.EXECUTE,
            {
                "call_id": entry.call_id,
                "agent": entry.agent,
                "child_run_id": entry.child_run_id,
                "state": entry.state.value,
                "ok": entry.ok,
            },
        )
    assert isinstance(entry, SystemNote)
    return (
        EventKind.FINISH_REJECTED
        if entry.text.startswith("finish rejected")
        else EventKind.STATE_CHANGED,
        Phase.OBSERVE,
        {"note": entry.text},
    )


def outcome_of(snap: RunSnapshot) -> RunOutcome:
    """The outcome a terminal checkpoint records."""
    return RunOutcome(
        run_id=snap.run_id,
        state=snap.state,
        output=snap.output,
        errors=snap.errors,
        metrics=snap.metrics,
        revision=snap.revision,
    )


def replay_of(stored: StoredRun) -> Replay:
    """Build the read-only replay of a loaded revision."""
    snap = stored.snapshot
    events = [
        _event(
            snap,
            0,
            EventKind.RUN_STARTED,
            Phase.LOAD,
            {"task": snap.task, "agent": snap.agent, "depth": snap.depth},
        )
    ]
    for entry in stored.transcript:
        kind, phase, data = _entry_event(entry)
        events.append(_event(snap, len(events), kind, phase, data))
    outcome = None
    if snap.state.is_terminal:
        outcome = outcome_of(snap)
        events.append(
            _event(snap, len(events), EventKind.RUN_ENDED, None, {"state": snap.state.value})
        )
    return Replay(
        run_id=snap.run_id,
        revision=snap.revision,
        snapshot=snap,
        transcript=tuple(stored.transcript),
        events=tuple(events),
        outcome=outcome,
    )
