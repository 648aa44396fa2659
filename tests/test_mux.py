"""MuxActor on a Dispatcher: pykka's surface, FIFO, no reentrancy, failures contained."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from steerable.actors._engine.mux import Dispatcher, MuxActor

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(name="steerable-dispatch-test")
    d.start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def dispatcher2() -> Iterator[Dispatcher]:
    d = Dispatcher(threads=2, name="steerable-dispatch-test2", batch=4)
    d.start()
    try:
        yield d
    finally:
        d.stop()


class Echo(MuxActor):
    """Replies to asks with what it got; records everything; can block, raise or stop."""

    def __init__(self, *, dispatcher: Dispatcher, gate: threading.Event | None = None) -> None:
        super().__init__(dispatcher=dispatcher)
        self.gate = gate
        self.received: list[Any] = []
        self.events: list[str] = []
        self.entered = threading.Event()
        self.stopped_event = threading.Event()
        self.failed = threading.Event()

    def on_start(self) -> None:
        self.events.append(f"start:{threading.current_thread().name}")

    def on_stop(self) -> None:
        self.events.append("stop")
        self.stopped_event.set()

    def on_failure(self, *args: object) -> None:
        self.failed.set()

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.entered.set()
            assert self.gate is not None
            assert self.gate.wait(GUARD)
            return "unblocked"
        if message == "raise":
            raise ValueError("handler failed")
        if message == "exit":
            raise SystemExit(2)
        if message == "received":
            return list(self.received)
        if message == "events":
            return list(self.events)
        self.received.append(message)
        return message


def test_tell_ask_stop(dispatcher: Dispatcher) -> None:
    ref = Echo.start(dispatcher=dispatcher)
    assert ref.is_alive()
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is ref
    ref.tell("a")
    ref.tell("b")
    assert ref.ask("c", timeout=GUARD) == "c"
    assert ref.ask("received", timeout=GUARD) == ["a", "b", "c"]
    events = ref.ask("events", timeout=GUARD)
    assert events == ["start:steerable-dispatch-test-0"]
    future = ref.ask("d", block=False)
    assert future.get(timeout=GUARD) == "d"
    assert ref.stop(timeout=GUARD) is True
    assert not ref.is_alive()
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None
    assert ref.stop(timeout=GUARD) is False  # already dead
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("late", timeout=GUARD)
    assert dispatcher.statistics()["actors_live"] == 0


def test_actor_urns_are_unique_uuid_urns(dispatcher: Dispatcher) -> None:
    refs = [Echo.start(dispatcher=dispatcher) for _ in range(50)]
    try:
        urns = [ref.actor_urn for ref in refs]
        assert len(set(urns)) == 50
        for urn in urns:
            assert urn.startswith("urn:uuid:")
            parsed = uuid.UUID(urn.removeprefix("urn:uuid:"))
            assert parsed.version == 4
            assert pykka.ActorRegistry.get_by_urn(urn) is not None
    finally:
        for ref in refs:
            ref.stop(timeout=GUARD)
    assert all(not ref.is_alive() for ref in refs)


def test_stop_non_blocking_and_on_stop(dispatcher: Dispatcher) -> None:
    ref = Echo.start(dispatcher=dispatcher)
    actor = ref._actor_weakref()
    assert isinstance(actor, Echo)
    assert actor.dispatcher is dispatcher
    future = ref.stop(block=False)
    assert future.get(timeout=GUARD) is True
    assert actor.stopped_event.is_set()
    assert actor.events[-1] == "stop"


def test_messages_before_start_wait_for_on_start() -> None:
    d = Dispatcher(name="steerable-dispatch-late")
    try:
        ref = Echo.start(dispatcher=d)
        ref.tell("early")
        future = ref.ask("events", block=False)
        d.start()  # started after the actor: on_start still runs first
        assert len(future.get(timeout=GUARD)) == 1
        assert ref.stop(timeout=GUARD) is True
    finally:
        d.stop()


def test_stop_is_queued_behind_earlier_messages(dispatcher: Dispatcher) -> None:
    gate = threading.Event()
    ref = Echo.start(dispatcher=dispatcher, gate=gate)
    ref.tell("block")
    for i in range(5):
        ref.tell(i)
    stop_future = ref.stop(block=False)
    late = ref.ask("late", block=False)  # sent after stop: answered with ActorDeadError
    gate.set()
    assert stop_future.get(timeout=GUARD) is True
    with pytest.raises(pykka.ActorDeadError):
        late.get(timeout=GUARD)


def test_stop_answers_pending_asks_with_actor_dead_error(dispatcher: Dispatcher) -> None:
    gate = threading.Event()
    ref = Echo.start(dispatcher=dispatcher, gate=gate)
    actor = ref._actor_weakref()
    assert isinstance(actor, Echo)
    ref.tell("block")
    assert actor.entered.wait(GUARD)
    stop_future = ref.stop(block=False)
    pending = [ref.ask(i, block=False) for i in range(10)]
    second_stop = ref.stop(block=False)
    gate.set()
    assert stop_future.get(timeout=GUARD) is True
    for future in pending:
        with pytest.raises(pykka.ActorDeadError):
            future.get(timeout=GUARD)
    assert second_stop.get(timeout=GUARD) is True  # "was being stopped", as in pykka


def _ask_until_dead(
    ref: pykka.ActorRef[Echo], out: list[pykka.Future[Any]], started: threading.Barrier
) -> None:
    started.wait(GUARD)
    for i in range(300):
        try:
            out.append(ref.ask(i, block=False))
        except pykka.ActorDeadError:
            return


def test_asks_racing_a_stop_are_always_answered(dispatcher2: Dispatcher) -> None:
    # docs/pykka.md T8: with ThreadingActor a few asks sent during stop() were never answered.
    for _ in range(20):
        ref = Echo.start(dispatcher=dispatcher2)
        futures: list[pykka.Future[Any]] = []
        started = threading.Barrier(2)
        thread = threading.Thread(target=_ask_until_dead, args=(ref, futures, started))
        thread.start()
        started.wait(GUARD)
        assert ref.stop(timeout=GUARD) is True
        thread.join(GUARD)
        assert not thread.is_alive()
        for i, future in enumerate(futures):
            # Every ask is answered: handled before the stop, or ActorDeadError after it.
            with contextlib.suppress(pykka.ActorDeadError):
                assert future.get(timeout=GUARD) == i


class Recorder(MuxActor):
    def __init__(self, *, dispatcher: Dispatcher) -> None:
        super().__init__(dispatcher=dispatcher)
        self.seen: dict[int, list[int]] = {}

    def on_receive(self, message: Any) -> Any:
        if message == "seen":
            return self.seen
        sender, seq = message
        self.seen.setdefault(sender, []).append(seq)
        return None


def test_thousand_actors_on_one_thread_fifo_per_sender(dispatcher: Dispatcher) -> None:
    refs = [Recorder.start(dispatcher=dispatcher) for _ in range(1_000)]
    senders = 4
    per_sender = 20
    barrier = threading.Barrier(senders)

    def send(sender: int) -> None:
        barrier.wait(GUARD)
        for seq in range(per_sender):
            for ref in refs:
                ref.tell((sender, seq))

    threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
        assert not t.is_alive()
    for ref in refs:
        seen = ref.ask("seen", timeout=GUARD)
        assert seen == {s: list(range(per_sender)) for s in range(senders)}
    assert dispatcher.statistics()["actors_live"] == 1_000
    assert dispatcher.statistics()["messages_handled"] >= 1_000 * senders * per_sender
    futures = [ref.stop(block=False) for ref in refs]
    assert all(f.get(timeout=GUARD) for f in futures)
    assert dispatcher.statistics()["actors_live"] == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("Recorder-")]


class NonReentrant(MuxActor):
    def __init__(self, *, dispatcher: Dispatcher, violations: list[str]) -> None:
        super().__init__(dispatcher=dispatcher)
        self.busy = threading.Lock()
        self.violations = violations
        self.count = 0

    def on_receive(self, message: Any) -> Any:
        if not self.busy.acquire(blocking=False):
            self.violations.append(str(self))
            return None
        try:
            # Widen the window a concurrent run would need: yield the GIL a few times.
            for _ in range(3):
                threading.Event().wait(0)
            self.count += 1
            return self.count
        finally:
            self.busy.release()


def test_an_actor_never_runs_on_two_threads_at_once(dispatcher2: Dispatcher) -> None:
    violations: list[str] = []
    refs = [NonReentrant.start(dispatcher=dispatcher2, violations=violations) for _ in range(8)]
    senders = 4
    per_sender = 250
    barrier = threading.Barrier(senders)

    def send() -> None:
        barrier.wait(GUARD)
        for _ in range(per_sender):
            for ref in refs:
                ref.tell("hit")

    threads = [threading.Thread(target=send) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
        assert not t.is_alive()
    counts = [ref.ask("count", timeout=GUARD) for ref in refs]
    assert violations == []
    assert counts == [senders * per_sender + 1] * len(refs)
    for ref in refs:
        assert ref.stop(timeout=GUARD)


def test_tell_that_raises_stops_only_that_actor(dispatcher: Dispatcher) -> None:
    victim = Echo.start(dispatcher=dispatcher)
    bystander = Echo.start(dispatcher=dispatcher)
    actor = victim._actor_weakref()
    assert isinstance(actor, Echo)
    victim.tell("raise")
    victim.tell("dropped")
    assert actor.failed.wait(GUARD)  # pykka semantics: on_failure, actor stopped
    assert victim.actor_stopped.wait(GUARD)
    assert pykka.ActorRegistry.get_by_urn(victim.actor_urn) is None
    assert bystander.ask("still here", timeout=GUARD) == "still here"
    assert all(t.is_alive() for t in dispatcher._threads)
    # An ask that raises is returned to the caller and the actor lives on.
    with pytest.raises(ValueError, match="handler failed"):
        bystander.ask("raise", timeout=GUARD)
    assert bystander.is_alive()
    assert bystander.stop(timeout=GUARD)


@pytest.mark.parametrize("message", ["exit"])
def test_base_exception_stops_only_that_actor(dispatcher: Dispatcher, message: str) -> None:
    victim = Echo.start(dispatcher=dispatcher)
    bystander = Echo.start(dispatcher=dispatcher)
    outsider = Echo.start(dispatcher=dispatcher)  # would be stopped by pykka's stop_all()
    actor = victim._actor_weakref()
    assert isinstance(actor, Echo)
    with pytest.raises(pykka.ActorDeadError) as caught:
        victim.ask(message, timeout=GUARD)  # answered, not left hanging
    assert isinstance(caught.value.__cause__, SystemExit)
    assert not victim.is_alive()
    assert actor.stopped_event.is_set()  # stopped like pykka's _stop(): on_stop ran
    victim_tell = Echo.start(dispatcher=dispatcher)
    victim_tell.tell(message)
    assert victim_tell.actor_stopped.wait(GUARD)
    assert bystander.ask("ok", timeout=GUARD) == "ok"
    assert outsider.is_alive()
    assert all(t.is_alive() for t in dispatcher._threads)
    assert bystander.stop(timeout=GUARD)
    assert outsider.stop(timeout=GUARD)


class FailingStart(MuxActor):
    def on_start(self) -> None:
        raise RuntimeError("no start")


class ExitingStart(MuxActor):
    def on_start(self) -> None:
        raise SystemExit(1)


@pytest.mark.parametrize("cls", [FailingStart, ExitingStart])
def test_on_start_failure_stops_only_that_actor(
    dispatcher: Dispatcher, cls: type[MuxActor]
) -> None:
    bystander = Echo.start(dispatcher=dispatcher)
    ref = cls.start(dispatcher=dispatcher)
    assert ref.actor_stopped.wait(GUARD)
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("x", timeout=GUARD)
    assert bystander.ask("ok", timeout=GUARD) == "ok"
    assert bystander.stop(timeout=GUARD)
    assert dispatcher.statistics()["actors_live"] == 0


def test_dispatcher_stop_stops_live_actors_and_joins_threads() -> None:
    d = Dispatcher(threads=2, name="steerable-dispatch-stoptest")
    d.start()
    d.start()  # idempotent
    gate = threading.Event()
    blocked = Echo.start(dispatcher=d, gate=gate)
    idle = Echo.start(dispatcher=d)
    blocked_actor = blocked._actor_weakref()
    idle_actor = idle._actor_weakref()
    assert isinstance(blocked_actor, Echo)
    assert isinstance(idle_actor, Echo)
    # Started before stop() (its on_start ran): an actor killed before it ever started gets
    # no on_stop, so `stopped_event` would never be set.
    assert idle.ask("ping", timeout=GUARD) == "ping"
    blocked.tell("block")
    assert blocked_actor.entered.wait(GUARD)
    pending = [blocked.ask(i, block=False) for i in range(5)]
    stopper = threading.Thread(target=d.stop, name="stopper")
    stopper.start()
    assert idle_actor.stopped_event.wait(GUARD)  # stopped while the other is still blocked
    gate.set()
    stopper.join(GUARD)
    assert not stopper.is_alive()
    for future in pending:
        with pytest.raises(pykka.ActorDeadError):
            future.get(timeout=GUARD)
    assert blocked_actor.stopped_event.is_set()
    assert not blocked.is_alive()
    assert not idle.is_alive()
    names = {t.name for t in threading.enumerate()}
    assert not {n for n in names if n.startswith("steerable-dispatch-stoptest")}
    assert d.statistics()["actors_live"] == 0
    d.stop()  # idempotent
    with pytest.raises(RuntimeError):
        Echo.start(dispatcher=d)
    assert not [ref for ref in pykka.ActorRegistry.get_all() if ref.actor_class is Echo]
    with pytest.raises(RuntimeError):
        d.start()


def test_dispatcher_stop_without_start_tears_actors_down() -> None:
    d = Dispatcher(name="steerable-dispatch-unstarted")
    ref = Echo.start(dispatcher=d)
    future = ref.ask("x", block=False)
    d.stop()
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        future.get(timeout=GUARD)
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_stop_from_a_dispatcher_thread_is_refused(dispatcher: Dispatcher) -> None:
    class Stopper(MuxActor):
        def on_receive(self, message: Any) -> Any:
            self.dispatcher.stop()

    ref = Stopper.start(dispatcher=dispatcher)
    with pytest.raises(RuntimeError, match="deadlock"):
        ref.ask("stop it", timeout=GUARD)
    assert ref.stop(timeout=GUARD)


def test_statistics_and_validation() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        Dispatcher(threads=0)
    with pytest.raises(ValueError, match="batch"):
        Dispatcher(batch=0)
    d = Dispatcher(name="steerable-dispatch-stats")
    assert d.statistics() == {
        "actors_live": 0,
        "ready_queue_depth": 0,
        "messages_handled": 0,
        "inbox_depth_total": 0,
        "inbox_depth_max": 0,
    }
    d.stop()
