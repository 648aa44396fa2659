"""Handoff elision: which thread handles the actors a tell wakes (decisions 0002 and 0003).

A worker that reports its job's result handles the supervisor it woke itself, after the job,
instead of waking a dispatcher thread (`collect_inline`, `tell_collected`, `service_inline`).
A thread that wakes actors but must not handle them (a store's writer, a run's start) hands
them to an idle worker instead (`handoff_to_workers`). Both keep the dispatcher's rule: an
actor's `scheduled` flag gives it to one thread at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import pykka

__all__ = [
    "Helpers",
    "collect_inline",
    "handoff_to_workers",
    "service_inline",
    "serving_inline",
    "tell_collected",
    "tell_now",
]


class _Dispatching(Protocol):
    """What this module uses of a `mux.Dispatcher` (mux imports this module, not back)."""

    _helpers: Helpers | None

    @property
    def _ready(self) -> Any: ...

    def _service_guarded(self, inbox: _MuxInbox, index: int) -> None: ...


class _MuxInbox(Protocol):
    """What this module uses of a `mux._MuxInbox`: its dispatcher."""

    @property
    def dispatcher(self) -> _Dispatching | None: ...


# Handoff elision: a worker thread that reports a result to a supervisor may handle that
# supervisor's messages itself, right after its job, instead of waking a dispatcher thread
# (each thread handoff costs tens of microseconds; docs/pykka.md, last section). While a thread
# collects (`_inline.inboxes` is a list), `put` records actors it schedules there instead of on
# the ready queue; the thread then services them exactly as a dispatcher thread would.
# Exclusivity is unchanged: the `scheduled` flag still gives each actor to one thread at a
# time. A worker collects only its job's own report (`tell_collected`), never the tells of the
# user code the job runs: a tool that steers another run and waits for it must not have its
# message held back until it returns.
_inline = threading.local()


def collect_inline(collected: list[_MuxInbox] | None = None) -> list[_MuxInbox]:
    """Have this thread's `tell_collected` calls collect the actors they wake into
    `collected` (empty; default: a new list) until `service_inline`; returns the list."""
    if collected is None:
        collected = []
    _inline.target = collected
    return collected


def tell_collected(ref: pykka.ActorRef[Any], message: object) -> None:
    """Tell `ref` a job's result: after `collect_inline`, the actor it wakes is collected for
    this thread to handle after the job (handoff elision); otherwise an ordinary tell.

    Raises:
        pykka.ActorDeadError: The actor is stopped.
    """
    target = getattr(_inline, "target", None)
    if target is None:
        ref.tell(message)
        return
    _inline.inboxes = target
    try:
        ref.tell(message)
    finally:
        _inline.inboxes = None


def service_inline(collected: list[_MuxInbox]) -> None:
    """Stop collecting, then handle the collected actors' messages on this thread.

    Leaves `collected` empty, for the next `collect_inline` of this thread.
    """
    _inline.target = None
    _inline.inboxes = None
    _inline.serving = True
    try:
        for inbox in collected:
            dispatcher = inbox.dispatcher
            assert dispatcher is not None
            dispatcher._service_guarded(inbox, -1)
    finally:
        _inline.serving = False
        collected.clear()


def serving_inline() -> bool:
    """Whether this thread is a pool worker handling actors after its job (`service_inline`).

    Such a thread may block for a moment (a store's commit, decision 0004) without stalling
    any actor but the one it handles, unlike a dispatcher thread, which serves many.
    """
    return getattr(_inline, "serving", False)


@contextlib.contextmanager
def handoff_to_workers() -> Iterator[None]:
    """Hand the actors this block's tells wake to an idle helper worker, not a dispatcher.

    For a thread that wakes actors but must not handle them itself (a store's writer telling
    runs that their revisions are stored: a handler may wait for that very writer). The actors
    woken in the block are collected, and at its end each dispatcher gives its share to one
    idle worker of its `helpers` pool, which handles them as it handles what its own job told
    (`collect_inline`): the first job a handler submits stays on that worker, so a run whose
    model call waited for the store goes on with one thread hand-off, not two. With no idle
    worker (or no helpers) they go to the dispatcher as any tell would. Inside an enclosing
    block the enclosing one collects them.
    """
    if getattr(_inline, "inboxes", None) is not None:
        yield
        return
    collected: list[_MuxInbox] = []
    _inline.inboxes = collected
    try:
        yield
    finally:
        _inline.inboxes = None
        if collected:
            _hand_off(collected)


def _hand_off(inboxes: list[_MuxInbox]) -> None:
    groups: dict[_Dispatching, list[_MuxInbox]] = {}
    for inbox in inboxes:
        dispatcher = inbox.dispatcher
        assert dispatcher is not None
        groups.setdefault(dispatcher, []).append(inbox)
    for dispatcher, group in groups.items():
        helpers = dispatcher._helpers
        if helpers is None or not helpers.submit_if_idle(_Adopt(group)):
            _requeue(group)


def _requeue(inboxes: list[_MuxInbox]) -> None:
    """Give scheduled actors back to their dispatchers' ready queues (as `put` would)."""
    for inbox in inboxes:
        dispatcher = inbox.dispatcher
        assert dispatcher is not None
        dispatcher._ready.put(inbox)


class _Adopt:
    """A helper worker's job: take over actors another thread woke, and handle them after it.

    The actors are scheduled (their `scheduled` flag set by the tells that woke them), so no
    other thread touches them until this worker has handled them, exactly as if its own job
    had told them. A job the pool drops unrun (it shut down) gives them back to their
    dispatchers, so no actor is left scheduled with nobody to handle it.
    """

    __slots__ = ("_inboxes",)

    def __init__(self, inboxes: list[_MuxInbox]) -> None:
        self._inboxes = inboxes

    def run(self) -> None:
        collected = getattr(_inline, "target", None)
        if collected is None:  # not on a worker that services what its jobs report to
            _requeue(self._inboxes)
        else:
            collected.extend(self._inboxes)

    def cancel_pending(self) -> None:
        _requeue(self._inboxes)


class Helpers(Protocol):
    """What a dispatcher needs of the pool whose idle workers take its hand-offs."""

    def submit_if_idle(self, job: Any, /) -> bool:
        """Run `job` on an idle worker now; False (and nothing done) if none is idle."""
        ...


def tell_now(ref: pykka.ActorRef[Any], message: object) -> None:
    """Tell `ref` now, never collected for later, even inside a collecting section (live events).

    A job's report is collected for its worker to handle after the job (handoff elision);
    the user code a job runs is not, but a message meant to be seen while the job runs (a
    streaming delta) says so explicitly, whatever section it is told from.

    Raises:
        pykka.ActorDeadError: The actor is stopped.
    """
    saved = getattr(_inline, "inboxes", None)
    _inline.inboxes = None
    try:
        ref.tell(message)
    finally:
        _inline.inboxes = saved
