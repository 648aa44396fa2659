"""steerable's loggers: quiet unless the host asks, structured when it does.

A library must not configure structlog (the host's global), and structlog's default
configuration prints every level to stdout. So every steerable logger is a thin `Logger` over a
standard `logging` logger in the `steerable` namespace:

- when the host has not configured structlog, a record goes to `logging` (only if that level is
  enabled: nothing below WARNING appears by default) with the bound fields as attributes of the
  `LogRecord` (`record.run_id`, `record.trace_id`, ...) and all of them in `record.steerable`;
- when the host has configured structlog (`structlog.configure(...)`), the event goes through
  the host's structlog pipeline instead, bound with the same fields.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["Logger", "get_logger"]

# LogRecord attributes a bound field must not overwrite (logging raises on a clash).
_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class Logger:
    """A logger bound with key-value fields; immutable, `bind` returns a new one."""

    __slots__ = ("_fields", "_name", "_stdlib")

    def __init__(self, name: str, fields: dict[str, Any] | None = None) -> None:
        self._name = name
        self._stdlib = logging.getLogger(name)
        self._fields = fields or {}

    def bind(self, **fields: Any) -> Logger:
        """The same logger with more fields."""
        return Logger(self._name, {**self._fields, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        """Log at DEBUG."""
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log at INFO."""
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log at WARNING."""
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log at ERROR."""
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log at ERROR with the exception being handled."""
        fields.setdefault("exc_info", True)
        self._log(logging.ERROR, event, fields)

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            bound = structlog.get_logger(self._name).bind(**self._fields)
            bound.log(level, event, **fields)
            return
        if not self._stdlib.isEnabledFor(level):
            return
        exc_info = fields.pop("exc_info", None)
        merged = {**self._fields, **fields}
        extra: dict[str, Any] = {k: v for k, v in merged.items() if k not in _RESERVED}
        extra["steerable"] = merged
        extra["event"] = event
        shown = " ".join(f"{key}={value!r}" for key, value in merged.items())
        self._stdlib.log(
            level, "%s %s" if shown else "%s%s", event, shown, exc_info=exc_info, extra=extra
        )


def get_logger(name: str) -> Logger:
    """The logger `name` (always under the `steerable` namespace)."""
    if name != "steerable" and not name.startswith("steerable."):
        name = f"steerable.{name}"
    return Logger(name)
