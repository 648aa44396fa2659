"""Error containment for every steerable actor (docs/pykka.md T7).

With plain pykka a `tell` handler that raises kills the actor and silently drops its queued
messages, and a `BaseException` (`SystemExit` from a CLI wrapper, `asyncio.CancelledError`
from a tool's own loop) makes pykka stop every actor in the process, the host's included.
`SteerableActor` wraps every handler and lifecycle hook in `try/except BaseException` and
hands the error to `on_handler_error`, which records it on the run (R6); nothing re-raises,
so neither `on_failure` nor `ActorRegistry.stop_all()` can fire.
"""

from __future__ import annotations

from .log import get_logger

__all__ = ["SteerableActor"]

_log = get_logger("steerable.actor")


class SteerableActor:
    """Mixin that contains every error a handler raises; put it first in the bases.

    Works with `pykka.ThreadingActor` and `MuxActor`:
    `class RunSupervisor(SteerableActor, MuxActor)`. Subclasses implement `handle()` (not
    `on_receive`), `starting()` and `stopping()` (not `on_start` / `on_stop`), and override
    `on_handler_error()` to turn the error into the unified error contract on the run (R5).

    Runtime actors receive only `tell`s (T2); `ask` is for the host boundary. An `ask` whose
    handler fails therefore returns `None` to the caller, never the exception: the error goes
    to `on_handler_error`, which owns reporting it. Proxy calls bypass `on_receive` and so
    this containment; steerable does not use proxies (T2).
    """

    def on_receive(self, message: object) -> object:
        """Dispatch to `handle()`; never raises. Do not override: override `handle()`."""
        try:
            return self.handle(message)
        except BaseException as exc:  # noqa: BLE001 - T7: nothing may escape to pykka
            self._steerable_report(message, exc)
            return None

    def handle(self, message: object) -> object:
        """Handle one message; what it returns answers an `ask`. Subclasses implement it.

        Anything it raises, `BaseException` included, goes to `on_handler_error` and the
        actor keeps serving.
        """
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(message)}")

    def on_handler_error(self, message: object, exc: BaseException) -> None:
        """Record an error raised by `handle` (or by `starting` / `stopping`: message None).

        The default logs it. Subclasses record it on the run (R6) and tell whoever waits.
        Anything this raises is logged and swallowed.
        """
        _log.error(
            "actor_handler_failed",
            actor=str(self),
            message_type=type(message).__name__,
            error=repr(exc),
            exc_info=exc,
        )

    def on_start(self) -> None:
        """Run `starting()` with errors contained. Do not override: override `starting()`."""
        try:
            self.starting()
        except BaseException as exc:  # noqa: BLE001 - T7: an on_start failure is invisible
            self._steerable_report(None, exc)

    def on_stop(self) -> None:
        """Run `stopping()` with errors contained. Do not override: override `stopping()`."""
        try:
            self.stopping()
        except BaseException as exc:  # noqa: BLE001
            self._steerable_report(None, exc)

    def starting(self) -> None:
        """Set up on the actor's thread before the first message; errors are contained."""

    def stopping(self) -> None:
        """Clean up on the actor's thread after the last message; errors are contained."""

    def _steerable_report(self, message: object, exc: BaseException) -> None:
        try:
            self.on_handler_error(message, exc)
        except BaseException:  # noqa: BLE001 - the error handler failing must not kill the actor
            _log.error(
                "actor_error_handler_failed",
                actor=str(self),
                original_error=repr(exc),
                exc_info=True,
            )
