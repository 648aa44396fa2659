"""pykka actors that own no thread: many supervisors multiplexed on a few dispatcher threads.

One OS thread per RunSupervisor made 1,000 concurrent runs take 1.1-1.7 s (thread start
convoys on the GIL); multiplexed on 1-2 dispatcher threads they take ~0.4 s (docs/pykka.md, last
section). `MuxActor` keeps pykka's whole surface (`tell`, `ask`, `stop`, `is_alive`, the
`ActorRegistry`) by overriding only the implementor hooks `_create_actor_inbox`,
`_create_future` and `_start_actor_loop`; tests/test_pykka_contract.py pins those hooks.

The price: a handler that blocks stalls every actor on its dispatcher thread, which makes
"the supervisor never blocks" (T2) load-bearing.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import pykka
from pykka import messages as pykka_messages
from pykka._envelope import Envelope

from .clock import SystemClock
from .flag import LazyEvent
from .inline import Helpers, _inline
from .log import get_logger

if TYPE_CHECKING:
    from pykka._actor import ActorInbox

__all__ = ["Dispatcher", "MuxActor"]

_log = get_logger("steerable.mux")
# The messages pykka itself logs for the same events go to pykka's logger, as they would for a
# ThreadingActor, so a host's pykka log settings keep working.
_pykka_log = logging.getLogger("pykka")

_new_envelope = object.__new__
_STOP: Final = object()  # the ready-queue item that ends one dispatcher thread

# A MuxActor's URN: random per process (again in a forked child), then a counter, in the
# layout of a version-4 UUID.
_urn_numbers = itertools.count()


def _urn_prefix() -> str:
    raw = os.urandom(9).hex()
    return f"{raw[:8]}-{raw[8:12]}-4{raw[12:15]}-8{raw[15:18]}"


_URN_PREFIX = _urn_prefix()


def _new_urn_prefix() -> None:
    global _URN_PREFIX  # noqa: PLW0603 - a forked child must not repeat its parent's URNs
    _URN_PREFIX = _urn_prefix()


os.register_at_fork(after_in_child=_new_urn_prefix)


class _MuxInbox:
    """A MuxActor's inbox (pykka's `ActorInbox` protocol): a deque plus a scheduled flag.

    `put` appends and, unless the actor is already on the dispatcher's ready queue (or being
    handled), puts it there. Only the thread that took the actor off the ready queue touches
    it until it clears `scheduled`, so an actor never runs on two threads at once. Everything
    below is guarded by `lock`, so a message put concurrently is never stranded: either the
    dispatcher sees it before unscheduling, or `put` sees `scheduled` cleared and schedules.
    """

    __slots__ = (
        "actor",
        "closed",
        "dispatcher",
        "envelopes",
        "kill",
        "lock",
        "scheduled",
        "started",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.envelopes: deque[Envelope[Any]] = deque()
        # Held (True) until `_start_actor_loop`: a message told before the actor starts must
        # not get it handled before `on_start` has run.
        self.scheduled = True
        self.started = False  # on_start has run; touched only by the owning dispatcher thread
        self.closed = False  # torn down: puts are answered at once, never queued
        self.kill = False  # Dispatcher.stop(): stop now, skip the queue
        # Bound by MuxActor.__init__ right after pykka's Actor.__init__ created the inbox
        # (`_create_actor_inbox` is a staticmethod and cannot know its actor).
        self.actor: MuxActor | None = None
        self.dispatcher: Dispatcher | None = None

    def put(self, envelope: Envelope[Any], /) -> None:
        with self.lock:
            if not self.closed:
                self.envelopes.append(envelope)
                if self.scheduled:
                    return
                self.scheduled = True
                collected = getattr(_inline, "inboxes", None)
                if collected is not None:
                    collected.append(self)
                    return
                dispatcher = self.dispatcher
                assert dispatcher is not None
                dispatcher._ready.put(self)
                return
        # T8: pykka can lose a message that lands during teardown; here it is answered.
        _answer_dead(envelope, "stopped before handling the message")

    def get(self) -> Envelope[Any]:
        """Take the oldest envelope; raises `queue.Empty` (never blocks: nobody waits on it)."""
        with self.lock:
            if not self.envelopes:
                raise queue.Empty
            return self.envelopes.popleft()

    def empty(self) -> bool:
        with self.lock:
            return not self.envelopes


class Dispatcher:
    """A few daemon threads that run many `MuxActor`s, one actor per thread at a time.

    Start it before (or after) starting actors on it; stop it after the runtime stopped its
    actors. `stop()` also stops any actor still alive, skipping its queued messages.

    Args:
        threads: Number of dispatcher threads (default 1). Handlers still run one at a time
            per actor, in FIFO order.
        name: Thread-name prefix (default "steerable-dispatch"); threads are `"{name}-{i}"`.
        batch: Most envelopes (default 64) one actor handles before the thread moves on to the
            next ready actor, so a chatty actor cannot starve the others.
        helpers: The pool whose idle workers handle the actors a `handoff_to_workers` block
            wakes (the runtime's worker pool); None: the dispatcher handles them.
    """

    def __init__(
        self,
        *,
        threads: int = 1,
        name: str = "steerable-dispatch",
        batch: int = 64,
        helpers: Helpers | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError("a dispatcher needs at least one thread")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self._name = name
        self._helpers = helpers
        self._batch = batch
        self._thread_count = threads
        self._ready: queue.SimpleQueue[object] = queue.SimpleQueue()  # _MuxInbox or _STOP
        self._cond = threading.Condition(threading.Lock())
        self._live: set[_MuxInbox] = set()
        self._threads: list[threading.Thread] = []
        # One counter per thread, each written only by its own thread: no lock, no lost update.
        # Index -1 counts messages handled inline by worker threads (approximate: several
        # workers may add at once; it is a statistic, not a control).
        self._handled = [0] * (threads + 1)
        self._started = False
        self._stopping = False

    def start(self) -> None:
        """Start the threads. Idempotent; raises RuntimeError once stopped."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("Dispatcher is stopped and cannot be restarted")
            if self._started:
                return
            self._started = True
            self._threads = [
                threading.Thread(target=self._run, args=(i,), name=f"{self._name}-{i}", daemon=True)
                for i in range(self._thread_count)
            ]
        for thread in self._threads:
            thread.start()

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether `thread` is one of this dispatcher's threads."""
        return thread in self._threads

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop every actor still alive, then the threads; waits up to `timeout` seconds in all.

        Live actors stop without handling their queued messages: pending asks get
        `ActorDeadError`, queued tells are dropped, `on_stop` runs. A handler that is running
        finishes first; one that blocks past `timeout` leaves its (daemon) thread behind,
        which is logged. Idempotent. Must not be called from a dispatcher thread.
        """
        if threading.current_thread() in self._threads:
            raise RuntimeError("Dispatcher.stop() called from its own thread would deadlock")
        clock = SystemClock()
        deadline = None if timeout is None else clock.now() + timeout
        with self._cond:
            self._stopping = True
            live = list(self._live)
            started = self._started
        for inbox in live:
            with inbox.lock:
                inbox.kill = True
                if inbox.scheduled:
                    continue
                inbox.scheduled = True
            self._ready.put(inbox)
        if not started:
            # No thread will ever take them off the ready queue: tear them down here.
            self._drain_unstarted()
        with self._cond:
            remaining = None if deadline is None else max(0.0, deadline - clock.now())
            if not self._cond.wait_for(lambda: not self._live, remaining):
                _log.warning("dispatcher_stop_actors_timeout", actors_live=len(self._live))
        for _ in self._threads:
            self._ready.put(_STOP)
        for thread in self._threads:
            remaining = None if deadline is None else max(0.0, deadline - clock.now())
            thread.join(remaining)
            if thread.is_alive():
                _log.warning("dispatcher_thread_still_running", thread=thread.name)

    def statistics(self) -> dict[str, int]:
        """Counters: `actors_live`, `ready_queue_depth`, `messages_handled`, and the
        `inbox_depth_total` / `inbox_depth_max` of messages waiting in actors' inboxes."""
        with self._cond:
            inboxes = list(self._live)
        depths = [len(inbox.envelopes) for inbox in inboxes]
        return {
            "actors_live": len(inboxes),
            "ready_queue_depth": self._ready.qsize(),
            "messages_handled": sum(self._handled),
            "inbox_depth_total": sum(depths),
            "inbox_depth_max": max(depths, default=0),
        }

    def _admit(self, inbox: _MuxInbox) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("Dispatcher is stopped: cannot start an actor on it")
            self._live.add(inbox)
        collected = getattr(_inline, "inboxes", None)
        if collected is not None:  # started in a `handoff_to_workers` block: collected too
            collected.append(inbox)
        else:
            self._ready.put(inbox)

    def _drain_unstarted(self) -> None:
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _MuxInbox):
                self._service_guarded(item, 0)

    def _run(self, index: int) -> None:
        ready = self._ready
        while True:
            item = ready.get()
            if not isinstance(item, _MuxInbox):
                return
            self._service_guarded(item, index)

    def _service_guarded(self, inbox: _MuxInbox, index: int) -> None:
        try:
            self._service(inbox, index)
        except BaseException:  # noqa: BLE001 - last line: no actor may kill a dispatcher thread
            _log.error("dispatcher_actor_failed", actor=str(inbox.actor), exc_info=True)
            actor = inbox.actor
            if actor is not None:
                pykka.ActorRegistry.unregister(actor.actor_ref)
                actor.actor_stopped.set()
            self._teardown(inbox)

    def _service(self, inbox: _MuxInbox, index: int) -> None:
        actor = inbox.actor
        assert actor is not None
        if not inbox.kill and not inbox.started:
            inbox.started = True
            _setup(actor)
        handled = 0
        # A MuxActor's `actor_stopped` is a LazyEvent, whose flag is a plain attribute: read
        # as such, not by a method call per envelope (two messages per W1 iteration).
        stopped = actor.actor_stopped
        envelopes = inbox.envelopes
        # No lock: this thread is the only consumer (others only append) and deque.popleft is
        # atomic; the lock matters only for the decision to unschedule, below. Tested, not
        # caught: an IndexError per call is dearer than the test (two calls per W1 iteration).
        while envelopes and handled < self._batch and not inbox.kill and not stopped._flag:
            _handle_envelope(actor, envelopes.popleft())
            handled += 1
        self._handled[index] += handled
        if inbox.kill:
            self._kill(inbox, actor)
            return
        if stopped._flag:
            self._teardown(inbox)
            return
        with inbox.lock:
            if envelopes or inbox.kill:
                requeue = True
            else:
                inbox.scheduled = False
                requeue = False
        if requeue:
            # To the back of the queue: fairness between actors.
            self._ready.put(inbox)

    def _kill(self, inbox: _MuxInbox, actor: MuxActor) -> None:
        if not actor.actor_stopped.is_set():
            if inbox.started:
                _stop_actor(actor)
            else:
                # Never started: no on_start ran, so no on_stop either.
                pykka.ActorRegistry.unregister(actor.actor_ref)
                actor.actor_stopped.set()
        self._teardown(inbox)

    def _teardown(self, inbox: _MuxInbox) -> None:
        """What pykka's `_actor_loop_teardown` does, plus closing the inbox to late puts."""
        with inbox.lock:
            inbox.closed = True
            leftovers = list(inbox.envelopes)
            inbox.envelopes.clear()
            actor = inbox.actor
            # The ref (held by anyone) keeps the inbox; the inbox must not keep the actor.
            inbox.actor = None
        for envelope in leftovers:
            _answer_dead(envelope, f"{actor} stopped before handling the message")
        with self._cond:
            self._live.discard(inbox)
            self._cond.notify_all()


class _MuxRef(pykka.ActorRef[Any]):
    """A MuxActor's ref: `tell` as pykka's, in fewer calls (two tells a W1 iteration).

    pykka's `tell` checks `is_alive()` (a call, then the stopped event's `is_set()`) and makes
    an `Envelope` through its `__init__`; here the stopped flag is read as the attribute it is
    and the envelope's two slots are set directly. tests/test_pykka_contract.py pins both.
    """

    def tell(self, message: Any) -> None:
        if self.actor_stopped._flag:  # type: ignore[attr-defined]  # a MuxActor's LazyEvent
            msg = f"{self} not found"
            raise pykka.ActorDeadError(msg)
        envelope: Envelope[Any] = _new_envelope(Envelope)
        envelope.message = message
        envelope.reply_to = None
        self.actor_inbox.put(envelope)


class MuxActor(pykka.Actor):
    """A pykka actor that owns no thread: its messages are handled on a Dispatcher's threads.

    Subclasses call `super().__init__(dispatcher=...)`. `tell`, `ask`, `ActorRef.stop()`,
    `is_alive` and the `ActorRegistry` work as for a `ThreadingActor`; `on_start` runs on a
    dispatcher thread before the first message. Differences, all deliberate: a
    `BaseException` from a handler stops only this actor (pykka would `stop_all()` the
    process, T7/T9), and a message put while the actor is being torn down is answered with
    `ActorDeadError` instead of being lost (T8).

    Args:
        dispatcher: The dispatcher whose threads run this actor.
    """

    actor_stopped: LazyEvent  # pykka declares a threading.Event; a MuxActor makes this one

    def __init__(self, *, dispatcher: Dispatcher) -> None:
        # pykka's Actor.__init__, less its two costs per actor (a run starts one, W5 starts
        # 1,000 at once): a uuid4 for the URN and a threading.Event whose Condition nobody
        # waits on. The URN stays unique: a per-process random prefix and a counter.
        # tests/test_pykka_contract.py pins what pykka's own __init__ sets.
        self.actor_urn = f"urn:uuid:{_URN_PREFIX}-{next(_urn_numbers):012x}"
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = LazyEvent()
        self._actor_ref = _MuxRef(self)
        inbox = self.actor_inbox
        if not isinstance(inbox, _MuxInbox):
            raise TypeError("MuxActor subclasses must not override _create_actor_inbox")
        inbox.actor = self
        inbox.dispatcher = dispatcher
        self._steerable_dispatcher = dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher whose threads run this actor."""
        return self._steerable_dispatcher

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return _MuxInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _MuxInbox)
        try:
            self._steerable_dispatcher._admit(inbox)
        except RuntimeError:
            # Actor.start() registered us already: leave no zombie behind (T1).
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            with inbox.lock:
                inbox.closed = True
                inbox.actor = None
            raise


def _setup(actor: MuxActor) -> None:
    """pykka's `_actor_loop_setup`, except that a BaseException stops only this actor."""
    try:
        actor.on_start()
    except Exception:  # noqa: BLE001 - same as pykka: log, unregister, stop
        actor._handle_failure(*sys.exc_info())
    except BaseException:  # noqa: BLE001 - T7: never escape to the dispatcher thread
        _log.error("actor_start_base_exception", actor=str(actor), exc_info=True)
        actor._handle_failure(*sys.exc_info())


_PYKKA_MESSAGES = (
    pykka_messages._ActorStop,
    pykka_messages.ProxyCall,
    pykka_messages.ProxyGetAttr,
    pykka_messages.ProxySetAttr,
)


def _handle_envelope(actor: MuxActor, envelope: Envelope[Any]) -> None:
    """One turn of pykka's `_actor_loop_running`, except for BaseException (T7/T9)."""
    message = envelope.message
    try:
        # pykka's _handle_receive, whose chain of isinstance checks only its own messages pass
        # (tests/test_pykka_contract.py pins the list): the rest go to on_receive directly.
        if isinstance(message, _PYKKA_MESSAGES):
            response = actor._handle_receive(message)
        else:
            response = actor.on_receive(message)
        if envelope.reply_to is not None:
            envelope.reply_to.set(response)
    except Exception:  # noqa: BLE001 - pykka's semantics: answer the asker or fail the actor
        if envelope.reply_to is not None:
            _pykka_log.info(f"Exception returned from {actor} to caller:", exc_info=True)
            envelope.reply_to.set_exception()
        else:
            actor._handle_failure(*sys.exc_info())
            try:
                actor.on_failure(*sys.exc_info())
            except Exception:  # noqa: BLE001
                actor._handle_failure(*sys.exc_info())
    except BaseException as exc:  # noqa: BLE001
        # pykka would call ActorRegistry.stop_all() and stop the host's actors too (T9), and
        # leave the asker hanging. Stop only this actor and answer the asker.
        _log.error("actor_base_exception", actor=str(actor), error=repr(exc), exc_info=True)
        if envelope.reply_to is not None:
            dead = pykka.ActorDeadError(f"{actor} stopped by {exc!r}")
            dead.__cause__ = exc
            envelope.reply_to.set_exception(exc_info=(type(dead), dead, None))
        _stop_actor(actor)


def _stop_actor(actor: MuxActor) -> None:
    """pykka's `_stop()` (unregister, stopped, `on_stop`) with nothing allowed to escape."""
    try:
        actor._stop()
    except BaseException:  # noqa: BLE001
        _log.error("actor_stop_failed", actor=str(actor), exc_info=True)
        pykka.ActorRegistry.unregister(actor.actor_ref)
        actor.actor_stopped.set()


def _answer_dead(envelope: Envelope[Any], reason: str) -> None:
    reply_to = envelope.reply_to
    if reply_to is None:
        return  # a tell to a dead actor is dropped, as pykka does
    try:
        if isinstance(envelope.message, pykka_messages._ActorStop):
            reply_to.set(None)  # pykka answers a stop that arrives while stopping with "stopped"
        else:
            error = pykka.ActorDeadError(reason)
            reply_to.set_exception(exc_info=(type(error), error, None))
    except queue.Full:
        pass  # already answered
