"""Immutable containers for recorded values: what an agent may not change once it is recorded.

Records are frozen pydantic models, but a value they carry (a tool's result, a call's arguments,
an output, error details) may be a dict or a list. The records' validators `freeze` such values,
so an agent that mutates `view.last_results[0].value`, or a decision after returning it, gets a
`TypeError` instead of changing the record (docs/reliability.md, "Hostile values").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Final, NoReturn, SupportsIndex

from pydantic import AfterValidator, BaseModel

__all__ = ["FrozenAny", "FrozenDict", "FrozenList", "FrozenMap", "freeze"]


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"a recorded value is immutable ({type(self).__name__}); copy it first "
        "(dict(value), list(value)) to change the copy"
    )


class FrozenDict(dict[str, Any]):
    """A dict that refuses changes: how records hold mappings (equal to, and a `dict`)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


class FrozenList(list[Any]):
    """A list that refuses changes: how records hold sequences (equal to, and a `list`)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __init__(self, items: Iterable[Any] = ()) -> None:
        list.__init__(self, items)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        if isinstance(index, slice):
            return FrozenList(list.__getitem__(self, index))
        return list.__getitem__(self, index)


_LEAVES: Final = (str, int, float, bool, bytes, type(None))


def freeze(value: Any) -> Any:
    """An immutable form of `value`: dicts become `FrozenDict`, lists `FrozenList`, recursively.

    Already-frozen parts are shared, not copied; immutable leaves (str, numbers, None, bytes),
    tuples of them, frozen pydantic models and secrets are kept as they are. Other objects are
    kept as they are too: a record stores them in their JSON form.
    """
    cls = type(value)
    if cls is FrozenDict or cls is FrozenList or isinstance(value, _LEAVES):
        return value
    if isinstance(value, dict):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return FrozenList([freeze(item) for item in value])
    if isinstance(value, tuple) and cls is tuple:
        items = tuple(freeze(item) for item in value)
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, set):
        return frozenset(value)
    if isinstance(value, BaseModel) and not value.model_config.get("frozen", False):
        # A mutable model an agent still holds: record a copy of it, not the agent's object.
        return value.model_copy(deep=True)
    return value


FrozenAny = Annotated[Any, AfterValidator(freeze)]
"""A record field holding any value, frozen on validation."""

FrozenMap = Annotated[dict[str, Any], AfterValidator(freeze)]
"""A record field holding a mapping, frozen on validation (default it with `FrozenDict`)."""
