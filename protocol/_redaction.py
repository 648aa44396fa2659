"""Secrets never stored in clear (R26): every pydantic secret becomes its reference.

Shared by the codec (what a record holds when it is encoded) and by the storable check and the
event previews (what may be shown or kept at all); see docs/checkpoint-format.md.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from pydantic import BaseModel, Secret, SecretBytes, SecretStr

__all__ = ["SECRET_PREFIX", "SECRET_TYPES", "redact"]

SECRET_PREFIX: Final = "secret:sha256:"
"""What a secret's reference starts with; 16 hex digits of the secret's sha256 follow."""
SECRET_TYPES: Final = (SecretStr, SecretBytes, Secret)
"""The pydantic types recognised as secrets."""
_SECRET_PREFIX = SECRET_PREFIX
_SECRET_TYPES = SECRET_TYPES


def _secret_ref(secret: SecretStr | SecretBytes | Secret[Any]) -> str:
    raw = secret.get_secret_value()
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, bytes):
        raw = repr(raw).encode("utf-8", "surrogatepass")
    return _SECRET_PREFIX + hashlib.sha256(raw).hexdigest()[:16]


def redact(value: Any) -> Any:
    """Replace every pydantic secret in `value` by its reference (R26).

    Walks dicts (keys too), lists, tuples, sets and pydantic models. A secret
    (`SecretStr`, `SecretBytes`, `Secret[...]`) becomes `"secret:sha256:<16 hex>"`: the first 16
    hex digits of the sha256 of its value. A model holding a secret becomes its (redacted)
    python-mode dict. Hosts mark credentials with pydantic's `SecretStr`; nothing else is
    recognised as a secret.

    Returns:
        `value` itself when it holds no secret, else a redacted copy (containers keep their type,
        except that models become dicts).
    """
    return _redact(value)


def _redact(value: Any) -> Any:
    if isinstance(value, str | int | float | bytes | None):
        return value
    if isinstance(value, _SECRET_TYPES):
        return _secret_ref(value)
    if isinstance(value, dict):
        changed = False
        out: dict[Any, Any] = {}
        for key, item in value.items():
            new_key, new_item = _redact(key), _redact(item)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, list | tuple | set | frozenset):
        items = [_redact(item) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        if isinstance(value, list):
            return items
        return tuple(items) if isinstance(value, tuple) else type(value)(items)
    if isinstance(value, BaseModel):
        dumped = value.model_dump()
        redacted = _redact(dumped)
        return value if redacted is dumped else redacted
    return value
