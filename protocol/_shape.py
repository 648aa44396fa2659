"""A cheap check of a decoded record's keys before pydantic validates it (crafted rows).

pydantic reports every error it finds: a crafted row with two million unknown keys (or two
million empty items in a list of records) builds millions of error objects, gigabytes and
seconds for a few megabytes of row. This walk follows the models' fields, looks only at the
keys of each map, and stops at the first key a record does not have or the first required key
it lacks. What it lets through can fail pydantic only on values, at most one error per value
the row holds; its own cost is one pass over the maps and lists of the record's own fields.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["first_shape_error"]


@dataclass(frozen=True, slots=True)
class _Spec:
    allowed: frozenset[str]
    required: frozenset[str]
    children: tuple[tuple[str, bool, tuple[type[BaseModel], ...]], ...]
    """(field, is a sequence of records, the record types it may hold)."""


_SPECS: dict[type[BaseModel], _Spec] = {}
_UNIONS = (Union, types.UnionType)


def _models(annotation: Any) -> tuple[bool, tuple[type[BaseModel], ...]]:
    """Whether `annotation` is a sequence, and the record types it holds (none: a leaf)."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _models(get_args(annotation)[0])
    if origin in _UNIONS:
        found: list[type[BaseModel]] = []
        sequence = False
        for arg in get_args(annotation):
            if arg is type(None):
                continue
            is_seq, members = _models(arg)
            if not members:
                return False, ()  # a union with a plain member: a leaf
            sequence = sequence or is_seq
            found.extend(members)
        return sequence, tuple(found)
    if origin in (tuple, list):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        if len(args) == 1:
            is_seq, members = _models(args[0])
            return (True, members) if members and not is_seq else (False, ())
        return False, ()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False, (annotation,)
    return False, ()


def _spec(model: type[BaseModel]) -> _Spec:
    spec = _SPECS.get(model)
    if spec is None:
        fields = model.model_fields
        children = []
        for name, info in fields.items():
            sequence, members = _models(info.annotation)
            if members:
                children.append((name, sequence, members))
        spec = _SPECS[model] = _Spec(
            allowed=frozenset(fields),
            required=frozenset(n for n, f in fields.items() if f.is_required()),
            children=tuple(children),
        )
    return spec


@functools.cache
def _literals(model: type[BaseModel]) -> dict[str, tuple[Any, ...]]:
    """The fields of `model` typed as a Literal (a union's discriminator), with their values."""
    return {
        name: get_args(info.annotation)
        for name, info in model.model_fields.items()
        if get_origin(info.annotation) is typing.Literal
    }


def _pick(models: tuple[type[BaseModel], ...], body: dict[Any, Any]) -> tuple[type[BaseModel], ...]:
    """The members of a union whose Literal fields the map's values match (pydantic's pick)."""
    picked = tuple(
        m
        for m in models
        if all(name not in body or body[name] in values for name, values in _literals(m).items())
    )
    return picked or models


def first_shape_error(
    models: tuple[type[BaseModel], ...], body: Any, where: str = ""
) -> str | None:
    """The first problem with the keys of `body` as one of `models`, or None.

    A map must have only keys one of the models has; with one model, all its required keys.
    Nested records (fields typed as records, or tuples/lists of them) are checked the same way.
    """
    if not isinstance(body, dict):
        return None  # not a map: pydantic reports it, once
    if len(models) > 1:
        models = _pick(models, body)
    if len(models) == 1:
        spec = _spec(models[0])
        allowed = spec.allowed
        missing = spec.required - body.keys()
        if missing:
            return f"{where or '<root>'}: missing {sorted(missing)[0]!r}"
    else:  # a union: the keys of any member (pydantic picks the member)
        allowed = frozenset().union(*(_spec(m).allowed for m in models))
    if not body.keys() <= allowed:
        extra = next(k for k in body if k not in allowed)
        return f"{where or '<root>'}: unknown key {str(extra)[:40]!r} (of {len(body)} keys)"
    if len(models) != 1:
        return None
    for name, sequence, members in _spec(models[0]).children:
        value = body.get(name)
        if value is None:
            continue
        path = f"{where}.{name}" if where else name
        if sequence:
            if not isinstance(value, list):
                continue
            for index, item in enumerate(value):
                problem = first_shape_error(members, item, f"{path}[{index}]")
                if problem is not None:
                    return problem
        else:
            problem = first_shape_error(members, value, path)
            if problem is not None:
                return problem
    return None
