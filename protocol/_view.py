"""What the agent sees at a decision: `RunView`, sharing the run's history without copying it.

A validated model carrying the whole transcript made every step cost O(run length) in a
prototype (docs/pykka.md, last section); the view instead wraps the run's append-only entry list
and a length, so building it is O(1) and later appends stay invisible to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload, runtime_checkable

from ._capabilities import ToolSpec
from ._decisions import Usage
from ._messages import SubagentResult, ToolResult, TranscriptEntry, UserMessage

__all__ = ["Budgets", "ModelCall", "RunView", "Transcript"]


@runtime_checkable
class ModelCall(Protocol):
    """The model call a `decide` is answering: its number, cancel signal and live events.

    The runtime hands one to every `decide` as `view.call`. `cancel()` of the run and an
    interrupting `send()` signal it; an adapter aborts its HTTP request on the signal, and a
    hand-written agent may poll `cancelled` or `wait()` (docs/models.md).
    """

    @property
    def number(self) -> int:
        """The model call number (from 1), as `DecisionEntry.model_call` records it."""
        ...

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled (run cancelled, interrupted, or timed out)."""
        ...

    @property
    def reason(self) -> str | None:
        """Why it was cancelled, or None."""
        ...

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(reason)` once on cancellation (at once if already); returns unregister."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to `timeout` seconds, waking at once on cancellation; True if cancelled."""
        ...

    def emit(self, data: dict[str, Any]) -> None:
        """Publish a live-only `model_delta` event (never stored), in order with the run's."""
        ...

    def event(self, name: str, data: Any = None, *, live: bool = True) -> None:
        """Publish an event of the agent's own (kind `custom`, with this call's number); live
        only unless `live=False`. A no-op once the call is cancelled or over."""
        ...


class Transcript(Sequence[TranscriptEntry]):
    """A read-only view of the first `n` entries of a run's append-only transcript."""

    __slots__ = ("_entries", "_n")

    def __init__(self, entries: list[TranscriptEntry], n: int | None = None) -> None:
        self._entries = entries
        self._n = len(entries) if n is None else n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> TranscriptEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[TranscriptEntry]: ...
    def __getitem__(self, index: int | slice) -> TranscriptEntry | list[TranscriptEntry]:
        if isinstance(index, slice):
            return self._entries[: self._n][index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("transcript index out of range")
        return self._entries[index]

    def __iter__(self) -> Iterator[TranscriptEntry]:
        entries = self._entries
        for i in range(self._n):
            yield entries[i]

    def __repr__(self) -> str:
        return f"<Transcript {self._n} entries>"


@dataclass(frozen=True, slots=True)
class Budgets:
    """What is left of the run's budgets at this decision (None: unlimited).

    Attributes:
        steps_left: Tool steps (R27).
        model_calls_left: Model calls, this one included.
        tokens_left: Tokens of the token budget.
        seconds_left: Seconds until the run's total timeout.
    """

    steps_left: int
    model_calls_left: int
    tokens_left: int | None = None
    seconds_left: float | None = None


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything an agent sees when it decides.

    Attributes:
        run_id: This run.
        task: The task text the run was started with.
        transcript: Every entry so far, oldest first (user messages, decisions, results,
            system notes).
        delivered: User messages delivered at this boundary (also in the transcript).
        usage: Tokens used so far, subagents included.
        model_calls: Model calls made before this one.
        steps: Tool steps executed so far.
        budgets: What is left.
        depth: 0 for a top-level run, 1 for its subagents, ...
        parent_run_id: The parent run of a subagent.
        session_id: The host's session id, if given.
        task_id: The host's task id, if given.
        tools: The specs of the tools this run may call (name order).
        subagents: The names of the agents this run may start as subagents (sorted).
        call: The model call being answered: cancel signal and live events (set by the
            runtime; None when a view is built outside a run).
    """

    run_id: str
    task: str
    transcript: Transcript
    delivered: tuple[UserMessage, ...]
    usage: Usage
    model_calls: int
    steps: int
    budgets: Budgets
    depth: int = 0
    parent_run_id: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    subagents: tuple[str, ...] = ()
    call: ModelCall | None = None

    @property
    def last_results(self) -> list[ToolResult | SubagentResult]:
        """The results of the latest plan (entries after the last decision)."""
        out: list[ToolResult | SubagentResult] = []
        for entry in reversed(self.transcript):
            if entry.kind == "decision":
                break
            if isinstance(entry, ToolResult | SubagentResult):
                out.append(entry)
        out.reverse()
        return out
