"""What a record may hold: the one statement of it, used where values enter and by the stores.

docs/reliability.md ("Hostile values") lists the values refused and where; the codec
(protocol/_codec.py) re-exports `check_storable` and the bounds below.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, Final, NoReturn

import msgpack
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._redaction import SECRET_TYPES as _SECRET_TYPES
from ._redaction import _redact

__all__ = ["MAX_MESSAGE_BYTES", "MAX_VALUE_BYTES", "MAX_VALUE_DEPTH", "check_storable"]

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""The largest record, in bytes, that is encoded or decoded (a bound on memory, not a target)."""
MAX_VALUE_BYTES: Final = MAX_MESSAGE_BYTES // 4
"""The largest single value (a task, a message, one call's arguments, all the arguments of one
plan), as msgpack bytes: a record carries a few values and must stay under `MAX_MESSAGE_BYTES`."""
MAX_VALUE_DEPTH: Final = 200
"""The deepest nesting of containers in one value. pydantic serializes at most 255 levels from a
record's root, and the records around a value (snapshot, plan, call, arguments) take far fewer
than the 55 left."""


# -- what a record may hold ----------------------------------------------------------------------


def check_storable(
    value: Any, *, what: str = "value", bytes_ok: bool = False, max_bytes: int = MAX_VALUE_BYTES
) -> int:
    """Check that the codec can store `value` inside a record; return (a bound on) its size.

    The one statement of what a record may hold: the entry points (a task, a user message, a
    decision, a call's arguments, a tool's result) and the stores call it, so that a value is
    refused where it enters, for that call or run alone (docs/reliability.md, "Hostile values").

    Storable: JSON-like data (None, bool, int in `-2**63 .. 2**64-1`, float, str of valid
    Unicode, lists, tuples, dicts with str keys), nested at most `MAX_VALUE_DEPTH` deep, and what
    pydantic converts to it (models, dataclasses, datetimes, enums, UUIDs; secrets become
    references). Bytes are storable where `bytes_ok` (validated arguments, kept as msgpack
    binary); elsewhere (a record's JSON shape) only if they are UTF-8 text. Iterators are never
    storable: converting one would consume it, without end if it is infinite. The walk that
    checks this stops at the first problem and at `max_bytes` items or characters, so its time
    is bounded by `max_bytes` whatever the value.

    Args:
        value: The value.
        what: How the error names the value (e.g. "the task").
        bytes_ok: Whether arbitrary bytes are storable here.
        max_bytes: The largest size accepted, in msgpack bytes.

    Returns:
        The value's size in msgpack bytes, or for plain JSON-like data a lower bound of it (its
        items and characters), which is what `max_bytes` is checked against.

    Raises:
        TypeError: A type the codec has no form for (a lock, a socket, a generator...).
        ValueError: An int outside 64 bits, text with a lone surrogate, bytes that are not
            UTF-8 where only text is stored, nesting deeper than `MAX_VALUE_DEPTH`, or more
            than `max_bytes`.
    """
    cls = type(value)
    if cls is str:  # the common cases first: a task, a message, a short result
        if len(value) > max_bytes:
            _too_large(what, max_bytes)
        if not value.isascii():
            _text(value, what)
        return len(value)
    if (cls is dict or cls is list) and not value:
        return 0
    plain, size = _survey(value, what, max_bytes)
    if plain:
        return size
    try:
        converted = to_jsonable_python(
            _redact(value), inf_nan_mode="constants", bytes_mode="base64" if bytes_ok else "utf8"
        )
    except RecursionError:
        _too_deep(what)
    except PydanticSerializationError as exc:
        text = str(exc)
        if "depth" in text:
            _too_deep(what)
        if "Unable to serialize unknown type" in text:
            raise TypeError(
                f"{what} holds a value of a type that cannot be stored "
                f"({text.rsplit(': ', 1)[-1]}): use JSON-like data or a pydantic model"
            ) from None
        raise ValueError(f"{what} cannot be stored: {text}") from None
    except Exception as exc:  # noqa: BLE001 - a value's own conversion may fail in any way
        raise ValueError(f"{what} cannot be stored: {type(exc).__name__}: {exc}") from None
    _survey(converted, what, max_bytes)  # what pydantic made of models: depth, ints, text
    try:
        size = len(msgpack.packb(converted, use_bin_type=True))
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{what} cannot be stored: {exc}") from None
    if size > max_bytes:
        raise ValueError(f"{what} is {size} bytes; a value may take at most {max_bytes}")
    return size


_INT_MIN: Final = -(2**63)
_INT_END: Final = 2**64


def _survey(value: Any, what: str, max_bytes: int) -> tuple[bool, int]:
    """Walk `value` before converting it; return (whether it is plain JSON-like data, the items
    and characters seen).

    Plain data is checked completely here (ints, text, keys), so the common case costs one walk
    and no conversion. Anything else is only bounded here (no iterator, no nesting past
    `MAX_VALUE_DEPTH`, no more items or characters than `max_bytes`) so that converting it
    stays bounded in time and memory.
    """
    seen = 0
    plain = True
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        cls = type(item)
        if cls is str:
            seen += len(item)
            if not item.isascii():
                _text(item, what)
        elif cls is int:
            if not _INT_MIN <= item < _INT_END:
                raise ValueError(
                    f"{what} holds an integer outside the range the codec stores "
                    "(-2**63 .. 2**64-1)"
                )
        elif item is None or cls is float or cls is bool:
            pass
        elif cls is dict or cls is list or cls is tuple or isinstance(item, dict | list):
            if item:
                seen = _survey_container(item, depth, stack, seen, what, max_bytes)
                if isinstance(item, dict) and not all(type(key) is str for key in item):
                    plain = False  # pydantic's conversion makes keys text
        else:
            plain = False
            seen = _survey_other(item, depth, stack, seen, what, max_bytes)
        if seen > max_bytes:
            _too_large(what, max_bytes)
    return plain, seen


def _survey_container(
    item: Any, depth: int, stack: list[tuple[Any, int]], seen: int, what: str, max_bytes: int
) -> int:
    if depth >= MAX_VALUE_DEPTH:
        _too_deep(what)
    seen += len(item)
    if seen > max_bytes:  # before the items are pushed: the walk's memory stays bounded too
        _too_large(what, max_bytes)
    if isinstance(item, dict):
        stack.extend((key, depth) for key in item if type(key) is str)
        stack.extend((child, depth + 1) for child in item.values())
    else:
        stack.extend((child, depth + 1) for child in item)
    return seen


def _survey_other(
    item: Any, depth: int, stack: list[tuple[Any, int]], seen: int, what: str, max_bytes: int
) -> int:
    if isinstance(item, str | bytes | bytearray):
        return seen + len(item)
    if isinstance(item, set | frozenset | tuple):
        if depth >= MAX_VALUE_DEPTH and item:
            _too_deep(what)
        if seen + len(item) > max_bytes:
            _too_large(what, max_bytes)
        stack.extend((child, depth + 1) for child in item)
        return seen + len(item)
    if isinstance(item, Iterator):
        raise TypeError(
            f"{what} holds an iterator ({type(item).__name__}), which is never consumed "
            "(it may not end): return a list"
        )
    if isinstance(item, BaseModel):
        if depth >= MAX_VALUE_DEPTH:
            _too_deep(what)
        stack.extend((child, depth + 1) for child in item.__dict__.values())
    elif isinstance(item, Sized) and not isinstance(item, _SECRET_TYPES):
        try:
            return seen + len(item)
        except OverflowError:  # len() past sys.maxsize: e.g. range(10**20)
            _too_large(what, max_bytes)
    return seen


def _too_large(what: str, max_bytes: int) -> NoReturn:
    raise ValueError(f"{what} is larger than the {max_bytes} bytes a value may take")


def _text(item: str, what: str) -> None:
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} holds text that is not valid Unicode ({exc.reason})") from None


def _too_deep(what: str) -> NoReturn:
    raise ValueError(f"{what} is nested more than {MAX_VALUE_DEPTH} levels deep") from None
