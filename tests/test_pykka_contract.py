"""Contract tests on plain pykka: the behaviours docs/pykka.md lists, and the hooks _mux.py uses.

steerable's design leans on each of these (T2, T4, T7, T8, T12, T13 and the dispatcher
section). If a pykka upgrade changes one of them, a test here fails loudly and the design
note must be revisited before the pin moves.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import inspect
import queue
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from pykka import messages as pykka_messages
from pykka._envelope import Envelope

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation
SHORT = 0.05  # seconds: only where the asserted outcome is "no answer comes"


@pytest.fixture
def refs() -> Iterator[list[pykka.ActorRef[Any]]]:
    """Actors started by a test; stopped (with a timeout, T3) whatever happens."""
    started: list[pykka.ActorRef[Any]] = []
    try:
        yield started
    finally:
        for ref in started:
            ref.stop(timeout=GUARD)


class Probe(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.entered = threading.Event()
        self.handled: list[Any] = []
        self.stopped_event = threading.Event()
        self.failed = threading.Event()
        self.late_ran = threading.Event()

    def on_stop(self) -> None:
        self.stopped_event.set()

    def on_failure(self, *args: object) -> None:
        self.failed.set()

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.entered.set()
            assert self.gate is not None
            assert self.gate.wait(GUARD)
            return None
        if message == "raise":
            raise ValueError("boom")
        if message == "late":
            self.late_ran.set()
            return "late"
        if message == "handled":
            return list(self.handled)
        if message == "ask-self":
            try:
                return self.actor_ref.ask("inner", timeout=SHORT)
            except pykka.Timeout:
                return "deadlocked"
        self.handled.append(message)
        return message


def probe(refs: list[pykka.ActorRef[Any]], gate: threading.Event | None = None) -> Probe:
    ref = Probe.start(gate)
    refs.append(ref)
    actor = ref._actor_weakref()
    assert isinstance(actor, Probe)
    return actor


def test_pykka_version_is_the_one_these_contracts_were_written_for() -> None:
    version = importlib.metadata.version("pykka")
    major, minor = (int(part) for part in version.split(".")[:2])
    assert (major, minor) >= (4, 5)
    assert major < 5


def test_ask_to_self_deadlocks(refs: list[pykka.ActorRef[Any]]) -> None:
    actor = probe(refs)
    # The inner ask can only time out: the actor's one thread is busy asking.
    assert actor.actor_ref.ask("ask-self", timeout=GUARD) == "deadlocked"
    # Unblocked, the inner message still runs afterwards.
    assert actor.actor_ref.ask("handled", timeout=GUARD) == ["inner"]


def test_timed_out_ask_still_runs_the_message_later(refs: list[pykka.ActorRef[Any]]) -> None:
    gate = threading.Event()
    actor = probe(refs, gate)
    actor.actor_ref.tell("block")
    assert actor.entered.wait(GUARD)
    with pytest.raises(pykka.Timeout):
        actor.actor_ref.ask("late", timeout=SHORT)
    assert not actor.late_ran.is_set()
    gate.set()
    assert actor.late_ran.wait(GUARD)


def test_stop_is_queued_behind_messages_and_cannot_interrupt(
    refs: list[pykka.ActorRef[Any]],
) -> None:
    gate = threading.Event()
    actor = probe(refs, gate)
    ref = actor.actor_ref
    ref.tell("block")
    assert actor.entered.wait(GUARD)
    for i in range(5):
        ref.tell(i)
    stop_future = ref.stop(block=False)
    with pytest.raises(pykka.Timeout):
        ref.stop(timeout=SHORT)  # the running handler is not interrupted
    assert ref.is_alive()
    gate.set()
    assert stop_future.get(timeout=GUARD) is True
    assert actor.handled == [0, 1, 2, 3, 4]  # everything queued before stop ran first
    assert actor.stopped_event.is_set()


def test_tell_that_raises_kills_the_actor_and_drops_queued_tells(
    refs: list[pykka.ActorRef[Any]],
) -> None:
    gate = threading.Event()
    actor = probe(refs, gate)
    ref = actor.actor_ref
    ref.tell("block")
    assert actor.entered.wait(GUARD)
    ref.tell("raise")
    ref.tell("dropped-1")
    ref.tell("dropped-2")
    gate.set()
    assert actor.failed.wait(GUARD)
    # on_failure runs after the stopped flag is set; the loop exits without handling more.
    assert not ref.is_alive()
    assert actor.handled == []
    assert not actor.stopped_event.is_set()  # on_stop is skipped
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("after")


def test_ask_that_raises_does_not_kill_the_actor(refs: list[pykka.ActorRef[Any]]) -> None:
    actor = probe(refs)
    with pytest.raises(ValueError, match="boom"):
        actor.actor_ref.ask("raise", timeout=GUARD)
    assert actor.actor_ref.ask("alive", timeout=GUARD) == "alive"


def test_on_start_failure_is_invisible_to_start() -> None:
    class FailsToStart(pykka.ThreadingActor):
        use_daemon_thread = True

        def on_start(self) -> None:
            raise RuntimeError("no start")

    ref = FailsToStart.start()  # does not raise
    assert ref.actor_stopped.wait(GUARD)
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("x", timeout=GUARD)


def test_base_exception_in_any_actor_stops_every_actor() -> None:
    # In a subprocess: stop_all() here would stop the test process's own actors.
    script = textwrap.dedent(
        """
        import pykka

        class Exits(pykka.ThreadingActor):
            use_daemon_thread = True

            def on_receive(self, message):
                raise SystemExit(3)

        class Bystander(pykka.ThreadingActor):
            use_daemon_thread = True

            def on_receive(self, message):
                return message

        bystander = Bystander.start()
        exits = Exits.start()
        asker = exits.ask("boom", block=False)
        assert bystander.actor_stopped.wait(10), "bystander still alive"
        try:
            asker.get(timeout=0.05)
        except pykka.Timeout:
            print("asker-left-hanging")
        print("all-stopped" if not pykka.ActorRegistry.get_all() else "still-registered")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["asker-left-hanging", "all-stopped"]


_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_contextvars_do_not_reach_actor_threads(refs: list[pykka.ActorRef[Any]]) -> None:
    class ReadsContext(pykka.ThreadingActor):
        use_daemon_thread = True

        def on_receive(self, message: Any) -> Any:
            return _request_id.get()

    token = _request_id.set("req-1")
    try:
        ref = ReadsContext.start()
        refs.append(ref)
        assert ref.ask("which", timeout=GUARD) == "unset"
    finally:
        _request_id.reset(token)


def test_messages_are_passed_by_reference(refs: list[pykka.ActorRef[Any]]) -> None:
    class Mutates(pykka.ThreadingActor):
        use_daemon_thread = True

        def on_receive(self, message: Any) -> Any:
            message.append("mutated by the actor")
            return message

    ref = Mutates.start()
    refs.append(ref)
    sent: list[str] = []
    reply = ref.ask(sent, timeout=GUARD)
    assert reply is sent
    assert sent == ["mutated by the actor"]


# --- the implementor hooks that steerable.actors._engine.mux relies on ---


class HookedInbox:
    """A non-queue inbox: pykka must only use put/get/empty on it."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        self.puts = 0

    def put(self, envelope: Envelope[Any], /) -> None:
        self.puts += 1
        self.items.put(envelope)

    def get(self) -> Envelope[Any]:
        return self.items.get()

    def empty(self) -> bool:
        return self.items.empty()


class Hooked(pykka.Actor):
    calls: list[str] = []

    @staticmethod
    def _create_actor_inbox() -> HookedInbox:
        Hooked.calls.append("create_inbox")
        return HookedInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        Hooked.calls.append("create_future")
        return pykka.ThreadingFuture()

    def __init__(self) -> None:
        super().__init__()
        Hooked.calls.append("init")
        # ActorRef copies the inbox at construction: it must be ours already.
        assert self.actor_ref.actor_inbox is self.actor_inbox

    def _start_actor_loop(self) -> None:
        Hooked.calls.append(
            f"start_loop registered={pykka.ActorRegistry.get_by_urn(self.actor_urn) is not None}"
        )
        self.thread = threading.Thread(target=self._actor_loop, name="HookedActor", daemon=True)
        self.thread.start()

    def on_receive(self, message: Any) -> Any:
        return ("echo", message)


def test_implementor_hooks_are_called_as_mux_expects() -> None:
    Hooked.calls.clear()
    ref = Hooked.start()
    try:
        assert Hooked.calls == ["create_inbox", "init", "start_loop registered=True"]
        assert isinstance(ref.actor_inbox, HookedInbox)
        assert ref.ask("hi", timeout=GUARD) == ("echo", "hi")
        assert Hooked.calls[-1] == "create_future"  # ask() builds the future via the class
        puts = ref.actor_inbox.puts
        ref.tell("t")
        assert ref.actor_inbox.puts == puts + 1  # tell() goes straight to inbox.put
    finally:
        assert ref.stop(timeout=GUARD) is True
    actor = ref._actor_weakref()
    if actor is not None:
        actor.thread.join(GUARD)


def test_private_surface_used_by_mux_is_unchanged() -> None:
    # _mux.py replicates one turn of Actor._actor_loop_running and _actor_loop_teardown.
    actor_cls = pykka.Actor
    for name in (
        "_handle_receive",
        "_handle_failure",
        "_stop",
        "_actor_loop",
        "_actor_loop_setup",
        "_actor_loop_running",
        "_actor_loop_teardown",
        "on_failure",
    ):
        assert callable(getattr(actor_cls, name)), name
    assert isinstance(inspect.getattr_static(actor_cls, "_create_actor_inbox"), staticmethod)
    assert isinstance(inspect.getattr_static(actor_cls, "_create_future"), staticmethod)
    assert list(inspect.signature(actor_cls._handle_receive).parameters) == ["self", "message"]
    assert list(inspect.signature(actor_cls._handle_failure).parameters) == [
        "self",
        "exception_type",
        "exception_value",
        "traceback",
    ]
    assert Envelope.__slots__ == ["message", "reply_to"]
    envelope = Envelope("m")
    assert envelope.message == "m"
    assert envelope.reply_to is None
    assert isinstance(pykka_messages._ActorStop(), object)
    # _handle_receive handles only these four message types itself, then calls on_receive.
    receive = inspect.getsource(actor_cls._handle_receive)
    checked = [line.strip() for line in receive.splitlines() if "isinstance(message" in line]
    assert checked == [
        "if isinstance(message, messages._ActorStop):  # noqa: SLF001",
        "if isinstance(message, messages.ProxyCall):",
        "if isinstance(message, messages.ProxyGetAttr):",
        "if isinstance(message, messages.ProxySetAttr):",
    ]
    assert receive.rstrip().endswith("return self.on_receive(message)")
    # The loop's own source still does what _mux.py replicates.
    running = inspect.getsource(actor_cls._actor_loop_running)
    for fragment in ("_handle_receive", "reply_to.set(", "set_exception()", "on_failure"):
        assert fragment in running, fragment
    assert "ActorRegistry.stop_all()" in running
    teardown = inspect.getsource(actor_cls._actor_loop_teardown)
    assert "ActorDeadError" in teardown
    assert "_ActorStop" in teardown


def test_actor_init_sets_what_mux_actor_sets_itself() -> None:
    # MuxActor.__init__ does pykka's Actor.__init__ itself (a cheaper URN and stopped flag).
    source = inspect.getsource(pykka.Actor.__init__)
    body = [
        line.strip()
        for line in source.split('"""')[-1].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert body == [
        "self.actor_urn = uuid.uuid4().urn",
        "self.actor_inbox = self._create_actor_inbox()",
        "self.actor_stopped = threading.Event()",
        "self._actor_ref = ActorRef(self)",
    ]


def test_tell_does_what_a_mux_ref_does_itself() -> None:
    # mux._MuxRef.tell replicates ActorRef.tell (the stopped flag read directly, the
    # envelope's two slots set without its __init__).
    source = inspect.getsource(pykka.ActorRef.tell)
    body = [
        line.strip()
        for line in source.split('"""')[-1].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert body == [
        "if not self.is_alive():",
        'msg = f"{self} not found"',
        "raise ActorDeadError(msg)",
        "self.actor_inbox.put(Envelope(message))",
    ]
    assert (
        inspect.getsource(pykka.ActorRef.is_alive)
        .rstrip()
        .endswith("return not self.actor_stopped.is_set()")
    )
    init = inspect.getsource(Envelope.__init__)
    assert "self.message = message" in init
    assert "self.reply_to = reply_to" in init
