"""A run's ordered inbox of host messages: exactly once, in seq order, delivered at boundaries.

`Inbox` owns the position in the host's seq stream (`last_seq`), the user messages accepted but
not yet delivered, and those delivered but not yet answered by a decision. Its methods are the
only writers of these fields; the machine decides when to call them (docs/steering.md).
"""

from __future__ import annotations

from steerable.protocol import HostMessage, UserMessage

__all__ = ["Inbox"]


class Inbox:
    """Delivery rules: a seq is applied once; user messages wait for the next safe boundary."""

    __slots__ = ("last_seq", "pending", "unseen")

    def __init__(self) -> None:
        self.last_seq = -1
        """The highest seq accepted; a message at or below it is a duplicate. Written by
        `accept` and `restore`."""
        self.pending: list[HostMessage] = []
        """Accepted, not yet delivered, in seq order. Written by `queue`, `take`, `restore`."""
        self.unseen: tuple[UserMessage, ...] = ()
        """Delivered at a boundary, not yet answered by a decision (a model call that timed out
        or was interrupted leaves them news). Written by `delivered` and `answered`."""

    @property
    def delivered_seq(self) -> int:
        """The last seq applied or delivered (pending messages come after it)."""
        return self.last_seq - len(self.pending)

    def accept(self, seq: int) -> bool:
        """Take seq `seq` in order; False for a duplicate (a message already applied)."""
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        return True

    def queue(self, msg: UserMessage) -> None:
        """A user message waits for the next safe boundary."""
        self.pending.append(msg)

    def has_user_messages(self) -> bool:
        """Whether a person spoke since the last boundary."""
        return any(isinstance(m, UserMessage) for m in self.pending)

    def take(self) -> list[HostMessage]:
        """Everything pending, in seq order, now delivered (the inbox is empty after)."""
        taken, self.pending = self.pending, []
        return taken

    def delivered(self, messages: tuple[UserMessage, ...]) -> None:
        """What the next model call is told is news (`RunView.delivered`)."""
        self.unseen = messages

    def answered(self) -> None:
        """A decision was made with the delivered messages."""
        self.unseen = ()

    def restore(self, last_seq: int, pending: list[HostMessage]) -> None:
        """The inbox of a restored checkpoint."""
        self.last_seq = last_seq
        self.pending = pending
