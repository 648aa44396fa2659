"""The base model every protocol record derives from."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Record", "built_record", "slot_twin"]


class Record(BaseModel):
    """A frozen, strict-shaped pydantic model: the unit of data that crosses a boundary.

    Frozen because pykka passes messages by reference (docs/pykka.md T13); `extra="forbid"` so a
    misspelt field is an error, not silently dropped data.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=False, ser_json_inf_nan="constants"
    )


# Records are frozen (their own __setattr__ refuses): a record built from values already
# validated has its state set through BaseModel's slot descriptors, which every record shares;
# a direct descriptor call skips the attribute lookup `object.__setattr__` makes through the
# record's MRO each time (protocol/_built.py says when that is right).
_SLOTS = vars(BaseModel)
_set_dict = _SLOTS["__dict__"].__set__
_set_fields = _SLOTS["__pydantic_fields_set__"].__set__
_set_extra = _SLOTS["__pydantic_extra__"].__set__
_set_private = _SLOTS["__pydantic_private__"].__set__
_new = object.__new__


_R = TypeVar("_R", bound=BaseModel)


def built_record(cls: type[_R], state: dict[str, Any], fields_set: set[str]) -> _R:
    """An instance of `cls` with exactly the state a validated construction leaves: `state`
    as its `__dict__` (every field, in field order), `fields_set` as the fields given, no extra
    or private values. Only for values that have already crossed their validation boundary."""
    record = _new(cls)
    _set_dict(record, state)
    _set_fields(record, fields_set)
    _set_extra(record, None)
    _set_private(record, None)
    return record


def slot_twin(cls: type) -> type:
    """A plain class with `cls`'s slots (in order) and nothing else, for building a `cls` fast.

    For a frozen slotted class built where its values are already valid: fill a twin with plain
    attribute stores, then make it a `cls` with one `__class__` assignment, which CPython allows
    only between classes of the same layout (it checks, and raises TypeError otherwise). A
    frozen dataclass's own `__init__` sets each field with `object.__setattr__`, and a slot
    descriptor's bound `__set__` is a tuple-building call too: the twin's stores are several
    times cheaper (docs/performance.md, "Wave 4: session 19").
    """
    slots = vars(cls)["__slots__"]
    return type(f"_{cls.__name__}Twin", (object,), {"__slots__": slots})
