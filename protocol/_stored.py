"""A run as a store hands it back: the input of a resume, a replay or a fork."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._checkpoint import RunSnapshot
from ._messages import HostMessage, SubagentResult, ToolResult, TranscriptEntry

__all__ = ["StoredRun"]


@dataclass(slots=True)
class StoredRun:
    """A run loaded at one revision: everything a resume, replay or fork needs."""

    snapshot: RunSnapshot
    transcript: list[TranscriptEntry]
    journal: dict[str, ToolResult | SubagentResult] = field(default_factory=dict)
    """Results of the current plan's calls recorded after the snapshot (durable inbox)."""
    messages: list[HostMessage] = field(default_factory=list)
    """Host messages accepted after the snapshot (seq > snapshot.last_seq), in seq order."""
