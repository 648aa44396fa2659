"""Provider failures as one typed error, `provider_error`, retryable where trying again helps."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from steerable.protocol import AgentError, ErrorCode, SteerableError

__all__ = ["ProviderError", "classify_status", "parse_retry_after", "provider_error"]

_RETRYABLE_REASONS = frozenset(
    {"rate_limit", "server", "overloaded", "connection", "timeout", "malformed_response"}
)
_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "prompt is too long",
    "too many tokens",
    "input is too long",
)
_MAX_MESSAGE = 500


class ProviderError(SteerableError):
    """Raised by a model adapter's `decide`: the provider failed the call (`provider_error`).

    The runtime retries it under the run's `RetryPolicy` when `error.retryable`, waiting at
    least `error.details["retry_after"]` seconds; otherwise the run ends in ERROR with it.
    A hand-written agent may raise it too (build one with `provider_error(...)`).
    """


def provider_error(
    message: str,
    *,
    reason: str,
    status: int | None = None,
    provider_code: str | None = None,
    request_id: str | None = None,
    retry_after: float | None = None,
    provider: str = "",
) -> ProviderError:
    """Build a `ProviderError`; retryable for rate limits, 5xx, overload, resets, timeouts.

    Args:
        message: What the provider said (cut to 500 characters).
        reason: One of `rate_limit`, `server`, `overloaded`, `connection`, `timeout`,
            `context_overflow`, `invalid_request`, `auth`, `malformed_response`.
        status: The HTTP status, if there was a response.
        provider_code: The provider's own error code or type.
        request_id: The provider's request id, for its support.
        retry_after: Seconds the provider asked to wait.
        provider: "openai", "anthropic", ... for the message.
    """
    text = message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE] + "..."
    where = f"{provider} " if provider else ""
    shown = f"{where}provider error ({reason}" + (f", HTTP {status}" if status else "") + ")"
    return ProviderError(
        AgentError.of(
            ErrorCode.PROVIDER_ERROR,
            f"{shown}: {text}",
            retryable=reason in _RETRYABLE_REASONS,
            status=status,
            provider_code=provider_code,
            request_id=request_id,
            retry_after=retry_after,
            reason=reason,
        )
    )


def classify_status(status: int, code: str | None, message: str) -> str:
    """The `reason` of an HTTP error response (see `provider_error`)."""
    lowered = f"{code or ''} {message}".lower()
    if status == 429:
        return "rate_limit"
    if status == 529 or "overloaded" in lowered:
        return "overloaded"
    if status in (408, 504):
        return "timeout"
    if status >= 500:
        return "server"
    if any(marker in lowered for marker in _OVERFLOW_MARKERS) or status == 413:
        return "context_overflow"
    if status in (401, 403):
        return "auth"
    return "invalid_request"


def parse_retry_after(headers: Mapping[str, str] | Any) -> float | None:
    """Seconds from `retry-after-ms`, `retry-after` (seconds or an HTTP date), or None."""
    if headers is None:
        return None
    get = getattr(headers, "get", None)
    if get is None:
        return None
    raw_ms = get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
