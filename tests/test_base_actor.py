"""SteerableActor contains every handler error, on ThreadingActor and on MuxActor (T7)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest
from structlog.testing import capture_logs

from steerable.actors._engine.base import SteerableActor
from steerable.actors._engine.mux import Dispatcher, MuxActor

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation

ERRORS: list[Callable[[], BaseException]] = [
    lambda: ValueError("plain"),
    lambda: SystemExit(3),
    KeyboardInterrupt,
    asyncio.CancelledError,
]


class Raise:
    """A message asking the actor to raise `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Recording(SteerableActor):
    """The behaviour under test, mixed into either actor kind below."""

    fail_starting: BaseException | None = None
    fail_stopping: BaseException | None = None
    fail_error_handler = False

    def init_recording(self) -> None:
        self.errors: list[tuple[object, BaseException]] = []
        self.handled: list[object] = []
        self.stopping_done = threading.Event()

    def handle(self, message: object) -> object:
        if isinstance(message, Raise):
            raise message.error
        if message == "errors":
            return list(self.errors)
        self.handled.append(message)
        return ("ok", message)

    def on_handler_error(self, message: object, exc: BaseException) -> None:
        self.errors.append((message, exc))
        if self.fail_error_handler:
            raise RuntimeError("the error handler failed too")

    def starting(self) -> None:
        if self.fail_starting is not None:
            raise self.fail_starting

    def stopping(self) -> None:
        self.stopping_done.set()
        if self.fail_stopping is not None:
            raise self.fail_stopping


class ThreadedRecording(Recording, pykka.ThreadingActor):
    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.init_recording()
        for key, value in config.items():
            setattr(self, key, value)


class MuxRecording(Recording, MuxActor):
    def __init__(self, *, dispatcher: Dispatcher, **config: Any) -> None:
        super().__init__(dispatcher=dispatcher)
        self.init_recording()
        for key, value in config.items():
            setattr(self, key, value)


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(name="steerable-dispatch-base")
    d.start()
    try:
        yield d
    finally:
        d.stop()


Starter = Callable[..., "pykka.ActorRef[Any]"]


@pytest.fixture(params=["threading", "mux"])
def start(request: pytest.FixtureRequest, dispatcher: Dispatcher) -> Iterator[Starter]:
    refs: list[pykka.ActorRef[Any]] = []

    def starter(**config: Any) -> pykka.ActorRef[Any]:
        if request.param == "threading":
            ref: pykka.ActorRef[Any] = ThreadedRecording.start(**config)
        else:
            ref = MuxRecording.start(dispatcher=dispatcher, **config)
        refs.append(ref)
        return ref

    try:
        yield starter
    finally:
        for ref in refs:
            ref.stop(timeout=GUARD)


def actor_of(ref: pykka.ActorRef[Any]) -> Recording:
    actor = ref._actor_weakref()
    assert isinstance(actor, Recording)
    return actor


@pytest.mark.parametrize("make_error", ERRORS)
def test_tell_errors_go_to_on_handler_error_and_the_actor_keeps_serving(
    start: Starter, make_error: Callable[[], BaseException]
) -> None:
    bystander = start()
    ref = start()
    error = make_error()
    message = Raise(error)
    ref.tell(message)
    ref.tell("after")
    assert ref.ask("next", timeout=GUARD) == ("ok", "next")
    errors = ref.ask("errors", timeout=GUARD)
    assert errors == [(message, error)]
    assert actor_of(ref).handled == ["after", "next"]
    assert ref.is_alive()
    assert bystander.is_alive()


@pytest.mark.parametrize("make_error", ERRORS)
def test_ask_after_a_handler_error_returns_none(
    start: Starter, make_error: Callable[[], BaseException]
) -> None:
    ref = start()
    error = make_error()
    assert ref.ask(Raise(error), timeout=GUARD) is None
    assert ref.ask("errors", block=True, timeout=GUARD)[0][1] is error
    assert ref.is_alive()


def test_default_on_handler_error_logs(dispatcher: Dispatcher) -> None:
    class Plain(SteerableActor, MuxActor):
        def handle(self, message: object) -> object:
            raise ValueError("nope")

    ref = Plain.start(dispatcher=dispatcher)
    try:
        with capture_logs() as logs:
            assert ref.ask("hello", timeout=GUARD) is None
        assert [e["event"] for e in logs] == ["actor_handler_failed"]
        assert logs[0]["log_level"] == "error"
        assert logs[0]["message_type"] == "str"
        assert isinstance(logs[0]["exc_info"], ValueError)
    finally:
        ref.stop(timeout=GUARD)


def test_unimplemented_handle_is_contained(dispatcher: Dispatcher) -> None:
    class Empty(SteerableActor, MuxActor):
        pass

    ref = Empty.start(dispatcher=dispatcher)
    try:
        with capture_logs() as logs:
            assert ref.ask("anything", timeout=GUARD) is None
        assert isinstance(logs[0]["exc_info"], NotImplementedError)
        assert ref.is_alive()
    finally:
        ref.stop(timeout=GUARD)


def test_a_failing_error_handler_is_logged_and_swallowed(start: Starter) -> None:
    ref = start(fail_error_handler=True)
    with capture_logs() as logs:
        ref.tell(Raise(SystemExit(1)))
        assert ref.ask("still serving", timeout=GUARD) == ("ok", "still serving")
    assert "actor_error_handler_failed" in [e["event"] for e in logs]
    assert ref.is_alive()


@pytest.mark.parametrize("make_error", ERRORS)
def test_starting_errors_are_contained(
    start: Starter, make_error: Callable[[], BaseException]
) -> None:
    error = make_error()
    ref = start(fail_starting=error)
    assert ref.ask("serving", timeout=GUARD) == ("ok", "serving")
    assert ref.ask("errors", timeout=GUARD) == [(None, error)]


@pytest.mark.parametrize("make_error", ERRORS)
def test_stopping_errors_are_contained(
    start: Starter, make_error: Callable[[], BaseException]
) -> None:
    error = make_error()
    bystander = start()
    ref = start(fail_stopping=error)
    actor = actor_of(ref)
    assert ref.stop(timeout=GUARD) is True
    assert actor.stopping_done.is_set()
    assert actor.errors == [(None, error)]
    assert bystander.is_alive()  # no stop_all()
