"""`RunHandle`: the host's grip on one run (state, steering, approvals, cancel, result, events)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    ApprovalRequest,
    CancelRequest,
    ErrorCode,
    HostMessage,
    RunOutcome,
    RunState,
    SteerableError,
    SteeringMode,
    UserMessage,
)
from steerable.protocol.codec import check_storable

from .event_stream import EventStream
from .offload import async_form, await_future

if TYPE_CHECKING:
    from collections.abc import Callable

    from .cell import RunCell
    from .port import RunPort

__all__ = ["RunHandle"]


class RunHandle:
    """A handle on one run. Cheap to create; any number may exist; safe from any thread.

    Every method returns at once: nothing here waits for the run's actor (a message is
    stored, when the store is durable, and delivered by `tell`).
    """

    __slots__ = ("_cell", "_port")

    def __init__(self, port: RunPort, cell: RunCell) -> None:
        self._port = port
        self._cell = cell

    @property
    def run_id(self) -> str:
        """The run's id (owned by the runtime, R3)."""
        return self._cell.run_id

    @property
    def trace_id(self) -> str:
        """The trace id shared by the run and its subagents."""
        return self._cell.trace_id

    @property
    def parent_run_id(self) -> str | None:
        """The parent run of a subagent; None for a top-level run."""
        return self._cell.parent_run_id

    @property
    def state(self) -> RunState:
        """The run's current state."""
        return self._cell.state

    @property
    def revision(self) -> int:
        """The revision of the run's latest checkpoint."""
        return self._cell.revision

    def send(
        self,
        content: str,
        mode: SteeringMode | str | None = None,
        *,
        message_id: str | None = None,
    ) -> int:
        """Send a user message into the run's inbox; returns its inbox `seq` (R20).

        Args:
            content: The message text.
            mode: "queue" (delivered before the next model call) or "interrupt" (the current
                plan's calls are cancelled and the message is delivered at once). Default:
                the run's `RunConfig.steering`.
            message_id: A caller-chosen id that makes a retried send one message: a second
                send with an id the run already accepted (here, or stored by any process)
                delivers nothing and returns the first one's seq.

        Raises:
            SteerableError: code `run_ended` if the run is already terminal;
                `store_unavailable` if the store could not store the message (or gave up a
                write of this run): nothing is sent.
            TypeError: `content` is not a `str`. Nothing is sent.
            ValueError: `mode` is not "queue" or "interrupt", or `content` cannot be stored:
                not valid Unicode text (e.g. a lone surrogate), or larger than
                `steerable.protocol.codec.MAX_VALUE_BYTES`. Nothing is sent.
        """
        try:
            steering = SteeringMode(mode) if mode is not None else self._port.steering(self.run_id)
        except ValueError:
            raise ValueError(f"mode must be 'queue' or 'interrupt', not {mode!r}") from None
        _check_text(content, "content")  # no store could keep it: refused before any seq

        def build(seq: int) -> HostMessage:
            return UserMessage(seq=seq, content=content, mode=steering, at=self._port.wall())

        return self._post(build, message_id).seq

    def pending_approvals(self) -> list[ApprovalRequest]:
        """The calls waiting for a person's approval."""
        return self._cell.pending_approvals()

    def approve(self, call_id: str) -> bool:
        """Approve a pending call; True if it settled one, False otherwise (docs/contract.md).

        Raises:
            TypeError: `call_id` is not a `str` (nothing is claimed).
        """
        return self._settle(call_id, approved=True, reason="")

    def deny(self, call_id: str, reason: str = "") -> bool:
        """Deny a pending call: the agent gets an `approval_denied` result.

        Raises:
            TypeError: `call_id` or `reason` is not a `str`.
            ValueError: `reason` cannot be stored (see `send`). Either way the call stays
                pending: arguments are checked before the approval is claimed.
        """
        return self._settle(call_id, approved=False, reason=reason)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel the run and its in-flight work at once (R18).

        Returns:
            True if this call took effect; False if the run was already terminal or
            already being cancelled.

        Raises:
            TypeError: `reason` is not a `str`.
            ValueError: `reason` cannot be stored (see `send`). Either way nothing is
                cancelled: the reason is checked before the cancellation is claimed.
        """
        _check_text(reason, "reason")
        cell = self._cell
        with cell.lock:
            if cell.state.is_terminal or cell.cancel_requested:
                return False
            cell.cancel_requested = True
        # First tell the supervisor (so it acts before any result the cancellation provokes),
        # then cancel the scope on this thread: tools waiting on their context wake at once.
        self._port.cancel_now(cell, reason)
        cell.scope.cancel(reason)

        def build(seq: int) -> HostMessage:
            return CancelRequest(seq=seq, reason=reason, at=self._port.wall())

        # Recorded in order (and stored): what a crash recovery sees. The run may already
        # have ended from the signal above; the cancel took effect either way.
        with contextlib.suppress(SteerableError):
            self._post(build)
        return True

    def result(self, timeout: float | None = None) -> RunOutcome:
        """Block until the run is terminal and return its outcome.

        Raises:
            TimeoutError: The run did not end within `timeout` seconds.
        """
        cell = self._cell
        cell.awaited = True
        return cell.future.result(timeout)

    async def wait(self) -> RunOutcome:
        """Await the run's outcome without blocking the event loop."""
        cell = self._cell
        cell.awaited = True
        return await await_future(cell.future)

    def done(self) -> bool:
        """Whether the run has an outcome."""
        return self._cell.future.done()

    def events(self, start: int = 0, timeout: float | None = None) -> EventStream:
        """The run's events from seq `start`, for `for` and `async for`; ends with the run.

        A top-level run's stream includes its subagents' events (tagged with their run ids);
        a subagent's handle streams only its own.
        """
        cell = self._cell
        return cell.events.stream(start, timeout, None if cell.owns_events else cell.run_id)

    # ------------------------------------------------------------------ async face

    asend = async_form(send, lambda handle: handle._port.host_io)
    aapprove = async_form(approve, lambda handle: handle._port.host_io)
    adeny = async_form(deny, lambda handle: handle._port.host_io)
    acancel = async_form(cancel, lambda handle: handle._port.host_io)

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id} {self.state.value}>"

    # ------------------------------------------------------------------ internals

    def _settle(self, call_id: str, *, approved: bool, reason: str) -> bool:
        # Validate first, claim second: a claimed approval whose message cannot be built
        # would be neither pending nor settled, and the run would wait forever.
        if not isinstance(call_id, str):
            raise TypeError(f"call_id must be a str, not {type(call_id).__name__}")
        _check_text(reason, "reason")
        request = self._cell.claim_approval(call_id)
        if request is None:
            return False

        def build(seq: int) -> HostMessage:
            return ApprovalDecision(
                seq=seq,
                call_id=call_id,
                approved=approved,
                reason=reason,
                at=self._port.wall(),
            )

        try:
            self._post(build)
        except SteerableError:
            if not self._cell.state.is_terminal:
                self._cell.unclaim_approval(request)  # not posted: still pending
            return False
        except BaseException:
            self._cell.unclaim_approval(request)
            raise
        return True

    def _post(
        self, build: Callable[[int], HostMessage], message_id: str | None = None
    ) -> HostMessage:
        cell = self._cell
        if message_id is not None:
            _check_text(message_id, "message_id")
            seq = cell.message_ids.get(message_id)
            if seq is not None:  # a retry after the first one was accepted: nothing is sent
                return build(seq)
        if cell.state.is_terminal:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.RUN_ENDED,
                    f"run {cell.run_id} is {cell.state.value}; nothing more can be sent to it",
                    run_id=cell.run_id,
                    state=cell.state.value,
                )
            )
        if message_id is None:
            return self._port.post(cell, build)
        return self._port.post(cell, build, message_id=message_id)


def _check_text(text: object, what: str) -> None:
    """Refuse text no store could keep: TypeError for a non-str, ValueError otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, not {type(text).__name__}")
    check_storable(text, what=what)
