"""What the machine records of a plan step's arguments: storable, and without a secret in clear.

A decision is recorded (transcript, checkpoint) as the agent made it, except for two things.
Arguments the codec cannot store are recorded as `{}` (the call gets `invalid_arguments` saying
why), so that one bad value never reaches a store's writer. And a secret is recorded only as
its reference (R26), on every path: a parameter the tool declares secret (a `SecretStr`
anywhere in its type, even inside a model or a list) is recorded from its validated value,
redacted; when validation failed, its raw value is replaced by one reference as a whole.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import SecretStr

from steerable.protocol import ToolSpec
from steerable.protocol._frozen import freeze
from steerable.protocol.codec import check_storable, redact

__all__ = ["checked_arguments", "recorded_arguments", "secret_parameters"]

_SECRET_PARAMS: dict[int, tuple[ToolSpec, frozenset[str]]] = {}


def checked_arguments(name: str, arguments: dict[str, Any], *, validated: bool) -> str | None:
    """Why the codec cannot store a call's arguments, or None if it can."""
    if not arguments:
        return None
    what = f"the {'validated ' if validated else ''}arguments of {name!r}"
    try:
        check_storable(arguments, what=what, bytes_ok=validated)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def secret_parameters(spec: ToolSpec | None) -> frozenset[str]:
    """The parameters whose JSON schema holds a secret (`writeOnly`, as pydantic marks
    `SecretStr` and `SecretBytes`), anywhere inside them; cached per spec."""
    if spec is None:
        return frozenset()
    cached = _SECRET_PARAMS.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    schema = spec.json_schema
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    names = frozenset(k for k, sub in props.items() if _holds_secret(sub, defs, set()))
    if len(_SECRET_PARAMS) >= 1024:
        _SECRET_PARAMS.clear()  # a bound: tool sets are few in practice
    _SECRET_PARAMS[id(spec)] = (spec, names)
    return names


def _holds_secret(node: Any, defs: dict[str, Any], seen: set[str]) -> bool:
    if isinstance(node, dict):
        if node.get("writeOnly") is True:
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            key = ref[len("#/$defs/") :]
            if key not in seen:
                seen.add(key)
                if _holds_secret(defs.get(key), defs, seen):
                    return True
        return any(_holds_secret(v, defs, seen) for k, v in node.items() if k != "$defs")
    if isinstance(node, list):
        return any(_holds_secret(v, defs, seen) for v in node)
    return False


def recorded_arguments(
    spec: ToolSpec | None, raw: dict[str, Any], validated: dict[str, Any] | None
) -> dict[str, Any]:
    """The arguments to record for one call: `raw` with every secret parameter redacted.

    Args:
        spec: The tool's spec (None for an unknown tool: only secret objects are redacted).
        raw: The arguments as the agent gave them (already known to be storable).
        validated: The validated arguments, or None when validation failed.
    """
    if not raw:
        return raw
    secret = secret_parameters(spec)
    out: dict[str, Any] | None = None
    for key, value in raw.items():
        new = value
        if key in secret:
            if validated is not None and key in validated:
                checked = validated[key]
                redacted = redact(checked)
                new = value if redacted is checked else redacted
            else:
                new = _reference(value)
        new = redact(new)  # a secret object passed where none is declared
        if new is not value:
            if out is None:
                out = dict(raw)
            out[key] = new
    return raw if out is None else freeze(out)


def _reference(value: Any) -> Any:
    """One reference for a secret parameter's raw value, whatever its shape."""
    if value is None:
        return None
    plain = redact(value)
    text = plain if isinstance(plain, str) else json.dumps(plain, sort_keys=True, default=repr)
    return redact(SecretStr(text))
