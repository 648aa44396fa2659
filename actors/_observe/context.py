"""Trace context from the host: a W3C `traceparent` or a bare trace id, checked strictly."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TraceParent", "check_trace_id", "parse_traceparent"]

_HEX32 = re.compile(r"[0-9a-f]{32}")
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed W3C `traceparent`: the trace, the host's span, and the trace flags."""

    trace_id: str
    span_id: str
    flags: int

    def header(self) -> str:
        """The `traceparent` header value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def check_trace_id(trace_id: str) -> str:
    """A trace id as the run keeps it: 32 lower-case hex digits, not all zero.

    Raises:
        ValueError: It is not one (upper-case hex is accepted and lowered).
    """
    value = trace_id.lower() if isinstance(trace_id, str) else trace_id
    if not isinstance(value, str) or not _HEX32.fullmatch(value) or not int(value, 16):
        raise ValueError(f"trace_id must be 32 hex digits, not all zero; got {trace_id!r}")
    return value


def parse_traceparent(header: str) -> TraceParent:
    """Parse a W3C Trace Context `traceparent` header (https://www.w3.org/TR/trace-context/).

    Raises:
        ValueError: The header is malformed, has version ff, an all-zero trace or span id,
            or (version 00) extra fields.
    """
    match = _PARENT.fullmatch(header.strip()) if isinstance(header, str) else None
    if match is None:
        raise ValueError(f"not a W3C traceparent: {header!r}")
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        raise ValueError(f"unsupported traceparent version in {header!r}")
    if not int(trace_id, 16) or not int(span_id, 16):
        raise ValueError(f"traceparent with an all-zero trace or span id: {header!r}")
    return TraceParent(trace_id, span_id, int(flags, 16))
